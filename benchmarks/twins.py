"""The systems the benchmarks compare against: a transformers `MarianMTModel` configured as this model's twin, and
CTranslate2 converted from this model by training/serving/ctranslate2_conversion.py.

The twin is the same network (ReLU, post-norm, sinusoids, √d_model-scaled tied embeddings, same sizes and dropout)
and, after `copy_weights`, the same function: our interleaved sinusoids are written into its position table, so
both give the same logits (a test checks it). CTranslate2 gets the same weights through our converter
(training/serving/ctranslate2_conversion.py), so all three systems decode one model.
"""

import torch
from transformers import MarianConfig, MarianMTModel

from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from modeling_vaswani.modeling_vaswani import sinusoids


def marian_twin_config(config: VaswaniConfig, max_positions: int = 1024) -> MarianConfig:
    """A MarianConfig for the same network as `config`: sizes, activation, dropout, scaling and special ids."""
    return MarianConfig(
        vocab_size=config.vocab_size,
        decoder_vocab_size=config.vocab_size,
        d_model=config.d_model,
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        encoder_attention_heads=config.h,
        decoder_attention_heads=config.h,
        encoder_ffn_dim=config.d_ff,
        decoder_ffn_dim=config.d_ff,
        activation_function=config.activation_function,
        dropout=config.p_drop,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout,
        max_position_embeddings=max_positions,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=config.pad_token_id,
        eos_token_id=config.eos_token_id,
        bos_token_id=config.bos_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
        forced_eos_token_id=None,
    )


def marian_twin(model: VaswaniForConditionalGeneration, max_positions: int = 1024) -> MarianMTModel:
    """A MarianMTModel computing the same function as `model` (weights copied), on the same device and dtype."""
    twin = MarianMTModel(marian_twin_config(model.config, max_positions))
    copy_weights(model, twin)
    twin.__dict__["vaswani_source"] = model  # not a submodule: `ctranslate2_translator(twin)` converts the source
    return twin.to(device=model.device, dtype=model.dtype).train(model.training)


def copy_weights(ours: VaswaniForConditionalGeneration, twin: MarianMTModel) -> None:
    """Copy every weight of `ours` into `twin`; its position tables get our interleaved sinusoids (§3.5)."""
    src = ours.state_dict()
    names = {"w_q": "q_proj", "w_k": "k_proj", "w_v": "v_proj", "w_o": "out_proj", "cross_attn": "encoder_attn"}
    norms = {
        "encoder": {"norm1": "self_attn_layer_norm", "norm2": "final_layer_norm"},
        "decoder": {"norm1": "self_attn_layer_norm", "norm2": "encoder_attn_layer_norm", "norm3": "final_layer_norm"},
    }
    target = {}
    for key, value in src.items():
        new = key.replace("ffn.w_1", "fc1").replace("ffn.w_2", "fc2")
        for a, b in names.items():
            new = new.replace(f".{a}.", f".{b}.")
        stack = "decoder" if ".decoder." in new else "encoder"
        for a, b in norms[stack].items():
            new = new.replace(f".{a}.", f".{b}.")
        target[new] = value
    table = sinusoids(torch.arange(twin.config.max_position_embeddings), ours.config.d_model)
    target["model.encoder.embed_positions.weight"] = table
    target["model.decoder.embed_positions.weight"] = table
    target["final_logits_bias"] = torch.zeros_like(twin.final_logits_bias)
    missing, unexpected = twin.load_state_dict(target, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"weight copy to the Marian twin failed: missing {missing}, unexpected {unexpected}")


SPECIALS = {0: "<s>", 1: "<pad>", 2: "</s>", 3: "<unk>"}


def id_tokens(ids) -> list[str]:
    """Token ids as the strings of the CTranslate2 vocabulary built here (specials by name, others as numbers)."""
    return [SPECIALS.get(i, str(i)) for i in ids]


def token_ids(tokens) -> list[int]:
    """The inverse of `id_tokens`."""
    inverse = {v: k for k, v in SPECIALS.items()}
    return [inverse[t] if t in inverse else int(t) for t in tokens]


class IdVocabulary:
    """What CTranslate2's conversion reads from a tokenizer, for a vocabulary of bare ids (the benchmarks need no
    text): token i is `id_tokens([i])[0]`."""

    def __init__(self, config):
        self.size = config.vocab_size
        self.bos_token, self.eos_token, self.unk_token = "<s>", "</s>", "<unk>"

    def get_vocab(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(id_tokens(range(self.size)))}

    def convert_ids_to_tokens(self, i: int) -> str:
        return id_tokens([i])[0]


def ctranslate2_translator(
    model: VaswaniForConditionalGeneration, quantization: str = "float32", threads: int = 0, device: str = "cpu"
):
    """A `ctranslate2.Translator` of `model` through training/serving/ctranslate2_conversion.py, over the bare-id vocabulary
    (`id_tokens`); `quantization` "float32", "int8", "bfloat16" ... A twin from `marian_twin` stands for the model
    it was copied from. Returns None when ctranslate2 is not installed (the optional `bench` extra)."""
    model = model.__dict__.get("vaswani_source", model)
    if not isinstance(model, VaswaniForConditionalGeneration):
        raise TypeError(f"ctranslate2_translator converts this model or its marian_twin, not a {type(model).__name__}")
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return None
    from training.serving.ctranslate2_conversion import ctranslate2_translator as translator

    return translator(model, IdVocabulary(model.config), quantization, threads=threads, device=device)


def model_flops_per_token(config: VaswaniConfig, source_len: float, target_len: float) -> dict[str, float]:
    """Training FLOPs per (source + target) token: 6 × matmul parameters + attention scores (Kaplan et al., 2020).

    Forward FLOPs per token are 2 × the weights it multiplies; backward is twice the forward, so 6 × in all.
    Matmul weights per encoder token: 4 d² (attention) + 2 d·d_ff (FFN); per decoder token: 8 d² (self + cross)
    + 2 d·d_ff + d·V (output projection). Attention scores and weighted sums add 2·2·T_k·d per layer and token
    (QKᵀ and AV), halved for causal self-attention. Embedding look-ups, norms, softmax and the loss are not counted.
    """
    d, f, V = config.d_model, config.d_ff, config.vocab_size
    enc = config.encoder_layers * (4 * d * d + 2 * d * f)
    dec = config.decoder_layers * (8 * d * d + 2 * d * f) + d * V
    enc_attn = config.encoder_layers * 4 * source_len * d
    dec_attn = config.decoder_layers * (4 * target_len * d / 2 + 4 * source_len * d)
    per_step = 6 * (enc * source_len + dec * target_len) + 3 * (enc_attn * source_len + dec_attn * target_len)
    return {"flops_per_token": per_step / (source_len + target_len), "flops_per_step_per_pair": per_step}


__all__ = [
    "copy_weights",
    "ctranslate2_translator",
    "id_tokens",
    "token_ids",
    "marian_twin",
    "marian_twin_config",
    "model_flops_per_token",
]
