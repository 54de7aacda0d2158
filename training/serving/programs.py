"""A model folder through transformers' own exporters (`transformers.exporters`): three programs, `encoder`,
`prefill` and `decode`, each with the pre-softmax linear inside and dynamic in batch, source and cache length (or,
with `max_cache_len`, on a static self-attention cache of that length); `ExportedForGeneration` runs `generate()` on
them (greedy and beam search); `export_folder` writes an export (or a CTranslate2 model) with the code files and the
tokenizer. See `python -m training.export --help`."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
from transformers import GenerationConfig
from transformers.cache_utils import DynamicCache, EncoderDecoderCache, StaticCache, StaticLayer
from transformers.modeling_outputs import BaseModelOutput

from modeling_vaswani import VaswaniForConditionalGeneration
from modeling_vaswani.modeling_vaswani import VaswaniSeq2SeqLMOutput
from training.common.files import output_problem
from training.serving.ctranslate2_conversion import convert_ctranslate2
from training.serving.formats import EXPORTERS, ExportError, check_cache, check_format

COMPONENTS = ("encoder", "prefill", "decode")


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


def export_programs(
    model: VaswaniForConditionalGeneration,
    fmt: str,
    quantization: str | None = None,
    log=print,
    max_cache_len: int | None = None,
):
    """The `ExportedModel` of `model` in `fmt`: components `encoder`, `prefill`, `decode` (see the module docstring).

    Traced on the plain path: `set_cpu_kernel("aten")` for the duration (the oneDNN/int8 kernels are eager-only and
    also skip themselves under tracing), fp32, eval mode.

    `max_cache_len`: decoder programs on a static self-attention cache of that length, the exporters' convention
    (the `generate()` calls traced with `cache_implementation="static"`, `max_cache_len`; the export's generation
    config carries both, so its `generate()` builds that cache); see `static_cross_attention_as_dynamic`.
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
        static = {"cache_implementation": "static", "max_cache_len": max_cache_len} if max_cache_len else {}
        generation_config = GenerationConfig(**{**model.generation_config.to_diff_dict(), **static})
        beams = GenerationConfig(**{**generation_config.to_diff_dict(), "num_beams": 2, "do_sample": False})
        stages = decompose_for_generation(model, inputs, generation_config=beams, multi_token_decode=True)
        plans = {"encoder": (EncoderStep(model), {k: inputs[k] for k in EncoderStep.INPUTS})}
        for name, (_, kwargs) in stages.items():  # the decoder calls generate() made, as DecoderStep takes them
            kwargs = {**kwargs, "encoder_hidden_states": kwargs["encoder_outputs"][0]}
            # contiguous, as the runner passes them (a strided slice would trace a guard on its strides)
            kwargs = {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            if max_cache_len:
                kwargs["cache"] = without_batch_size(
                    static_cross_attention_as_dynamic(kwargs["cache"], max_cache_len, model.config)
                )
            step = DecoderStep(model, returns_cross_attention_cache=name == "prefill")
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
        components, exporter.export_format, config=model.config, generation_config=generation_config
    )


def static_cross_attention_as_dynamic(cache: EncoderDecoderCache, max_cache_len: int, config) -> EncoderDecoderCache:
    """A captured static `EncoderDecoderCache` with its cross-attention part as a `DynamicCache` (same keys/values).

    generate() sizes a static cross-attention cache to the batch's source length, a Python int that a trace bakes
    in: the programs would take one source length only. The cross-attention keys/values are written once, by
    `prefill`, and never grow, so a dynamic cache there fixes nothing a static one would; the self-attention cache,
    the one that grows, stays static at `max_cache_len`. `ExportedForGeneration` builds the same pair."""
    self_cache, cross = cache.self_attention_cache, cache.cross_attention_cache
    if not isinstance(self_cache, StaticCache) or self_cache.layers[0].max_cache_len != max_cache_len:
        raise ExportError(f"the traced generate() call did not build a static cache of {max_cache_len}")
    dynamic = DynamicCache(config=config)
    for index, layer in enumerate(cross.layers):
        if layer.is_initialized:
            dynamic.update(layer.keys, layer.values, index)
    return EncoderDecoderCache(self_cache, dynamic)


def without_batch_size(cache: EncoderDecoderCache) -> EncoderDecoderCache:
    """`cache` (in place) without the batch size transformers' `StaticLayer` keeps as a Python int once filled.

    A program's cache travels as a pytree whose structure holds its Python attributes, and torch.export's program
    refuses inputs whose structure differs from the traced one: a decode program traced on 4 rows would refuse 3
    (greedy, another batch) on that int alone, though its tensors' batch axis is dynamic. The int is bookkeeping
    (beam search's row selection does not update it), so the programs take and return static caches without it."""
    for layer in getattr(cache.self_attention_cache, "layers", ()):
        if isinstance(layer, StaticLayer):
            layer.__dict__.pop("batch_size", None)
    return cache


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
    `generate()` gives it (the encoder output as a tensor) and `(logits, cache)` out; see `EncoderStep`.

    `prefill` returns the whole `EncoderDecoderCache` (it computes the cross-attention keys/values); `decode`
    returns only the self-attention cache (a `DynamicCache`): its cross-attention keys/values come in and are read,
    never changed, and an output that is an input unchanged would make the program copy them every step (OpenVINO
    2026.3's CPU plugin does worse: such an output aliases the caller's input buffer, and a later call writes
    through the freed buffer, crashing `infer`)."""

    INPUTS = ("decoder_input_ids", "attention_mask", "encoder_hidden_states", "cache")

    def __init__(self, model: VaswaniForConditionalGeneration, returns_cross_attention_cache: bool = True):
        super().__init__()
        self.model = model
        self.config = model.config
        self.returns_cross_attention_cache = returns_cross_attention_cache

    def forward(self, decoder_input_ids, attention_mask, encoder_hidden_states, cache):
        out = self.model(
            decoder_input_ids=decoder_input_ids,
            attention_mask=attention_mask,
            encoder_outputs=(encoder_hidden_states,),
            cache=cache,
            use_cache=True,
        )
        without_batch_size(out.cache)
        if self.returns_cross_attention_cache:
            return out.logits, out.cache  # (B, T, vocab), the cache grown by T
        return out.logits, out.cache.self_attention_cache  # (B, T, vocab), the self-attention cache grown by T


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

    @property
    def static_cache_len(self) -> int | None:
        """The static self-attention cache length the decoder programs take (`--max_cache_len`), None if dynamic."""
        config = self.exported.generation_config
        return config.max_cache_len if config is not None and config.cache_implementation == "static" else None

    def new_cache(self) -> EncoderDecoderCache:
        """An empty cache of the kind the programs were traced on (see `static_cross_attention_as_dynamic`)."""
        cross = DynamicCache(config=self.config)
        if self.static_cache_len is None:
            return EncoderDecoderCache(DynamicCache(config=self.config), cross)
        return EncoderDecoderCache(StaticCache(config=self.config, max_cache_len=self.static_cache_len), cross)

    def _prepare_cache_for_generation(
        self, generation_config, model_kwargs, generation_mode, batch_size, max_cache_length
    ):
        """generate()'s cache, checked against the programs before the first decoder step: a static export takes a
        static cache of its own length, and no call that could outgrow it (`max_cache_length`: decoder prompt plus
        the most new tokens, |source| + 50 under the paper's rule); a dynamic export takes a dynamic cache."""
        wanted, length = generation_config.cache_implementation, self.static_cache_len
        if model_kwargs.get("cache") is not None or not generation_config.use_cache:
            return super()._prepare_cache_for_generation(
                generation_config, model_kwargs, generation_mode, batch_size, max_cache_length
            )
        if length is None:
            if wanted not in (None, "dynamic"):
                raise ValueError(
                    f"cache_implementation={wanted!r}: this export's decoder programs take a dynamic cache; export "
                    "with --cache_implementation static --max_cache_len N for a static one"
                )
            return super()._prepare_cache_for_generation(
                generation_config, model_kwargs, generation_mode, batch_size, max_cache_length
            )
        if wanted != "static" or generation_config.max_cache_len not in (None, length):
            raise ValueError(
                f"cache_implementation={wanted!r}, max_cache_len={generation_config.max_cache_len}: this export's "
                f"decoder programs take a static cache of max_cache_len={length} only"
            )
        if max_cache_length > length:
            raise ValueError(
                f"this call may fill {max_cache_length} decoder cache positions per sentence (decoder prompt + "
                f"max_new_tokens; the paper's rule allows |source| + 50 new tokens), more than this export's static "
                f"max_cache_len={length}: use shorter sources or a smaller max_new_tokens, or export again with "
                f"--max_cache_len {max_cache_length} or more"
            )
        model_kwargs["cache"] = self.new_cache()

    def get_encoder(self, *args, **kwargs) -> torch.nn.Module:
        return self.exported_encoder

    def forward(self, decoder_input_ids=None, attention_mask=None, encoder_outputs=None, cache=None, **kwargs):
        if cache is None:  # the programs always take a cache: an empty one runs the whole prompt
            cache = self.new_cache()
        step = "decode" if cache.get_seq_length() > 0 else "prefill"
        without_batch_size(cache)
        runner = self.exported.runners[step]
        logits, grown = runner(
            decoder_input_ids=decoder_input_ids.contiguous(),
            attention_mask=attention_mask,
            encoder_hidden_states=encoder_outputs[0],
            cache=cache,
        )
        # A program returns a new cache (decode: its self-attention part); decoding loops keep theirs (as with eager,
        # where it grows in place)
        (cache if step == "prefill" else cache.self_attention_cache).__dict__.update(grown.__dict__)
        return VaswaniSeq2SeqLMOutput(logits=logits, cache=cache)


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
    max_cache_len: int | None = None,
) -> list[Path]:
    """Export the model folder `folder` to `output_dir` in `fmt` (decoder programs on a static cache of
    `max_cache_len` when given); returns the files written."""
    from training.inference.translation import EvaluationError, load_model

    check_format(fmt, quantization)
    check_cache(fmt, "static" if max_cache_len is not None else "dynamic", max_cache_len)
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
        exported = export_programs(model, fmt, quantization, log=log, max_cache_len=max_cache_len)
        log(f"saving to {output_dir}")
        save_export(exported, model, tokenizer, output_dir)
    return sorted(p for p in output_dir.rglob("*") if p.is_file())
