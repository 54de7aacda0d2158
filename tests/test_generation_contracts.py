"""transformers' contracts, checked against transformers' own MarianMTModel on the same inputs.

transformers' `GenerationTesterMixin` (tests/generation/test_utils.py) is not in the PyPI sdist, so CI cannot run it
(tests/transformers_suite.py runs it by hand from a checkout: VASWANI_UPSTREAM_TESTS). These tests hold the
contracts it found broken, each against the Marian twin of our model (benchmarks/twins.py: the same network with our
weights copied), never against a belief about what transformers does:

- every field of a `generate()` dict output has Marian's shape: greedy, beam, sample, beam-sample, n-best;
- `model(labels=...).loss` is the cross-entropy against `labels`, as Marian's is;
- a static cache auto-compiles the forward inside `generate()`, with no recompilation for a smaller length and the
  same tokens as eager decoding;
- continuing from a returned cache gives the same cache, scores and tokens as one call.
"""

import os

import pytest
import torch
import torch.nn.functional as F
from transformers import MarianMTModel
from transformers.generation import CompileConfig

from benchmarks.twins import marian_twin
from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration

PAD, EOS = 1, 2


@pytest.fixture(scope="module")
def pair(one_thread) -> tuple[VaswaniForConditionalGeneration, MarianMTModel]:
    """Ours, with LayerNorms and biases away from 1 and 0, and its Marian twin (same function)."""
    torch.manual_seed(0)
    config = VaswaniConfig(vocab_size=60, d_model=32, d_ff=64, h=4, encoder_layers=2, decoder_layers=2, p_drop=0.0)
    ours = VaswaniForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    return ours, marian_twin(ours).eval()


def padded_sources() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(3, 60, (3, 8), generator=g)
    ids[:, -1] = EOS
    mask = torch.ones_like(ids)
    ids[1, 5:], mask[1, 5:] = PAD, 0  # right padding; the row keeps no EOS: the mask alone says where it ends
    ids[2, 3:], mask[2, 3:] = PAD, 0
    return ids, mask


MODES = {
    "greedy": dict(num_beams=1, do_sample=False),
    "beam": dict(num_beams=2, do_sample=False),
    "sample": dict(num_beams=1, do_sample=True, top_k=0),
    "beam_sample": dict(num_beams=2, do_sample=True, top_k=0),
    "n_best": dict(num_beams=3, num_return_sequences=2, do_sample=False),
}
# Settings both models must share: Marian's generation config is transformers' defaults, ours the paper's (§6.1)
COMMON = dict(
    max_new_tokens=5,
    min_new_tokens=5,  # no EOS before: sampled outputs have one length, whatever was drawn
    length_penalty=1.0,
    early_stopping=False,
    return_dict_in_generate=True,
    output_scores=True,
    output_logits=True,
    output_attentions=True,
    output_hidden_states=True,
)


def shapes(value):
    """The shape of every tensor in a (nested) output field, in order; None stays None."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    return [shapes(v) for v in value]


def generate_both(pair, mode: str, **extra):
    ids, mask = padded_sources()
    outputs = []
    for model in pair:
        model.set_attn_implementation("eager")  # attentions are returned by the eager kernel only
        kwargs = dict(COMMON, **MODES[mode], **extra)
        if isinstance(model, VaswaniForConditionalGeneration):
            kwargs["length_penalty_rule"] = "transformers"  # Marian's rule: score / |Y|^α
        torch.manual_seed(7)
        outputs.append(model.generate(input_ids=ids, attention_mask=mask, **kwargs))
        model.set_attn_implementation("sdpa")
    return outputs


@pytest.mark.parametrize("mode", list(MODES))
def test_generate_dict_output_fields_have_marians_shapes(pair, mode):
    ours, marian = generate_both(pair, mode)
    assert type(ours).__name__ == type(marian).__name__
    fields = [k for k in marian.__dataclass_fields__ if k not in ("cache", "past_key_values")]
    for field in fields:
        assert shapes(getattr(ours, field)) == shapes(getattr(marian, field)), field
    B = padded_sources()[0].shape[0]
    assert ours.encoder_hidden_states[-1].shape[0] == B  # one row per source, not per beam or sample
    if not MODES[mode]["do_sample"]:  # the same function decodes the same tokens
        assert torch.equal(ours.sequences, marian.sequences)
        for a, b in zip(ours.scores, marian.scores, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    for part in ("self_attention_cache", "cross_attention_cache"):  # the cross-attention rows: one per sequence
        ours_layers = getattr(ours.past_key_values, part).layers
        for a, b in zip(ours_layers, getattr(marian.past_key_values, part).layers, strict=True):
            assert a.keys.shape == b.keys.shape and a.values.shape == b.values.shape, part


def test_loss_is_the_cross_entropy_against_labels_as_marians(pair):
    ours, marian = pair
    ids, mask = padded_sources()
    labels = torch.randint(3, 60, (3, 6), generator=torch.Generator().manual_seed(5))
    labels[1, 4:] = -100
    with torch.no_grad():
        out = ours(input_ids=ids, attention_mask=mask, labels=labels)
        twin = marian(input_ids=ids, attention_mask=mask, labels=labels)
    expected = F.cross_entropy(out.logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    torch.testing.assert_close(out.logits, twin.logits, atol=1e-4, rtol=0)
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert out.loss.item() == pytest.approx(twin.loss.item(), rel=1e-5)
    assert out.nll_loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_static_cache_auto_compiles_without_recompiling(pair):
    """transformers compiles the forward (`model._compiled_call`) when the cache is static, and a later call with a
    smaller length reuses the graph. Greedy search: transformers' own beam search never auto-compiles (Marian's
    neither). The backend is dynamo's compile counter over eager kernels: it checks the
    tracing (one full graph, guards that hold) without inductor's slow code generation; VASWANI_TEST_COMPILE=1
    counts over inductor instead."""
    from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

    ids, mask = padded_sources()
    results = {}
    for model in pair:
        torch.compiler.reset()
        model.__dict__.pop("_compiled_call", None)
        counter = CompileCounterWithBackend("inductor") if os.environ.get("VASWANI_TEST_COMPILE") == "1" else None
        counter = counter or CompileCounter()
        backend = lambda gm, inputs, counter=counter, **options: counter(gm, inputs)  # noqa: E731 (mode=... dropped)
        compile_config = CompileConfig(fullgraph=True, dynamic=False, backend=backend)
        compile_config._compile_all_devices = True  # compile on the CPU too, as transformers' own test does
        kwargs = dict(num_beams=1, do_sample=False)
        eager = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, **kwargs)
        static = dict(kwargs, cache_implementation="static", compile_config=compile_config)
        first = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, **static)
        name = type(model).__name__
        assert hasattr(model, "_compiled_call"), f"{name}: generate() did not compile the forward"
        assert counter.frame_count >= 1, f"{name}: the compiled forward never ran"
        compiled = counter.frame_count
        second = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, **static)
        assert counter.frame_count == compiled, f"{name} recompiled for a smaller length"
        assert torch.equal(first, eager), name
        assert torch.equal(second, eager[:, : second.shape[1]]), name
        results[name] = first
    torch.compiler.reset()
    assert torch.equal(results["VaswaniForConditionalGeneration"], results["MarianMTModel"])


@pytest.mark.parametrize("masked_prompt", [False, True])
def test_continuing_from_a_returned_cache_equals_one_call(pair, masked_prompt):
    """transformers' own scenario: a decoder prompt, a left-padded source, EOS = pad = -1 (never met), greedy search:
    3 tokens, then the returned cache and sequences back in for 1 more, against 4 tokens in one call. With a decoder
    prompt whose mask hides a position, transformers' two routes need not agree (they do not for Marian): then each route's cache,
    scores and tokens must equal Marian's."""
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(3, 60, (4, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :1] = 0
    mask[1:, :2] = 0
    decoder_ids = torch.randint(3, 60, (4, 5), generator=g)
    decoder_ids[:, 0] = 0
    decoder_mask = torch.ones_like(decoder_ids)
    if masked_prompt:
        decoder_mask[2, 1:3] = 0
    settings = dict(
        pad_token_id=-1, eos_token_id=-1, use_cache=True, do_sample=False, num_beams=1,
        return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    routes = {}
    for model in pair:
        inputs = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids)
        inputs["decoder_attention_mask"] = decoder_mask
        one = model.generate(**inputs, **settings, max_new_tokens=4)
        first = model.generate(**inputs, **settings, max_new_tokens=3)
        grown = F.pad(decoder_mask, (0, first.sequences.shape[1] - decoder_mask.shape[1]), value=1)
        inputs.update(decoder_input_ids=first.sequences, decoder_attention_mask=grown)
        second = model.generate(**inputs, **settings, max_new_tokens=1, cache=first.past_key_values)
        second.scores = first.scores + second.scores
        routes[type(model).__name__] = (one, second)
    (ours_one, ours_two), (marian_one, marian_two) = routes["VaswaniForConditionalGeneration"], routes["MarianMTModel"]
    compared = [(ours_one, marian_one), (ours_two, marian_two)]  # each route as Marian's
    if not masked_prompt:
        compared.append((ours_one, ours_two))  # and the two routes alike
    for a, b in compared:
        assert torch.equal(a.sequences, b.sequences)
        for x, y in zip(a.scores, b.scores, strict=True):
            torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)
        caches = (a.past_key_values.self_attention_cache, b.past_key_values.self_attention_cache)
        for x, y in zip(*(c.layers for c in caches), strict=True):
            torch.testing.assert_close(x.keys, y.keys, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(x.values, y.values, atol=1e-4, rtol=1e-4)
