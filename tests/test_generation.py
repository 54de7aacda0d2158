"""Decoding (§6.1): cache equivalence, the GNMT length penalty, |source| + 50, cross-attention computed once."""

import math

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration, gnmt_length_penalty

from tiny_runs import train_to_reverse

EOS, PAD, START = 2, 1, 0


def make_model(seed: int = 0, **overrides) -> VaswaniForConditionalGeneration:
    torch.manual_seed(seed)
    fields = dict(vocab_size=40, d_model=32, d_ff=64, h=4, encoder_layers=2, decoder_layers=2)
    return VaswaniForConditionalGeneration(VaswaniConfig(**{**fields, **overrides})).eval()


@pytest.fixture(scope="module")
def trained() -> VaswaniForConditionalGeneration:
    """A model that has half-learned to reverse its input: its decoding varies, unlike a random model's."""
    model = make_model(p_drop=0.0)
    for _ in train_to_reverse(model, lr=3e-3, vocab=40, length=7, eos=EOS, steps=60):
        pass
    return model.use_paper_decoding().eval()  # §6.1 decoding, as training/train.py sets it


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 40, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    for row, length in enumerate((9, 6, 3)):
        ids[row, length:], mask[row, length:] = PAD, 0
    return ids, mask


def test_paper_generation_config_is_set_on_request_and_saved(tmp_path):
    """A model from a config alone starts from transformers' defaults, as MarianMTModel does (transformers' own
    generation tests assume them); `use_paper_decoding()` sets §6.1's, and they travel with the saved folder."""
    fresh, default = make_model().generation_config, GenerationConfig()
    for key in ("num_beams", "do_sample", "length_penalty", "early_stopping", "max_length", "max_new_tokens"):
        assert getattr(fresh, key) == getattr(default, key), key
    assert fresh.length_penalty_rule == "transformers" and fresh.max_length_over_source is None  # change nothing
    model = make_model().use_paper_decoding()
    gen = model.generation_config
    assert (gen.num_beams, gen.length_penalty, gen.length_penalty_rule) == (4, 0.6, "gnmt")
    assert gen.max_length_over_source == 50 and gen.early_stopping == "never"
    model.save_pretrained(tmp_path)
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path).generation_config
    assert (loaded.num_beams, loaded.length_penalty, loaded.length_penalty_rule) == (4, 0.6, "gnmt")
    assert loaded.max_length_over_source == 50 and loaded.early_stopping == "never"


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_beams=1, do_sample=False),
        dict(num_beams=4),
        dict(num_beams=4, length_penalty_rule="transformers"),
        dict(num_beams=1, do_sample=True, top_k=0),
        dict(num_beams=3, do_sample=True, num_return_sequences=2),
    ],
)
def test_cached_and_uncached_decoding_give_identical_tokens(kwargs, trained):
    model, (ids, mask) = trained, batch()
    outputs = []
    for use_cache in (True, False):
        torch.manual_seed(123)
        outputs.append(
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, use_cache=use_cache, **kwargs)
        )
    assert torch.equal(outputs[0], outputs[1])
    assert len(set(outputs[0][:, 1:].flatten().tolist())) > 3  # a model that says one token proves nothing


def test_greedy_generate_matches_a_hand_written_loop(trained):
    """Independent reference: re-run the full decoder on the growing prefix and take the argmax each step."""
    model, (ids, mask) = trained, batch()
    out = model.generate(input_ids=ids, attention_mask=mask, num_beams=1, max_new_tokens=10)
    with torch.no_grad():
        prefix = torch.full((ids.shape[0], 1), START)
        done = torch.zeros(ids.shape[0], dtype=torch.bool)
        for _ in range(10):
            logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=prefix, use_cache=False).logits
            nxt = logits[:, -1].argmax(-1).masked_fill(done, PAD)
            prefix = torch.cat([prefix, nxt[:, None]], dim=1)
            done |= nxt.eq(EOS)
            if done.all():
                break
    assert torch.equal(out, prefix)


class ScriptedLogProbs(LogitsProcessor):
    """Replaces the model's next-token distribution with a fixed table keyed by the generated prefix."""

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], vocab_size: int):
        self.table, self.vocab_size = table, vocab_size

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        out = torch.empty_like(scores)
        for row, seq in enumerate(input_ids.tolist()):
            probs = self.table.get(tuple(seq[1:]), {})
            rest = (1.0 - sum(probs.values())) / (self.vocab_size - len(probs))
            out[row] = math.log(rest)
            for token, p in probs.items():
                out[row, token] = math.log(p)
        return out


A, B = 5, 6
# Y_a = [a, EOS]: log P = log .40 + log .90;  Y_b = [b, b, b, EOS]: log P = log .35 + 3 log .95.
TABLE = {(): {A: 0.40, B: 0.35}, (A,): {EOS: 0.90}, (B,): {B: 0.95}, (B, B): {B: 0.95}, (B, B, B): {EOS: 0.95}}
LOGP_A = math.log(0.40) + math.log(0.90)
LOGP_B = math.log(0.35) + 3 * math.log(0.95)


def test_gnmt_length_penalty_formula():
    """lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016), by hand for α = 0.6."""
    assert gnmt_length_penalty(1, 0.6) == 1.0
    assert gnmt_length_penalty(4, 0.6) == pytest.approx(1.5**0.6, rel=1e-12)
    assert gnmt_length_penalty(13, 0.6) == pytest.approx(3.0**0.6, rel=1e-12)


@pytest.mark.parametrize("rule", ["gnmt", "transformers"])
def test_beam_search_applies_the_chosen_length_penalty(rule):
    """A case where the two rules disagree: GNMT keeps the short hypothesis, |Y|^α prefers the long one."""
    alpha = 0.6
    by_hand = {
        "gnmt": {(A, EOS): LOGP_A / ((5 + 2) / 6) ** alpha, (B, B, B, EOS): LOGP_B / ((5 + 4) / 6) ** alpha},
        "transformers": {(A, EOS): LOGP_A / 2**alpha, (B, B, B, EOS): LOGP_B / 4**alpha},
    }[rule]
    best = max(by_hand, key=by_hand.get)
    assert best == ((A, EOS) if rule == "gnmt" else (B, B, B, EOS))  # the case really separates the rules

    model = make_model().use_paper_decoding()  # beam 4, α = 0.6
    ids, mask = batch()
    out = model.generate(
        input_ids=ids[:1],
        attention_mask=mask[:1],
        max_new_tokens=8,
        length_penalty_rule=rule,
        logits_processor=LogitsProcessorList([ScriptedLogProbs(TABLE, model.config.vocab_size)]),
        return_dict_in_generate=True,
        output_scores=True,
    )
    tokens = tuple(t for t in out.sequences[0, 1:].tolist() if t != PAD)
    assert tokens == best
    assert out.sequences_scores[0].item() == pytest.approx(by_hand[best], abs=1e-5)


def test_plain_generate_uses_the_paper_rule():
    """`model.generate(**inputs)` with no decoding arguments gives the GNMT choice."""
    model, (ids, mask) = make_model().use_paper_decoding(), batch()
    out = model.generate(
        input_ids=ids[:1],
        attention_mask=mask[:1],
        logits_processor=LogitsProcessorList([ScriptedLogProbs(TABLE, model.config.vocab_size)]),
    )
    assert tuple(t for t in out[0, 1:].tolist() if t != PAD) == (A, EOS)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_maximum_output_length_is_source_length_plus_50(num_beams):
    """§6.1: "maximum output length ... input length + 50", per sentence (EOS suppressed so no row ends early)."""
    model, (ids, mask) = make_model().use_paper_decoding(), batch()
    out = model.generate(input_ids=ids, attention_mask=mask, num_beams=num_beams, suppress_tokens=[EOS])
    lengths = out[:, 1:].ne(PAD).sum(-1)  # finished rows are filled with pad
    assert lengths.tolist() == [9 + 50, 6 + 50, 3 + 50]
    assert out.shape[1] == 1 + 9 + 50


def test_explicit_length_arguments_override_the_source_rule():
    model, (ids, mask) = make_model().use_paper_decoding(), batch()
    out = model.generate(input_ids=ids, attention_mask=mask, num_beams=1, suppress_tokens=[EOS], max_new_tokens=5)
    assert out.shape[1] == 6 and out[:, 1:].ne(PAD).all()
    out = model.generate(
        input_ids=ids, attention_mask=mask, num_beams=1, suppress_tokens=[EOS], max_length_over_source=2
    )
    assert out[:, 1:].ne(PAD).sum(-1).tolist() == [11, 8, 5]


def test_cross_attention_keys_and_values_are_computed_once_per_source():
    model, (ids, mask) = make_model(), batch()
    calls = []
    for layer in model.model.decoder.layers:
        layer.cross_attn.w_k.register_forward_hook(lambda m, i, o: calls.append("k"))
        layer.cross_attn.w_v.register_forward_hook(lambda m, i, o: calls.append("v"))
    out = model.generate(input_ids=ids, attention_mask=mask, num_beams=4, max_new_tokens=6, suppress_tokens=[EOS])
    assert out.shape[1] == 7  # six decoding steps ran
    assert calls.count("k") == calls.count("v") == model.config.decoder_layers


def test_unknown_length_penalty_rule_is_refused():
    model, (ids, mask) = make_model(), batch()
    with pytest.raises(ValueError, match="length_penalty_rule"):
        model.generate(input_ids=ids, attention_mask=mask, length_penalty_rule="google")
