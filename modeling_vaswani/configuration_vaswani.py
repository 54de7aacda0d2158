"""Configuration of the paper's Transformer (Vaswani et al., 2017, "Attention Is All You Need").

Defaults are the base model of Table 3: N = 6, d_model = 512, d_ff = 2048, h = 8, d_k = d_v = 64,
P_drop = 0.1, with one shared source/target BPE vocabulary of 37,000 tokens (§5.1).
This file travels to the Hub with `modeling_vaswani.py` as remote code: it imports nothing of ours.
"""

from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassFieldValidationError
from transformers import PreTrainedConfig

ACTIVATIONS = ("relu", "gelu")


@strict(accept_kwargs=True)
class VaswaniConfig(PreTrainedConfig):
    r"""The post-norm encoder-decoder of §3, named after the paper's symbols.

    Args:
        vocab_size: size of the one vocabulary shared by source and target (§5.1: 37,000 BPE tokens).
        d_model: model width, also of embeddings and sub-layer outputs (§3.1).
        d_ff: inner width of the position-wise feed-forward networks (§3.3, Eq. 2).
        h: number of attention heads; d_k = d_v = d_model / h (§3.2.2).
        encoder_layers: N, the number of encoder layers (§3.1).
        decoder_layers: N, the number of decoder layers (§3.1).
        p_drop: P_drop, dropout on every sub-layer output and on the embedding + position sums (§5.4).
        attention_dropout: dropout on attention weights (not in the paper; 0 by default).
        activation_dropout: dropout after the feed-forward activation (not in the paper; 0 by default).
        activation_function: "relu" as in Eq. 2 ("gelu" offered for experiments).
        layer_norm_eps: ε of every LayerNorm (the paper does not state it; PyTorch's default).
        label_smoothing: ε_ls applied by the model's own `loss`. 0 by default, so `model(labels=...).loss` is the
            plain cross-entropy, as in every transformers model. The paper's ε_ls = 0.1 (§5.4) is the training
            recipe's: Trainer's `label_smoothing_factor` (training/train.py sets it from the recipe). `nll_loss`
            (plain NLL) is always returned as well.
        fused_loss: in training with labels, compute the loss (and its gradient) from the decoder states a chunk
            of rows at a time, never holding the (tokens × vocab) logits: much less memory and memory traffic.
            The output's `logits` is then None. Off by default; training/train.py turns it on.
        init_std: None (default) initialises as fairseq and tensor2tensor do (the paper is silent):
            Xavier-uniform linear weights, N(0, d_model^-0.5) embeddings; a number gives N(0, init_std) to all.
        bos_token_id / pad_token_id / eos_token_id: 0 / 1 / 2, fairseq's order (unk is 3). pad is not 0 on
            purpose: transformers' beam search fills finished rows with `pad_token_id or eos`, so a pad id of 0
            would come out as eos.
        decoder_start_token_id: the first decoder input, <s> (0).
        tie_word_embeddings: the pre-softmax linear shares the embedding matrix (§3.4). The encoder
            and decoder input embeddings are always one matrix.

    Example:
        >>> config = VaswaniConfig.from_json_file("configuration/base.json")
        >>> config.d_k
        64
    """

    model_type = "vaswani"
    keys_to_ignore_at_inference = ["cache"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "h",
        "encoder_attention_heads": "h",
        "decoder_attention_heads": "h",
        "num_hidden_layers": "encoder_layers",
        "intermediate_size": "d_ff",
        "encoder_ffn_dim": "d_ff",
        "decoder_ffn_dim": "d_ff",
        "dropout": "p_drop",
        "hidden_dropout_prob": "p_drop",
        "layer_norm_epsilon": "layer_norm_eps",
    }

    vocab_size: int = 37000
    d_model: int = 512
    d_ff: int = 2048
    h: int = 8
    encoder_layers: int = 6
    decoder_layers: int = 6
    p_drop: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    activation_function: str = "relu"
    layer_norm_eps: float = 1e-5
    label_smoothing: float | int = 0.0
    fused_loss: bool = False
    init_std: float | None = None
    use_cache: bool = True
    is_encoder_decoder: bool = True
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 0
    tie_word_embeddings: bool = True

    @property
    def d_k(self) -> int:
        """d_k = d_v = d_model / h (§3.2.2)."""
        return self.d_model // self.h

    def __post_init__(self, **kwargs):
        # Checked here as well as by `@strict`'s validator so that a bad value raises a plain ValueError.
        self.validate_architecture()
        super().__post_init__(**kwargs)

    def validate_architecture(self) -> None:
        """Reject sizes and rates the model cannot be built with, naming the field."""
        for name in ("vocab_size", "d_model", "d_ff", "h", "encoder_layers", "decoder_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"VaswaniConfig.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.h != 0:
            raise ValueError(
                f"VaswaniConfig.d_model ({self.d_model}) must be divisible by VaswaniConfig.h ({self.h}): "
                "each head has d_k = d_model / h dimensions (§3.2.2)"
            )
        for name in ("p_drop", "attention_dropout", "activation_dropout", "label_smoothing"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"VaswaniConfig.{name} must be in [0, 1), got {value!r}")
        if self.activation_function not in ACTIVATIONS:
            raise ValueError(
                f"VaswaniConfig.activation_function must be one of {ACTIVATIONS}, got {self.activation_function!r}"
            )
        if not self.layer_norm_eps > 0:
            raise ValueError(f"VaswaniConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        if self.pad_token_id is None:
            raise ValueError("VaswaniConfig.pad_token_id must be set: padded batches need it")
        for name in ("pad_token_id", "bos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"VaswaniConfig.{name} must be in [0, vocab_size={self.vocab_size}), got {value!r}")


class ConfigFieldTypeError(StrictDataclassFieldValidationError, ValueError):
    """A config field of the wrong type, e.g. `"vocab_size": "1000"` in config.json. Raised where `@strict` raises
    StrictDataclassFieldValidationError (still caught as that), and also a ValueError like every other bad value."""

    def __init__(self, field: str, value, cause: BaseException) -> None:
        self.field, self.value = field, value
        declared = getattr(VaswaniConfig, "__dataclass_fields__", {}).get(field)
        if declared is None:
            message = f"VaswaniConfig.{field}: {cause}"
        else:
            kind = getattr(declared.type, "__name__", str(declared.type))
            message = f"VaswaniConfig.{field} must be of type {kind}, got {type(value).__name__} {value!r}"
        ValueError.__init__(self, message)


_strict_setattr = VaswaniConfig.__setattr__


def _setattr(self, name, value):
    try:
        _strict_setattr(self, name, value)
    except StrictDataclassFieldValidationError as error:
        raise ConfigFieldTypeError(name, value, error.__cause__ or error) from error


VaswaniConfig.__setattr__ = _setattr

__all__ = ["ConfigFieldTypeError", "VaswaniConfig"]
