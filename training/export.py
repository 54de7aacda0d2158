"""Export a model folder for serving: through transformers' own exporters (ONNX, ExecuTorch, OpenVINO,
torch.export) or to CTranslate2, from one command.

    python -m training.export runs/tiny --format onnx --output_dir runs/tiny-onnx
    python -m training.export runs/tiny --format onnx --quantization int8 --output_dir runs/tiny-onnx-int8
    python -m training.export runs/tiny --format ctranslate2 --quantization int8 --output_dir runs/tiny-ct2
    python -m training.export runs/tiny --format dynamo|executorch|openvino --output_dir DIR

transformers' exporters (`transformers.exporters`) write three programs: `encoder` (source → encoder states),
`prefill` (the first decoder step: fills the cross-attention cache) and `decode` (one step on an
`EncoderDecoderCache`), each with the pre-softmax linear inside, dynamic in batch, source and cache length;
`export.json` names them. Next to them: config.json with the code files (so the folder loads as remote code),
generation_config.json (the paper's decoding) and the tokenizer. `ExportedForGeneration` runs `generate()` on
those programs, greedy and beam search. CTranslate2 gets its own model directory
(model.bin, shared_vocabulary.json, its config.json), the tokenizer and generation_config.json;
`ctranslate2_options` maps the generation config to `translate_batch` arguments as far as CTranslate2 can.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import math
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import GenerationConfig, HfArgumentParser
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from modeling_vaswani import VaswaniForConditionalGeneration
from modeling_vaswani.modeling_vaswani import VaswaniSeq2SeqLMOutput, sinusoids
from training.common.arguments import command_parser, parse_command
from training.common.errors import run_command
from training.common.files import output_problem

# format → (the modules it needs, the transformers exporter and config classes)
EXPORTERS = {
    "onnx": (("onnx", "onnxscript", "onnxruntime"), "OnnxExporter", "OnnxConfig"),
    "executorch": (("executorch",), "ExecutorchExporter", "ExecutorchConfig"),
    "openvino": (("openvino",), "OpenVINOExporter", "OpenVINOConfig"),
    "dynamo": ((), "DynamoExporter", "DynamoConfig"),
}
FORMATS = (*EXPORTERS, "ctranslate2")
CT2_QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
QUANTIZATIONS = {"onnx": ("int8",), "ctranslate2": CT2_QUANTIZATIONS}  # onnx int8: onnxruntime dynamic quantization
COMPONENTS = ("encoder", "prefill", "decode")
CT2_MAX_POSITIONS = 1024  # rows of the sinusoid table CTranslate2 gets (it has no interleaved sinusoids of its own)


class ExportError(ValueError):
    """A bad setting or a missing package, reported before any work."""


def check_format(fmt: str, quantization: str | None) -> None:
    """The format exists, its packages import, and it takes `quantization`; else an ExportError naming the pip extra."""
    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if quantization is not None and quantization not in QUANTIZATIONS.get(fmt, ()):
        allowed = QUANTIZATIONS.get(fmt)
        raise ExportError(
            f"--format {fmt} takes --quantization {' | '.join(allowed)}, not {quantization!r}"
            if allowed
            else f"--format {fmt} takes no --quantization (got {quantization!r})"
        )
    needed = EXPORTERS[fmt][0] if fmt in EXPORTERS else ("ctranslate2",)
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(
            f"--format {fmt} needs {', '.join(missing)}, not installed: pip install -e '.[export]' "
            f"(or pip install {' '.join(missing)})"
        )


# ---- transformers' exporters ----


def sample_inputs(model: VaswaniForConditionalGeneration) -> dict[str, torch.Tensor]:
    """`generate()` inputs the programs are traced on: 2 sources of different lengths (one padded) and a 2-token
    decoder prompt, so that batch, source, target and cache lengths all trace as dynamic (a size-1 axis would not)."""
    config = model.config
    g = torch.Generator().manual_seed(0)
    low = max(config.pad_token_id, config.eos_token_id, config.bos_token_id) + 1
    ids = torch.randint(low, config.vocab_size, (2, 7), generator=g)
    ids[:, -1] = config.eos_token_id
    mask = torch.ones_like(ids)
    ids[1, 5:], mask[1, 5:] = config.pad_token_id, 0
    ids[1, 4] = config.eos_token_id
    prompt = torch.full((2, 2), config.decoder_start_token_id)
    prompt[:, 1] = low
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": prompt}


def export_programs(model: VaswaniForConditionalGeneration, fmt: str, quantization: str | None = None, log=print):
    """The `ExportedModel` of `model` in `fmt`: components `encoder`, `prefill`, `decode` (see the module docstring).

    Traced on the plain path: `set_cpu_kernel("aten")` for the duration (the oneDNN/int8 kernels are eager-only and
    also skip themselves under tracing), fp32, eval mode.
    """
    import transformers.exporters as exporters
    from transformers.exporters.utils import decompose_for_generation

    exporter = getattr(exporters, EXPORTERS[fmt][1])()
    options = {"dynamic": True}
    if fmt == "openvino":
        options["stateful"] = False  # the cache stays an input/output: generate() reorders it for beam search
    if quantization == "int8":
        options["quantizer"] = exporters.OnnxRuntimeQuantizer(exporters.OnnxRuntimeDynamicConfig())
    export_config = getattr(exporters, EXPORTERS[fmt][2])(**options)
    kernels = {m: m.cpu_kernel for m in model.modules() if hasattr(m, "cpu_kernel")}
    model = model.eval().float()
    model.set_cpu_kernel("aten")
    try:
        inputs = sample_inputs(model)
        # the decoder calls of a beam-2 search: 4 decoder rows on 2 encoder rows (the beams of a source share its
        # row), so the decoder batch and the encoder batch trace as two sizes; the programs then serve any number of
        # rows per source, greedy (1) and beams (g); traced on equal batches, torch.export would fix them equal
        beams = GenerationConfig(**{**model.generation_config.to_diff_dict(), "num_beams": 2, "do_sample": False})
        stages = decompose_for_generation(model, inputs, generation_config=beams, multi_token_decode=True)
        step = DecoderStep(model)
        plans = {"encoder": (EncoderStep(model), {k: inputs[k] for k in EncoderStep.INPUTS})}
        for name, (_, kwargs) in stages.items():  # the decoder calls generate() made, as DecoderStep takes them
            kwargs = {**kwargs, "encoder_hidden_states": kwargs["encoder_outputs"][0]}
            # contiguous, as the runner passes them (a strided slice would trace a guard on its strides)
            kwargs = {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            plans[name] = (step, {k: kwargs[k] for k in DecoderStep.INPUTS})
        components = {}
        for name in COMPONENTS:
            module, kwargs = plans[name]
            log(f"exporting {name} ({fmt})")
            with torch.no_grad():
                components[name] = exporter.export(module, kwargs, export_config).components["model"]
    finally:
        for module, kernel in kernels.items():
            module.cpu_kernel = kernel
    return exporters.ExportedModel(
        components, exporter.export_format, config=model.config, generation_config=model.generation_config
    )


class EncoderStep(torch.nn.Module):
    """The encoder as the exporters trace it: tensors in, the encoder states out (B, T_src, d_model). Tensors and
    transformers' cache only, in and out, so a saved program reloads without this package and without unpickling
    a model-output class."""

    INPUTS = ("input_ids", "attention_mask")

    def __init__(self, model: VaswaniForConditionalGeneration):
        super().__init__()
        self.encoder = model.get_encoder()
        self.config = model.config

    def forward(self, input_ids, attention_mask):
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class DecoderStep(torch.nn.Module):
    """One decoder call of the model, output projection included, as the exporters trace it: the inputs
    `generate()` gives it (the encoder output as a tensor), `(logits, cache)` out; see `EncoderStep`."""

    INPUTS = ("decoder_input_ids", "attention_mask", "encoder_hidden_states", "cache")

    def __init__(self, model: VaswaniForConditionalGeneration):
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, decoder_input_ids, attention_mask, encoder_hidden_states, cache):
        out = self.model(
            decoder_input_ids=decoder_input_ids,
            attention_mask=attention_mask,
            encoder_outputs=(encoder_hidden_states,),
            cache=cache,
            use_cache=True,
        )
        return out.logits, out.cache  # (B, T, vocab), the cache grown by T


class _ExportedEncoder(torch.nn.Module):
    """The `encoder` program as `generate()` calls `get_encoder()`: returns a `BaseModelOutput`."""

    def __init__(self, runner):
        super().__init__()
        self.runner = runner

    def forward(self, input_ids=None, attention_mask=None, **kwargs) -> BaseModelOutput:
        return BaseModelOutput(last_hidden_state=self.runner(input_ids=input_ids, attention_mask=attention_mask))


class ExportedForGeneration(VaswaniForConditionalGeneration):
    """`generate()` of this model (its decoding loop and length rules unchanged: greedy, beam search, sampling) with
    every network call made by an exported program through transformers' runners.

    Holds no weights (built on the meta device): `forward` runs `prefill` on an empty cache, else `decode`, and
    `get_encoder()` the `encoder` program. Build it with `ExportedForGeneration.from_export(folder_or_exported)`.
    """

    @classmethod
    def from_export(cls, exported, **runner_kwargs) -> ExportedForGeneration:
        """From an `ExportedModel`, or the folder `training.export` wrote (loaded with `ExportedModel.from_pretrained`)."""
        from transformers.exporters import ExportedModel

        if not isinstance(exported, ExportedModel):
            exported = ExportedModel.from_pretrained(exported, trust_remote_code=True, **runner_kwargs)
        missing = [name for name in COMPONENTS if name not in exported.components]
        if missing:
            raise ExportError(f"the export lacks components {missing}: it was not written by training.export")
        with torch.device("meta"):
            self = cls(exported.config)
        if exported.generation_config is not None:
            self.generation_config = exported.generation_config
        self.__dict__["exported"] = exported  # not a submodule
        self.exported_encoder = _ExportedEncoder(exported.runners["encoder"])
        return self

    @property
    def device(self) -> torch.device:
        return self.exported.device

    def get_encoder(self, *args, **kwargs) -> torch.nn.Module:
        return self.exported_encoder

    def forward(self, decoder_input_ids=None, attention_mask=None, encoder_outputs=None, cache=None, **kwargs):
        if cache is None:  # the programs always take a cache: an empty one runs the whole prompt
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        step = "decode" if cache.get_seq_length() > 0 else "prefill"
        runner = self.exported.runners[step]
        logits, grown = runner(
            decoder_input_ids=decoder_input_ids.contiguous(),
            attention_mask=attention_mask,
            encoder_hidden_states=encoder_outputs[0],
            cache=cache,
        )
        # A program returns a new cache; decoding loops keep theirs (as with eager, where it grows in place)
        cache.__dict__.update(grown.__dict__)
        return VaswaniSeq2SeqLMOutput(logits=logits, cache=cache)


# ---- CTranslate2 ----


def ctranslate2_spec(model: VaswaniForConditionalGeneration, vocabulary, max_positions: int = CT2_MAX_POSITIONS):
    """The CTranslate2 `TransformerSpec` of `model`: our post-norm layers read directly, our interleaved sinusoids
    as its position table, √d_model embedding scale, tied output projection; `vocabulary` gives the tokens
    (a tokenizer: `get_vocab`, `convert_ids_to_tokens`, bos/eos/unk tokens).

    CTranslate2's converters cover Hub architectures only (Marian, BART, ...), whose module names differ from ours;
    this loader is its `BartLoader` (the same post-norm layout) with our names. Marian's own loader does not fit:
    it starts decoding from a zero embedding and puts <pad> last.
    """
    from ctranslate2.converters.transformers import BartLoader
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    activations = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
    if config.activation_function not in activations:
        raise ExportError(f"CTranslate2 conversion supports relu/gelu, not {config.activation_function!r}")
    model = copy.deepcopy(model).float().cpu()  # CTranslate2 reads fp32 CPU tensors; the caller's model is untouched
    table = sinusoids(torch.arange(max_positions), config.d_model)  # (max_positions, d_model), §3.5

    class VaswaniLoader(BartLoader):
        architecture_name = type(model).__name__

        def get_model_spec(self, model):
            spec = transformer_spec.TransformerSpec.from_config(
                (config.encoder_layers, config.decoder_layers),
                config.h,
                pre_norm=False,  # post-norm (§3.1)
                activation=activations[config.activation_function],
                layernorm_embedding=False,
            )
            for stack_spec, stack in ((spec.encoder, model.model.encoder), (spec.decoder, model.model.decoder)):
                stack_spec.scale_embeddings = math.sqrt(config.d_model)
                stack_spec.position_encodings.encodings = table
                embeddings = stack_spec.embeddings
                self.set_embeddings(embeddings[0] if isinstance(embeddings, list) else embeddings, stack.embed_tokens)
                for layer_spec, layer in zip(stack_spec.layer, stack.layers, strict=True):
                    self.set_attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
                    self.set_layer_norm(layer_spec.self_attention.layer_norm, layer.norm1)
                    last_norm = layer.norm2
                    if hasattr(layer, "cross_attn"):
                        self.set_attention(layer_spec.attention, layer.cross_attn, self_attention=False)
                        self.set_layer_norm(layer_spec.attention.layer_norm, layer.norm2)
                        last_norm = layer.norm3
                    self.set_linear(layer_spec.ffn.linear_0, layer.ffn.w_1)
                    self.set_linear(layer_spec.ffn.linear_1, layer.ffn.w_2)
                    self.set_layer_norm(layer_spec.ffn.layer_norm, last_norm)
            self.set_linear(spec.decoder.projection, model.lm_head)
            return spec

        def set_attention(self, spec, attention, self_attention=False):
            names = {"q_proj": attention.w_q, "k_proj": attention.w_k, "v_proj": attention.w_v}
            super().set_attention(spec, _Renamed(names, out_proj=attention.w_o), self_attention)

        def get_vocabulary(self, model, tokenizer):
            tokens = [token for token, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]
            if len(tokens) != config.vocab_size or any(t is None for t in tokens):
                raise ExportError(f"the tokenizer has {len(tokens)} tokens, the model {config.vocab_size}")
            return tokens

    with torch.no_grad():
        return VaswaniLoader()(model, vocabulary)


class _Renamed:
    """Attributes under the names CTranslate2's BART loader reads (q_proj, k_proj, v_proj, out_proj)."""

    def __init__(self, names: dict, **more):
        self.__dict__.update(names, **more)


def convert_ctranslate2(
    model: VaswaniForConditionalGeneration,
    vocabulary,
    output_dir: str | Path,
    quantization: str | None = None,
    max_positions: int = CT2_MAX_POSITIONS,
) -> Path:
    """Write the CTranslate2 model directory of `model` (model.bin, config.json, shared_vocabulary.json) to
    `output_dir`, weights quantized as `quantization` (None: as stored, fp32)."""
    import ctranslate2

    spec = ctranslate2_spec(model, vocabulary, max_positions)

    class _Converter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    _Converter().convert(str(output_dir), quantization=quantization, force=True)
    return Path(output_dir)


def ctranslate2_translator(model, vocabulary, quantization: str = "float32", threads: int = 0, device: str = "cpu"):
    """A `ctranslate2.Translator` of `model` (converted in a temporary directory), computing in `quantization`."""
    import ctranslate2

    with tempfile.TemporaryDirectory() as tmp:
        convert_ctranslate2(model, vocabulary, tmp, None if quantization == "float32" else quantization)
        return ctranslate2.Translator(tmp, device=device, compute_type=quantization, inter_threads=1,
                                      intra_threads=threads)  # fmt: skip


def ctranslate2_options(generation_config: GenerationConfig, source_lengths: list[int]) -> dict:
    """`translate_batch` arguments for a batch whose sources have `source_lengths` tokens, decoding as close to the
    generation config (the paper's: beam 4, α = 0.6, |source| + 50) as CTranslate2 can.

    Two differences remain: CTranslate2's length penalty divides by |Y|^α (transformers' rule, not the GNMT
    ((5 + |Y|) / 6)^α), and its length limit is per batch (the longest source + 50), not per sentence.
    """
    over = getattr(generation_config, "max_length_over_source", None)
    if generation_config.max_new_tokens is not None:
        limit = generation_config.max_new_tokens
    elif over is not None:
        limit = max(source_lengths) + over
    else:
        limit = generation_config.max_length - 1
    return {
        "beam_size": generation_config.num_beams or 1,
        "length_penalty": generation_config.length_penalty if (generation_config.num_beams or 1) > 1 else 1.0,
        "max_decoding_length": limit,
        "return_end_token": False,
    }


# ---- the command ----


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _human(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"


def save_export(exported, model: VaswaniForConditionalGeneration, tokenizer, output_dir: Path) -> None:
    """`ExportedModel.save_pretrained`, then the code files beside config.json (so `AutoConfig` loads it without
    this package: remote code) and the tokenizer."""
    exported.save_pretrained(output_dir)
    model.config.register_for_auto_class()
    model.register_for_auto_class("AutoModelForSeq2SeqLM")
    with tempfile.TemporaryDirectory() as tmp:  # save_pretrained writes config.json with auto_map + the code files
        model.config.auto_map = {
            "AutoConfig": "configuration_vaswani.VaswaniConfig",
            "AutoModel": "modeling_vaswani.VaswaniModel",
            "AutoModelForSeq2SeqLM": "modeling_vaswani.VaswaniForConditionalGeneration",
        }
        model.config.save_pretrained(tmp)
        from transformers.dynamic_module_utils import custom_object_save

        custom_object_save(model, tmp, config=model.config)
        for path in Path(tmp).iterdir():  # config.json and every code file the model's module imports
            shutil.copyfile(path, output_dir / path.name)
    tokenizer.save_pretrained(output_dir)


def export_folder(
    folder: str | Path,
    fmt: str,
    output_dir: str | Path,
    quantization: str | None = None,
    overwrite: bool = False,
    log=print,
) -> list[Path]:
    """Export the model folder `folder` to `output_dir` in `fmt`; returns the files written."""
    from training.inference.translation import EvaluationError, load_model

    check_format(fmt, quantization)
    output_dir = Path(output_dir)
    if problem := output_problem(output_dir, "--output_dir", overwrite):
        raise ExportError(problem)
    try:
        model, tokenizer = load_model(str(folder), "cpu")
    except EvaluationError as e:
        raise ExportError(str(e)) from e
    output_dir.mkdir(parents=True, exist_ok=True)
    if fmt == "ctranslate2":
        log(f"converting encoder, decoder and output projection (ctranslate2, {quantization or 'float32'})")
        convert_ctranslate2(model, tokenizer, output_dir, quantization)
        tokenizer.save_pretrained(output_dir)
        model.generation_config.save_pretrained(output_dir)
    else:
        exported = export_programs(model, fmt, quantization, log=log)
        log(f"saving to {output_dir}")
        save_export(exported, model, tokenizer, output_dir)
    return sorted(p for p in output_dir.rglob("*") if p.is_file())


@dataclass
class ExportArguments:
    format: str = field(metadata={"choices": FORMATS, "help": "the serving format"})
    output_dir: Path = field(metadata={"help": "the folder to write"})
    quantization: str | None = field(
        default=None,
        metadata={
            "help": f"ctranslate2: {' | '.join(CT2_QUANTIZATIONS)}; onnx: int8 (onnxruntime dynamic quantization)"
        },
    )
    overwrite: bool = field(default=False, metadata={"help": "write into a non-empty --output_dir"})


def build_parser() -> HfArgumentParser:
    parser = command_parser("python -m training.export", __doc__, [ExportArguments])
    # MODEL is positional, as documented (`export MODEL --format onnx`): a dataclass field can only be a --flag
    parser.add_argument("model", help="a model folder (training.train's output) or a Hub id")
    return parser


def main(argv: list[str] | None = None) -> list[Path]:
    args, positional = parse_command(build_parser(), argv)
    log = lambda message: print(message, file=sys.stderr)  # noqa: E731
    try:
        with contextlib.redirect_stdout(sys.stderr):  # exporters print progress; stdout carries the summary
            files = export_folder(
                positional.model, args.format, args.output_dir, args.quantization, args.overwrite, log
            )
    except ExportError as e:
        raise SystemExit(f"error: {e}") from None
    root = Path(args.output_dir)
    for path in files:
        print(f"{_human(_size(path)):>10}  {path.relative_to(root)}")
    print(f"{_human(sum(_size(p) for p in files)):>10}  in all, {len(files)} files in {root}")
    return files


if __name__ == "__main__":
    run_command(main)
