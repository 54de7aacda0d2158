"""The architecture of §3 as built: parameter counts, sinusoids, the three-way tie, post-norm, no logits bias."""

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel, sinusoids

from tiny_runs import randomise_norms_and_biases

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configuration"
TINY = dict(vocab_size=50, d_model=32, h=4, d_ff=64, encoder_layers=3, decoder_layers=2, p_drop=0.0)


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())  # parameters() yields each tensor once


@pytest.fixture(scope="module")
def base():
    """The base model of Table 3, built on the CPU (about a second)."""
    return VaswaniForConditionalGeneration(VaswaniConfig.from_json_file(CONFIG_DIR / "base.json"))


@pytest.fixture(scope="module")
def big():
    """The big model of Table 3; only counted, so built without memory on the meta device."""
    with torch.device("meta"):
        return VaswaniForConditionalGeneration(VaswaniConfig.from_json_file(CONFIG_DIR / "big.json"))


def tiny_model(seed: int = 0, randomise_norms: bool = True, **overrides) -> VaswaniForConditionalGeneration:
    torch.manual_seed(seed)
    model = VaswaniForConditionalGeneration(VaswaniConfig(**{**TINY, **overrides})).eval()
    return randomise_norms_and_biases(model) if randomise_norms else model


# ---------------------------------------------------------------- (a) parameter counts


def test_base_parameter_table(base):
    """Table 3 base (N=6, d_model=512, d_ff=2048, h=8, 37,000 shared BPE tokens): 63,082,496 unique parameters."""
    enc, dec = base.model.encoder, base.model.decoder
    layer = enc.layers[0]
    assert n_params(layer.self_attn) == 1_050_624  # 4 · (512·512 + 512), §3.2.2
    assert n_params(layer.ffn) == 2_099_712  # 512·2048 + 2048 + 2048·512 + 512, Eq. 2
    assert n_params(layer.norm1) + n_params(layer.norm2) == 2_048
    assert all(n_params(x) == 3_152_384 for x in enc.layers)
    assert n_params(enc.layers) == 18_914_304
    assert all(n_params(x) == 4_204_032 for x in dec.layers)  # two attentions, one FFN, three norms
    assert n_params(enc.layers) + n_params(dec.layers) == 44_138_496
    assert n_params(base.model.shared) == 37_000 * 512
    assert n_params(base) == 63_082_496
    assert n_params(base.model) == 63_082_496  # the head adds nothing: it is the embedding


def test_big_parameter_table(big):
    """Table 3 big (d_model=1024, d_ff=4096, h=16): 176,357,376 in the 6+6 layers, 214,245,376 in all."""
    enc, dec = big.model.encoder, big.model.decoder
    assert n_params(enc.layers[0].self_attn) == 4 * (1024 * 1024 + 1024)
    assert n_params(enc.layers) + n_params(dec.layers) == 176_357_376
    assert n_params(big) == 214_245_376


# ---------------------------------------------------------------- (b) sinusoids


def formula(pos: int, j: int, d_model: int) -> float:
    """§3.5, column j = 2i or 2i+1: sin for even columns, cos for odd ones, at frequency 1/10000^(2i/d_model)."""
    two_i = j - j % 2
    angle = pos / 10000 ** (two_i / d_model)
    return math.sin(angle) if j % 2 == 0 else math.cos(angle)


POSITIONS = list(range(64)) + list(range(64, 5000, 97)) + [5000]


@pytest.mark.parametrize("d_model", [2, 6, 7, 32, 512])
def test_sinusoids_follow_the_paper_formula(d_model):
    """§3.5, interleaved: column 2i is sin, column 2i+1 the cos of the same frequency; positions up to 5,000.

    Tolerance: a float32 angle carries a rounding error of order 2^-24 · angle, so |error| ≤ 8 · 2^-24 · (1 + angle)
    (measured: at most ~5 of these units; a wrong frequency, order or interleaving errs by O(1)).
    """
    table = sinusoids(torch.tensor(POSITIONS), d_model).double()
    assert table.shape == (len(POSITIONS), d_model)
    expected = torch.tensor([[formula(p, j, d_model) for j in range(d_model)] for p in POSITIONS], dtype=torch.float64)
    angles = torch.tensor(
        [[p / 10000 ** ((j - j % 2) / d_model) for j in range(d_model)] for p in POSITIONS], dtype=torch.float64
    )
    err = (table - expected).abs()
    assert (err <= 8 * 2.0**-24 * (1 + angles)).all(), f"largest error {err.max():.3g}"
    # interleaving at one glance: position 1, the first frequency is 1, so columns 0 and 1 are sin(1) and cos(1)
    one = sinusoids(torch.tensor([1]), d_model)[0]
    assert one[0].item() == pytest.approx(math.sin(1.0), abs=1e-6)
    if d_model > 1:
        assert one[1].item() == pytest.approx(math.cos(1.0), abs=1e-6)


def test_positions_are_computed_not_stored():
    """§3.5: fixed sinusoids, not learned (§3.5 compares learned ones) and not saved: no buffer, no parameter."""
    model = tiny_model()
    assert list(model.named_buffers()) == []
    names = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    assert set(model.state_dict()) == names
    assert not any("pos" in name for name in names)
    table = sinusoids(torch.arange(8), model.config.d_model)
    for p in model.parameters():  # no parameter holds (a prefix of) the table
        if p.dim() == 2 and p.shape[1] == table.shape[1] and p.shape[0] >= table.shape[0]:
            assert not torch.allclose(p[:8], table, atol=1e-3)


def test_input_longer_than_any_table():
    """Positions are computed for any length (§3.5: "extrapolate to sequence lengths longer than ... training").

    3,000 source and target tokens; the input of each stack's first layer is embedding · √d_model + PE, with PE
    from the formula at every position.
    """
    model = tiny_model(vocab_size=20, d_model=8, h=2, d_ff=16, encoder_layers=1, decoder_layers=1)
    length, d = 3000, model.config.d_model
    seen = {}
    for stack in ("encoder", "decoder"):
        layer = getattr(model.model, stack).layers[0]
        layer.register_forward_pre_hook(lambda mod, args, stack=stack: seen.__setitem__(stack, args[0]))
    ids = torch.randint(3, 20, (1, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(input_ids=ids, decoder_input_ids=ids).logits
    assert logits.shape == (1, length, 20) and torch.isfinite(logits).all()
    pe = torch.tensor([[formula(p, j, d) for j in range(d)] for p in range(length)])
    expected = model.model.shared.weight[ids[0]].detach() * math.sqrt(d) + pe
    for stack in ("encoder", "decoder"):
        torch.testing.assert_close(seen[stack][0], expected, atol=8 * 2.0**-24 * (1 + length) + 1e-6, rtol=1e-6)


# ---------------------------------------------------------------- (c) the three-way tie


def test_one_embedding_matrix_three_uses(base):
    """§3.4: "we share the same weight matrix between the two embedding layers and the pre-softmax linear"."""
    shared = base.model.shared.weight
    assert base.lm_head.weight is shared
    assert base.model.encoder.embed_tokens.weight is shared
    assert base.model.decoder.embed_tokens.weight is shared
    embedding_sized = [p for p in base.parameters() if p.shape == (37_000, 512)]
    assert len(embedding_sized) == 1


def test_tie_in_bare_model_and_after_reload(tmp_path):
    """The tie holds in the bare encoder-decoder too, and survives save_pretrained / from_pretrained."""
    bare = VaswaniModel(VaswaniConfig(**TINY))
    assert bare.encoder.embed_tokens.weight is bare.shared.weight is bare.decoder.embed_tokens.weight
    model = tiny_model()
    model.save_pretrained(tmp_path)
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path)
    shared = loaded.model.shared.weight
    assert loaded.lm_head.weight is shared
    assert loaded.model.encoder.embed_tokens.weight is shared and loaded.model.decoder.embed_tokens.weight is shared
    torch.testing.assert_close(shared, model.model.shared.weight, atol=0, rtol=0)


# ---------------------------------------------------------------- (d) post-norm


NORM_NAME = re.compile(r"model\.(encoder\.layers\.\d+\.norm[12]|decoder\.layers\.\d+\.norm[123])")


@pytest.mark.parametrize("n_enc,n_dec", [(3, 2), (6, 6)])
def test_layer_norms_only_inside_the_layers(n_enc, n_dec):
    """§3.1: LayerNorm(x + Sublayer(x)) after each sub-layer: 2 per encoder layer, 3 per decoder layer, none else."""
    model = VaswaniForConditionalGeneration(VaswaniConfig(**{**TINY, "encoder_layers": n_enc, "decoder_layers": n_dec}))
    norms = [name for name, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 2 * n_enc + 3 * n_dec
    assert all(NORM_NAME.fullmatch(name) for name in norms), norms
    others = [name for name, m in model.named_modules() if "norm" in type(m).__name__.lower()]
    assert sorted(others) == sorted(norms)  # no RMSNorm or the like either


def attention_by_hand(attn, x, memory, allowed):
    """Eq. 1 and §3.2.2 from the module's weights: softmax(QKᵀ/√d_k)V per head, concatenated, times W^O."""
    B, Tq, d = x.shape
    h, d_k = attn.h, d // attn.h

    def heads(t):
        return t.view(B, -1, h, d_k).transpose(1, 2)

    q = heads(x @ attn.w_q.weight.T + attn.w_q.bias)
    k = heads(memory @ attn.w_k.weight.T + attn.w_k.bias)
    v = heads(memory @ attn.w_v.weight.T + attn.w_v.bias)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(d_k)).masked_fill(~allowed[:, None], float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, Tq, d)
    return out @ attn.w_o.weight.T + attn.w_o.bias


def ffn_by_hand(ffn, x):
    """Eq. 2: max(0, xW_1 + b_1)W_2 + b_2."""
    return (x @ ffn.w_1.weight.T + ffn.w_1.bias).clamp(min=0) @ ffn.w_2.weight.T + ffn.w_2.bias


def ln(norm, x):
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def test_every_layer_is_post_norm():
    """§3.1: each layer's output is LayerNorm(x + Sublayer(x)) per sub-layer (not x + Sublayer(LayerNorm(x))).

    Each layer's recorded output is recomputed by hand from its recorded input, for a padded source.
    """
    model = tiny_model()
    src = torch.randint(3, 50, (2, 6), generator=torch.Generator().manual_seed(1))
    src_mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    tgt = torch.randint(3, 50, (2, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, output_hidden_states=True)
        d = model.config.d_model
        emb = model.model.shared.weight
        pe = torch.tensor([[formula(p, j, d) for j in range(d)] for p in range(6)])
        torch.testing.assert_close(out.encoder_hidden_states[0], emb[src] * math.sqrt(d) + pe, atol=1e-5, rtol=1e-5)

        key_ok = src_mask.bool()[:, None, :].expand(-1, 6, -1)  # (B, T_q, T_k)
        enc = model.model.encoder.layers
        assert len(out.encoder_hidden_states) == len(enc) + 1
        for i, layer in enumerate(enc):
            x = out.encoder_hidden_states[i]
            x = ln(layer.norm1, x + attention_by_hand(layer.self_attn, x, x, key_ok))
            x = ln(layer.norm2, x + ffn_by_hand(layer.ffn, x))
            keep = src_mask.bool()  # padded queries are never read: compare real tokens
            torch.testing.assert_close(out.encoder_hidden_states[i + 1][keep], x[keep], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.encoder_last_hidden_state, out.encoder_hidden_states[-1], atol=0, rtol=0)

        memory = out.encoder_last_hidden_state
        causal = torch.ones(5, 5, dtype=torch.bool).tril()[None].expand(2, -1, -1)
        cross_ok = src_mask.bool()[:, None, :].expand(-1, 5, -1)
        dec = model.model.decoder.layers
        for i, layer in enumerate(dec):
            y = out.decoder_hidden_states[i]
            y = ln(layer.norm1, y + attention_by_hand(layer.self_attn, y, y, causal))
            y = ln(layer.norm2, y + attention_by_hand(layer.cross_attn, y, memory, cross_ok))
            y = ln(layer.norm3, y + ffn_by_hand(layer.ffn, y))
            torch.testing.assert_close(out.decoder_hidden_states[i + 1], y, atol=1e-5, rtol=1e-5)


def test_layer_outputs_are_normalised():
    """Post-norm's signature: with LayerNorm at its initial gain 1 and bias 0, every layer output (so also the
    last one, which feeds the pre-softmax linear directly) has zero mean and unit variance per token."""
    model = tiny_model(randomise_norms=False)
    src = torch.randint(3, 50, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(input_ids=src, decoder_input_ids=src[:, :4], output_hidden_states=True)
    for states in (out.encoder_hidden_states[1:], out.decoder_hidden_states[1:]):
        for x in states:
            torch.testing.assert_close(x.mean(-1), torch.zeros(x.shape[:-1]), atol=1e-5, rtol=0)
            # LayerNorm's variance is σ²/(σ² + ε), ε = 1e-5; pre-norm outputs are off by O(1)
            torch.testing.assert_close(x.var(-1, unbiased=False), torch.ones(x.shape[:-1]), atol=1e-3, rtol=0)


# ---------------------------------------------------------------- (e) no logits bias


def test_no_logits_bias():
    """§3.4: the pre-softmax linear is the embedding matrix alone: no bias, no `final_logits_bias` (BART has one)."""
    model = tiny_model()
    assert model.lm_head.bias is None
    assert not hasattr(model, "final_logits_bias") and not hasattr(model.model, "final_logits_bias")
    assert not any("logits_bias" in key for key in model.state_dict())
    src = torch.randint(3, 50, (2, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        out = model(input_ids=src, decoder_input_ids=src[:, :4], output_hidden_states=True)
        expected = out.decoder_hidden_states[-1] @ model.model.shared.weight.T
    torch.testing.assert_close(out.logits, expected, atol=1e-6, rtol=1e-6)
