"""A model of ours as a CTranslate2 model directory: the spec read from our post-norm layers, the conversion, a
translator for tests and benchmarks, and the generation config mapped to `translate_batch` options."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import torch
from transformers import GenerationConfig

from modeling_vaswani import VaswaniForConditionalGeneration
from modeling_vaswani.modeling_vaswani import sinusoids
from training.serving.formats import ExportError

CT2_MAX_POSITIONS = 1024  # rows of the sinusoid table CTranslate2 gets (it has no interleaved sinusoids of its own)


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
    # CTranslate2 reads fp32 CPU tensors; the caller's model is untouched. A new model from the weights, not a
    # deepcopy: a model that has decoded under a oneDNN CPU kernel holds packed weights that cannot be copied
    fresh = type(model)(config)
    fresh.load_state_dict(model.state_dict())
    model = fresh.float().cpu().eval()
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
