"""Our model against an independent reference: `torch.nn.Transformer` with copied weights.

The reference is PyTorch's own post-norm encoder-decoder (§3.1, `norm_first=False`) without its extra final
LayerNorms (the paper has none), wrapped here by hand: embeddings × √d_model (§3.4) plus the sinusoids of §3.5
written out from the paper's formula, and a pre-softmax linear that reuses the embedding matrix (§3.4).
Nothing of `modeling_vaswani` is used on the reference side except the weights that are copied into it.
"""

import math

import pytest
import torch
from torch import nn

from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel

from tiny_runs import randomise_norms_and_biases

# fp32 throughout; both sides do the same arithmetic in a different order, so they agree to ~1e-6.
ATOL, RTOL = 1e-5, 0.0

CONFIGS = {
    "d32_h4": dict(vocab_size=50, d_model=32, h=4, d_ff=64, encoder_layers=2, decoder_layers=2, layer_norm_eps=1e-5),
    # odd head count (d_k = 8), uneven stack depths and a non-default ε, so that every one of these is plumbed
    "d24_h3": dict(vocab_size=50, d_model=24, h=3, d_ff=40, encoder_layers=3, decoder_layers=2, layer_norm_eps=1e-3),
}
PAD = 1
pytestmark = pytest.mark.filterwarnings("ignore:enable_nested_tensor is True:UserWarning")  # odd head count


def paper_sinusoids(length: int, d_model: int) -> torch.Tensor:
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))."""
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos / 10000.0 ** (two_i / d_model))
    pe[:, 1::2] = torch.cos(pos / 10000.0 ** (two_i / d_model))
    return pe.float()


class ReferenceTransformer(nn.Module):
    """`nn.Transformer` (post-norm, no final norms) with §3.4 scaled tied embeddings and §3.5 sinusoids."""

    def __init__(self, cfg: VaswaniConfig):
        super().__init__()
        self.d_model = cfg.d_model
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)  # one matrix: source, target and output
        self.transformer = nn.Transformer(
            cfg.d_model,
            cfg.h,
            cfg.encoder_layers,
            cfg.decoder_layers,
            cfg.d_ff,
            dropout=0.0,
            activation="relu",
            batch_first=True,
            norm_first=False,
            layer_norm_eps=cfg.layer_norm_eps,
        )
        self.transformer.encoder.norm = nn.Identity()
        self.transformer.decoder.norm = nn.Identity()
        self.transformer.encoder.use_nested_tensor = False  # a prototype API; padded rows are not compared anyway

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids) * math.sqrt(self.d_model) + paper_sinusoids(ids.shape[1], self.d_model)

    def forward(self, src, src_mask, tgt, tgt_mask=None):
        """Returns (encoder output, decoder output, logits); masks are 1 = token, 0 = padding."""
        src_pad = ~src_mask.bool()
        tgt_pad = None if tgt_mask is None else ~tgt_mask.bool()
        causal = torch.ones(tgt.shape[1], tgt.shape[1], dtype=torch.bool).triu(1)  # True = may not attend
        memory = self.transformer.encoder(self.embed(src), src_key_padding_mask=src_pad)
        out = self.transformer.decoder(
            self.embed(tgt),
            memory,
            tgt_mask=causal,
            tgt_is_causal=True,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
        )
        return memory, out, out @ self.embedding.weight.T


def copy_attention(ref: nn.MultiheadAttention, ours) -> None:
    ref.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
    ref.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
    ref.out_proj.weight.copy_(ours.w_o.weight)
    ref.out_proj.bias.copy_(ours.w_o.bias)


def copy_linear_or_norm(ref: nn.Module, ours: nn.Module) -> None:
    ref.weight.copy_(ours.weight)
    ref.bias.copy_(ours.bias)


@torch.no_grad()
def build_reference(model: VaswaniModel) -> ReferenceTransformer:
    """Copy every weight of our bare model into the reference; returns it in our model's train/eval mode."""
    ref = ReferenceTransformer(model.config)
    ref.embedding.weight.copy_(model.shared.weight)
    for ref_layer, ours in zip(ref.transformer.encoder.layers, model.encoder.layers, strict=True):
        copy_attention(ref_layer.self_attn, ours.self_attn)
        copy_linear_or_norm(ref_layer.linear1, ours.ffn.w_1)
        copy_linear_or_norm(ref_layer.linear2, ours.ffn.w_2)
        copy_linear_or_norm(ref_layer.norm1, ours.norm1)
        copy_linear_or_norm(ref_layer.norm2, ours.norm2)
    for ref_layer, ours in zip(ref.transformer.decoder.layers, model.decoder.layers, strict=True):
        copy_attention(ref_layer.self_attn, ours.self_attn)
        copy_attention(ref_layer.multihead_attn, ours.cross_attn)
        copy_linear_or_norm(ref_layer.linear1, ours.ffn.w_1)
        copy_linear_or_norm(ref_layer.linear2, ours.ffn.w_2)
        copy_linear_or_norm(ref_layer.norm1, ours.norm1)
        copy_linear_or_norm(ref_layer.norm2, ours.norm2)
        copy_linear_or_norm(ref_layer.norm3, ours.norm3)
    return ref.train(model.training)


def make_model(name: str, cls=VaswaniForConditionalGeneration, seed: int = 0):
    """A tiny model without dropout, with every LayerNorm and bias randomised (init would make them 1 and 0)."""
    torch.manual_seed(seed)
    config = VaswaniConfig(**CONFIGS[name], p_drop=0.0)
    return randomise_norms_and_biases(cls(config))


def padded_batch(vocab_size: int, seed: int = 1):
    """Three sources of lengths 9, 6, 3 (right-padded) and targets of lengths 7, 4, 7 (right-padded)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab_size, (3, 9), generator=g)
    src_mask = torch.ones_like(src)
    for row, length in enumerate((9, 6, 3)):
        src_mask[row, length:] = 0
    tgt = torch.randint(3, vocab_size, (3, 7), generator=g)
    tgt_mask = torch.ones_like(tgt)
    tgt_mask[1, 4:] = 0
    return src.masked_fill(src_mask == 0, PAD), src_mask, tgt.masked_fill(tgt_mask == 0, PAD), tgt_mask


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_match_nn_transformer_on_padded_batch(name):
    """§3: encoder, decoder, tied pre-softmax linear; logits equal the reference on every non-padded position."""
    model = make_model(name).eval()
    ref = build_reference(model.model)
    src, src_mask, tgt, tgt_mask = padded_batch(model.config.vocab_size)
    with torch.no_grad():
        ours = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
        memory, _, logits = ref(src, src_mask, tgt, tgt_mask)
    keep = tgt_mask.bool()
    assert logits.abs().max() > 1.0  # the comparison is not between two near-zero tensors
    torch.testing.assert_close(ours.logits[keep], logits[keep], atol=ATOL, rtol=RTOL)
    src_keep = src_mask.bool()  # nn.Transformer's fast path zeroes padded encoder rows; they are never attended
    torch.testing.assert_close(ours.encoder_last_hidden_state[src_keep], memory[src_keep], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", CONFIGS)
def test_bare_model_last_hidden_state_matches_nn_transformer(name):
    """§3.1: the bare encoder-decoder's decoder output equals the reference's (no final LayerNorm: post-norm)."""
    model = make_model(name, cls=VaswaniModel).eval()
    ref = build_reference(model)
    src, src_mask, tgt, tgt_mask = padded_batch(model.config.vocab_size, seed=2)
    with torch.no_grad():
        ours = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
        _, out, _ = ref(src, src_mask, tgt, tgt_mask)
    keep = tgt_mask.bool()
    torch.testing.assert_close(ours.last_hidden_state[keep], out[keep], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", CONFIGS)
def test_unpadded_source_without_mask_matches_nn_transformer(name):
    """Without an attention_mask every source token is attended (§3.2.3), as in the reference with no padding."""
    model = make_model(name).eval()
    ref = build_reference(model.model)
    g = torch.Generator().manual_seed(3)
    src = torch.randint(3, model.config.vocab_size, (2, 8), generator=g)
    tgt = torch.randint(3, model.config.vocab_size, (2, 5), generator=g)
    with torch.no_grad():
        ours = model(input_ids=src, decoder_input_ids=tgt).logits
        _, _, logits = ref(src, torch.ones_like(src), tgt)
    torch.testing.assert_close(ours, logits, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", CONFIGS)
def test_gradients_match_nn_transformer(name):
    """§3.4 weight tying and backward: d(loss)/d(shared embedding) sums the source, target and output uses.

    Train mode with dropout 0. The reference uses its one embedding matrix in all three places, so the gradients
    agree only if our encoder input, decoder input and pre-softmax linear are one tensor.
    """
    model = make_model(name).train()
    ref = build_reference(model.model)
    src, src_mask, tgt, tgt_mask = padded_batch(model.config.vocab_size, seed=4)
    g = torch.Generator().manual_seed(5)
    labels = torch.randint(3, model.config.vocab_size, tgt.shape, generator=g)
    keep = tgt_mask.bool()

    def loss_of(logits):  # plain cross-entropy over the non-padded target positions
        return nn.functional.cross_entropy(logits[keep], labels[keep])

    ours = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
    loss_of(ours.logits).backward()
    loss_of(ref(src, src_mask, tgt, tgt_mask)[2]).backward()

    ours_grad, ref_grad = model.model.shared.weight.grad, ref.embedding.weight.grad
    assert model.lm_head.weight.grad is ours_grad  # one tensor, one gradient
    assert ref_grad.abs().max() > 1e-3
    # the output-projection part alone would reach every row; the input parts only the rows of the tokens used
    torch.testing.assert_close(ours_grad, ref_grad, atol=ATOL, rtol=RTOL)
    # the layers' gradients too: the backward pass matches, not only the embedding's
    enc, dec = model.model.encoder.layers[0], model.model.decoder.layers[-1]
    ref_enc, ref_dec = ref.transformer.encoder.layers[0], ref.transformer.decoder.layers[-1]
    pairs = [
        (enc.ffn.w_1.weight, ref_enc.linear1.weight),
        (enc.norm1.weight, ref_enc.norm1.weight),
        (dec.cross_attn.w_o.weight, ref_dec.multihead_attn.out_proj.weight),
        (dec.norm3.bias, ref_dec.norm3.bias),
    ]
    for p, q in pairs:
        torch.testing.assert_close(p.grad, q.grad, atol=ATOL, rtol=RTOL)
    q_grad = torch.cat([enc.self_attn.w_q.weight.grad, enc.self_attn.w_k.weight.grad, enc.self_attn.w_v.weight.grad])
    torch.testing.assert_close(q_grad, ref_enc.self_attn.in_proj_weight.grad, atol=ATOL, rtol=RTOL)
