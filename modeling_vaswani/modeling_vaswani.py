"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers v5 model.

Post-norm, exactly as §3.1 writes it: every sub-layer is wrapped as LayerNorm(x + Dropout(Sublayer(x))),
with no LayerNorm on the embeddings and none after the last layer of either stack (the Annotated
Transformer and most later code are pre-norm; this model is not). Positions are the fixed, interleaved
sinusoids of §3.5, computed for any length and never stored. One embedding matrix serves the encoder
input, the decoder input and the pre-softmax linear (§3.4), scaled by √d_model on input.

Decoding as §6.1 (`use_paper_decoding()`, set on every model training/train.py trains and saved with it): beam size 4,
the GNMT length penalty lp(Y) = ((5 + |Y|) / 6)^α with α = 0.6, and at most |source| + 50 output tokens per
sentence. transformers' own rule (score / |Y|^α) stays available with `length_penalty_rule="transformers"`. A model
built from a config alone starts, like every transformers model, from transformers' default generation config.

The rest of the package sits in sibling files this one imports relatively, so that they travel with it to the Hub
as remote code (`save_pretrained` copies the relative imports, transitively; `modeling_vaswani.code_files()` lists
them): `configuration_vaswani.py` (the config), `kernels_vaswani.py` (the fast CPU kernels behind the linear layers),
`cache_vaswani.py` (keys/values across decoding steps, rows that share a source), `checks_vaswani.py` (input
checks), `loss_vaswani.py` (§5.4's loss), `generation_vaswani.py` (§6.1's decoding), `pipeline_vaswani.py`
(translation).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import can_return_tuple, is_torchdynamo_compiling, logging
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .cache_vaswani import cached_keys_values, share_encoder_output, share_source_rows, ungroup_weights
from .checks_vaswani import check_shapes, check_token_ids_in_forward
from .configuration_vaswani import VaswaniConfig
from .generation_vaswani import one_cross_attention_row_per_sequence, paper_generate_kwargs
from .kernels_vaswani import VaswaniLinear, fused_linear, set_cpu_kernel
from .loss_vaswani import fused_label_smoothed_nll_loss, label_smoothed_nll_loss
from .pipeline_vaswani import TRANSLATION_PIPELINE, VaswaniTranslationPipeline  # noqa: F401  (old configs' name)

logger = logging.get_logger(__name__)

NEUTRAL_GENERATION = {"length_penalty_rule": "transformers", "max_length_over_source": None}
PAPER_GENERATION = {  # §6.1: "beam search with a beam size of 4 and length penalty α = 0.6"
    "num_beams": 4,
    "length_penalty": 0.6,
    "length_penalty_rule": "gnmt",  # lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016), not transformers' |Y|^α
    "max_length_over_source": 50,  # "maximum output length ... to input length + 50"
    "early_stopping": "never",  # stop only when no live beam can still win (exact beam search)
}


def sinusoids(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))."""
    two_i = torch.arange(0, d_model, 2, device=positions.device, dtype=torch.float32)
    angles = positions.to(torch.float32)[:, None] / torch.pow(10000.0, two_i / d_model)  # (T, ⌈d/2⌉)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[:, :d_model]  # (T, d_model), interleaved


class VaswaniScaledEmbedding(nn.Embedding):
    """§3.4: "In the embedding layers, we multiply those weights by √d_model"; the output layer uses them unscaled."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None):
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        self.scale = math.sqrt(embedding_dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.scale  # (B, T, d_model)


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs are the targets shifted right by one, starting with `decoder_start_token_id` (§3.1)."""
    shifted = labels.new_full(labels.shape, decoder_start_token_id)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill_(shifted == -100, pad_token_id)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,  # (B, h, T_q, d_k)
    key: torch.Tensor,  # (B, h, T_k, d_k)
    value: torch.Tensor,  # (B, h, T_k, d_v)
    attention_mask: torch.Tensor | None,  # (B, 1, T_q, T_k), 0 or finfo.min
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """§3.2.1, Eq. 1: Attention(Q, K, V) = softmax(QKᵀ / √d_k) V, written plainly."""
    # fp32 scores: in fp16, a score below -16 plus the mask's finfo.min overflows to -inf, and a fully masked row
    # would then softmax to NaN.
    scores = torch.matmul(query, key.transpose(-1, -2)).float() * scaling  # (B, h, T_q, T_k)
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = F.softmax(scores, dim=-1).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights  # (B, T_q, h, d_v)


class VaswaniAttention(nn.Module):
    """§3.2.2: MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O with head_i = Attention(QW_i^Q, KW_i^K, VW_i^V)."""

    def __init__(self, config: VaswaniConfig, layer_idx: int | None = None, is_causal: bool = False):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = is_causal
        self.h, self.d_k = config.h, config.d_model // config.h
        self.scaling = self.d_k**-0.5
        self.dropout = config.attention_dropout
        self.w_q = VaswaniLinear(config.d_model, config.d_model)
        self.w_k = VaswaniLinear(config.d_model, config.d_model)
        self.w_v = VaswaniLinear(config.d_model, config.d_model)
        self.w_o = VaswaniLinear(config.d_model, config.d_model)

    def forward(
        self,
        hidden_states: torch.Tensor,  # (B, T_q, d_model)
        key_value_states: torch.Tensor | None = None,  # (B, T_k, d_model): the encoder output, for cross-attention
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """§3.2.2: queries, keys and values projected to h heads of d_k, Eq. 1 per head, heads concatenated, W^O."""
        is_cross = key_value_states is not None
        B, T = hidden_states.shape[:2]
        # the projections of one input run as one product where that is faster (kernels_vaswani.fused_linear)
        if is_cross:  # keys/values from the encoder output (B_kv, T_src, d_model), B_kv sources ≤ B
            q = self.w_q(hidden_states)  # (B, T_q, d_model)
            project = lambda: fused_linear(key_value_states, self.w_k, self.w_v)  # noqa: E731  (once per source)
        else:
            q, k, v = fused_linear(hidden_states, self.w_q, self.w_k, self.w_v)  # (B, T, d_model) each
            project = lambda: (k, v)  # noqa: E731
        q = self.split_heads(q)  # (B, h, T_q, d_k)
        k, v = cached_keys_values(cache, self.layer_idx, is_cross, lambda: tuple(map(self.split_heads, project())))
        # k, v: (B_kv, h, T_past + T_k, d_k)
        q, k, v, attention_mask, group = share_source_rows(q, k, v, attention_mask, is_cross)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        dropout = self.dropout if self.training else 0.0
        out, weights = attention(self, q, k, v, attention_mask, dropout=dropout, scaling=self.scaling, **kwargs)
        heads = out.reshape(B, T, -1)  # (B, T_q, h·d_v): Concat(head_1, ..., head_h)
        return self.w_o(heads), ungroup_weights(weights, group, B, T)  # (B, T_q, d_model), (B, h, T_q, T_k)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) → (B, h, T, d_k)."""
        return x.view(x.shape[0], x.shape[1], self.h, self.d_k).transpose(1, 2)


class VaswaniFeedForward(nn.Module):
    """§3.3, Eq. 2: FFN(x) = max(0, xW_1 + b_1) W_2 + b_2."""

    def __init__(self, config: VaswaniConfig):
        super().__init__()
        self.w_1 = VaswaniLinear(config.d_model, config.d_ff)
        self.w_2 = VaswaniLinear(config.d_ff, config.d_model)
        self.act = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.dropout(self.act(self.w_1(x)), p=self.activation_dropout, training=self.training)
        return self.w_2(hidden)


class VaswaniEncoderLayer(GradientCheckpointingLayer):
    """§3.1: self-attention, then feed-forward, each as LayerNorm(x + Dropout(Sublayer(x)))."""

    def __init__(self, config: VaswaniConfig, layer_idx: int | None = None):
        super().__init__()
        self.self_attn = VaswaniAttention(config, layer_idx)
        self.ffn = VaswaniFeedForward(config)
        self.norm1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.norm2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.p_drop)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.self_attn(x, attention_mask=attention_mask, **kwargs)[0]))
        return self.norm2(x + self.dropout(self.ffn(x)))


class VaswaniDecoderLayer(GradientCheckpointingLayer):
    """§3.1: masked self-attention, encoder-decoder attention, feed-forward; each post-norm."""

    def __init__(self, config: VaswaniConfig, layer_idx: int | None = None):
        super().__init__()
        self.self_attn = VaswaniAttention(config, layer_idx, is_causal=True)
        self.cross_attn = VaswaniAttention(config, layer_idx)
        self.ffn = VaswaniFeedForward(config)
        self.norm1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.norm2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.norm3 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.p_drop)

    def forward(
        self,
        x: torch.Tensor,  # (B, T_tgt, d_model)
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,  # (B, T_src, d_model)
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.self_attn(x, attention_mask=attention_mask, cache=cache, **kwargs)[0]))
        cross = self.cross_attn(x, encoder_hidden_states, attention_mask=encoder_attention_mask, cache=cache, **kwargs)
        x = self.norm2(x + self.dropout(cross[0]))
        return self.norm3(x + self.dropout(self.ffn(x)))


class VaswaniPreTrainedModel(PreTrainedModel):
    config: VaswaniConfig
    config_class = VaswaniConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["VaswaniEncoderLayer", "VaswaniDecoderLayer"]
    _supports_sdpa = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """`PreTrainedModel.save_pretrained`; when the code files travel along, `auto_map` names both Auto classes."""
        if self._auto_class is not None:
            self.config.auto_map = {
                **(getattr(self.config, "auto_map", None) or {}),
                "AutoModel": "modeling_vaswani.VaswaniModel",
                "AutoModelForSeq2SeqLM": "modeling_vaswani.VaswaniForConditionalGeneration",
            }
            self.config.custom_pipelines = {"translation": TRANSLATION_PIPELINE}
        return super().save_pretrained(save_directory, *args, **kwargs)

    def set_cpu_kernel(self, kernel: str) -> "VaswaniPreTrainedModel":
        """The kernel of every linear layer on fp32 CPU: "auto" (default: per shape, the faster of "onednn" and "aten"
        on this CPU, measured at first use), "onednn", "int8" (inference only) or "aten" (F.linear)."""
        return set_cpu_kernel(self, kernel)

    def _init_weights(self, module: nn.Module) -> None:
        """The paper states no initialisation; as fairseq/tensor2tensor: Xavier-uniform, N(0, d_model^-0.5) embeddings."""
        std = self.config.init_std if hasattr(self.config, "init_std") else None
        if isinstance(module, nn.Linear):
            if std is None:
                init.xavier_uniform_(module.weight)
            else:
                init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=self.config.d_model**-0.5 if std is None else std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)


class VaswaniEncoder(VaswaniPreTrainedModel):
    """The encoder stack of §3.1: N identical layers over scaled embeddings plus sinusoids."""

    _can_record_outputs = {"hidden_states": VaswaniEncoderLayer, "attentions": VaswaniAttention}

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.embed_tokens = VaswaniScaledEmbedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.layers = nn.ModuleList([VaswaniEncoderLayer(config, i) for i in range(config.encoder_layers)])
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,  # (B, T_src)
        attention_mask: torch.Tensor | None = None,  # (B, T_src), 1 = token, 0 = padding
        inputs_embeds: torch.Tensor | None = None,  # (B, T_src, d_model), as embed_tokens gives them (scaled)
        **kwargs,
    ) -> BaseModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        check_shapes(input_ids, attention_mask, "input_ids")
        if inputs_embeds is None:
            check_token_ids_in_forward(input_ids, self.config.vocab_size, "input_ids")
            inputs_embeds = self.embed_tokens(input_ids)
        elif inputs_embeds.shape[0] == 0:
            raise ValueError("inputs_embeds is an empty batch")
        kwargs.pop("use_cache", None)  # the encoder keeps no cache
        positions = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device)
        x = inputs_embeds + sinusoids(positions, self.config.d_model).to(inputs_embeds.dtype)
        x = F.dropout(x, p=self.config.p_drop, training=self.training)  # §5.4: dropout on the sums
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=x, attention_mask=attention_mask)
        for layer in self.layers:
            x = layer(x, mask, **kwargs)
        return BaseModelOutput(last_hidden_state=x)  # no final LayerNorm: post-norm


class VaswaniDecoder(VaswaniPreTrainedModel):
    """The decoder stack of §3.1: masked self-attention so position i sees only positions < i+1."""

    _can_record_outputs = {
        "hidden_states": VaswaniDecoderLayer,
        "attentions": OutputRecorder(VaswaniAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VaswaniAttention, index=1, layer_name="cross_attn"),
    }

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.embed_tokens = VaswaniScaledEmbedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.layers = nn.ModuleList([VaswaniDecoderLayer(config, i) for i in range(config.decoder_layers)])
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,  # (B, T_tgt)
        attention_mask: torch.Tensor | None = None,  # (B, T_past + T_tgt)
        encoder_hidden_states: torch.Tensor | None = None,  # (B, T_src, d_model)
        encoder_attention_mask: torch.Tensor | None = None,  # (B, T_src)
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of decoder_input_ids or decoder_inputs_embeds")
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past = cache.get_seq_length() if cache is not None else 0  # a 0-d tensor for a static cache
        if not is_torchdynamo_compiling():  # compiled code branches on no value (tests/test_generation_contracts.py)
            check_shapes(input_ids, attention_mask, "decoder_input_ids", past)
            if inputs_embeds is None and past == 0:  # later decoding steps feed back the model's own predictions
                check_token_ids_in_forward(input_ids, self.config.vocab_size, "decoder_input_ids")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        B, T = inputs_embeds.shape[:2]
        if encoder_hidden_states is not None and (is_torchdynamo_compiling() or encoder_hidden_states.shape[0] != B):
            encoder_hidden_states, encoder_attention_mask = share_encoder_output(
                self.config._attn_implementation, B, encoder_hidden_states, encoder_attention_mask
            )
        if attention_mask is None and not is_torchdynamo_compiling():
            attention_mask = torch.ones(B, past + T, device=inputs_embeds.device, dtype=torch.long)
        self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        causal_mask = create_causal_mask(
            config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask, cache=self_cache
        )
        cross_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        positions = torch.arange(T, device=inputs_embeds.device) + past
        x = inputs_embeds + sinusoids(positions, self.config.d_model).to(inputs_embeds.dtype)
        x = F.dropout(x, p=self.config.p_drop, training=self.training)
        for layer in self.layers:
            x = layer(x, causal_mask, encoder_hidden_states, encoder_attention_mask=cross_mask, cache=cache, **kwargs)
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=x, cache=cache)


class VaswaniModel(VaswaniPreTrainedModel):
    """The bare encoder-decoder (§3.1): decoder states, no output projection."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.shared = VaswaniScaledEmbedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = VaswaniEncoder(config)
        self.decoder = VaswaniDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = self.encoder.embed_tokens = self.decoder.embed_tokens = value

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


@dataclass
class VaswaniSeq2SeqLMOutput(Seq2SeqLMOutput):
    """`loss` is the cross-entropy per target token, label-smoothed only if ε_ls > 0 (`epsilon_ls` or
    config.label_smoothing, 0 by default); `nll_loss` is always the plain NLL per token."""

    nll_loss: torch.FloatTensor | None = None


class VaswaniForConditionalGeneration(VaswaniPreTrainedModel, GenerationMixin):
    """The full model: encoder-decoder, tied pre-softmax linear (§3.4), cross-entropy loss, paper decoding."""

    _tied_weights_keys = {
        "lm_head.weight": "model.shared.weight",
        "model.encoder.embed_tokens.weight": "model.shared.weight",
        "model.decoder.embed_tokens.weight": "model.shared.weight",
    }

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.model = VaswaniModel(config)
        self.lm_head = VaswaniLinear(config.d_model, config.vocab_size, bias=False)  # no logits bias in the paper
        self.lm_head.onednn_training = False  # (tokens × vocab) products: MKL's is faster with autograd
        self.post_init()
        # transformers' defaults, plus this model's two entries at values that change nothing (so generate() accepts
        # them as arguments); `use_paper_decoding()` sets §6.1's
        self.generation_config.update(**NEUTRAL_GENERATION, allow_custom_entries=True)
        self.generation_config._from_model_config = False  # else from_pretrained drops the custom entries

    def use_paper_decoding(self) -> "VaswaniForConditionalGeneration":
        """§6.1's decoding as this model's default: beam 4, GNMT α = 0.6, |source| + 50, beam search run to the end.

        Kept in `generation_config.json` when saved. A model built from a config alone has transformers' defaults
        (greedy), as every transformers model, so transformers' own generation tests hold for it."""
        self.generation_config.update(**PAPER_GENERATION, allow_custom_entries=True)
        return self

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,  # (B, T_tgt), -100 = ignored
        use_cache: bool | None = None,
        epsilon_ls: float | None = None,  # ε_ls (§5.4), defaults to config.label_smoothing (0: plain cross-entropy)
        num_items_in_batch: int | torch.Tensor | None = None,  # target tokens over accumulation steps (Trainer)
        **kwargs,
    ) -> VaswaniSeq2SeqLMOutput:
        if labels is not None:
            check_shapes(labels, None, "labels")
            check_token_ids_in_forward(labels, self.config.vocab_size, "labels", ignore_index=-100)
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        loss = nll_loss = logits = None
        eps = self.config.label_smoothing if epsilon_ls is None else epsilon_ls
        if labels is not None and self.config.fused_loss and self.training and torch.is_grad_enabled():
            loss, nll_loss = fused_label_smoothed_nll_loss(
                outputs.last_hidden_state, self.lm_head.weight, labels, eps, num_items_in_batch
            )
        else:
            logits = self.lm_head(outputs.last_hidden_state)  # (B, T_tgt, vocab)
            if labels is not None:
                loss, nll_loss = self.loss_function(logits, labels, eps, num_items_in_batch)
        return VaswaniSeq2SeqLMOutput(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
            nll_loss=nll_loss,
        )

    @property
    def loss_function(self) -> Callable:
        return label_smoothed_nll_loss

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def generate(self, inputs: torch.Tensor | None = None, generation_config: GenerationConfig | None = None, **kwargs):
        """`GenerationMixin.generate`, plus §6.1's rules (generation_vaswani.py): at most |source| +
        `max_length_over_source` tokens per sentence unless `max_length`/`max_new_tokens` is given, and
        `length_penalty_rule` "gnmt"/"transformers". Beam search (and greedy search returning plain sequences) runs
        `generation_vaswani.decode`: a sentence leaves the batch the step it is finished."""
        kwargs = paper_generate_kwargs(self, inputs, generation_config, kwargs)
        return one_cross_attention_row_per_sequence(super().generate(inputs, generation_config, **kwargs))


__all__ = [
    "VaswaniPreTrainedModel",
    "VaswaniModel",
    "VaswaniForConditionalGeneration",
    "VaswaniSeq2SeqLMOutput",
    "sinusoids",
]
