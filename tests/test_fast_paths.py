"""Every fast path against the plain path it replaces, each with its stated tolerance.

- oneDNN CPU linear kernel vs F.linear (torch's MKL sgemm): the same fp32 product summed in another order,
  atol 1e-5 on logits of order 1.
- Stacked projections (`fused_linear`: Q, K, V as one product) vs one call per layer: int8 identical, fp32 within
  1e-5 (the same sums in another blocking).
- int8 dynamic quantization vs fp32: an approximation, max |Δlogit| ≤ 5% of the largest |logit|, and the same
  greedy translations on a model that has learned its task; on each int8 engine "int8" may choose (fbgemm, oneDNN)
  and on the per-shape choice between them.
- Beams sharing one cross-attention key/value cache per source vs transformers' default (encoder output repeated per
  beam, cache reordered every step): same sequences, scores within 1e-5.
- The min-length EOS ban vs transformers' MinLength/MinNewTokens processors: identical scores.
"""

import copy
import math
import os

import pytest
import torch
import torch.nn.functional as F
from transformers.generation.logits_process import MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor

from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from modeling_vaswani.generation_vaswani import EosBanUntil
from modeling_vaswani.kernels_vaswani import VaswaniLinear, fused_linear

from test_decoding_loop import Reference, reference_loop
from tiny_runs import train_to_reverse

PAD, EOS = 1, 2
needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
needs_fbgemm = pytest.mark.skipif(
    not {"fbgemm", "x86"} & set(torch.backends.quantized.supported_engines), reason="no fbgemm/x86 quantized engine"
)


def make_model(seed: int = 0, **overrides) -> VaswaniForConditionalGeneration:
    torch.manual_seed(seed)
    fields = dict(vocab_size=50, d_model=64, d_ff=128, h=4, encoder_layers=2, decoder_layers=2, p_drop=0.0)
    return VaswaniForConditionalGeneration(VaswaniConfig(**{**fields, **overrides})).eval()


def padded_batch(seed: int = 1, vocab: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    for row, length in enumerate((9, 6, 3)):
        ids[row, length:], mask[row, length:] = PAD, 0
    return ids, mask


REVERSE_SOURCES = torch.randint(3, 50, (16, 6), generator=torch.Generator().manual_seed(9))  # the int8 test's inputs
MARGIN = 2.0  # logits: the reverser's top token beats the runner-up by at least this much at every checked position


def reversal_margin(model: VaswaniForConditionalGeneration, src: torch.Tensor) -> float:
    """The smallest (correct logit − best wrong logit) over every target position, teacher-forced; < 0 if wrong."""
    labels = torch.cat([src.flip(1), torch.full((src.shape[0], 1), EOS)], dim=1)
    with torch.no_grad():
        scores = model(input_ids=src, labels=labels).logits  # (B, T, vocab)
    correct = scores.gather(-1, labels[..., None]).squeeze(-1)
    wrong = scores.scatter(-1, labels[..., None], -math.inf).amax(-1)
    return (correct - wrong).min().item()


@pytest.fixture(scope="module")
def reverser() -> VaswaniForConditionalGeneration:
    """A model that has provably learned to reverse its input: on the tests' inputs and on held-out ones, teacher-
    forced, its top token is right everywhere with a margin of MARGIN logits. Greedy decoding then reverses exactly,
    and any kernel whose logits stay within MARGIN / 2 of these decodes the same, whatever the thread count: the
    number of training steps is not fixed, training runs until that holds (at most 3,000 steps)."""
    model = make_model(seed=3)  # p_drop 0: nothing random in training but the seeded batches
    check = torch.cat([REVERSE_SOURCES, torch.randint(3, 50, (64, 6), generator=torch.Generator().manual_seed(10))])
    margin = -math.inf
    for step in train_to_reverse(model, lr=2e-3, vocab=50, length=6, eos=EOS, steps=3000):
        if step % 100 == 0:
            margin = reversal_margin(model.eval(), check)
            model.train()
            if margin >= MARGIN:
                return model.use_paper_decoding().eval()  # §6.1 decoding, as training/train.py sets it
    pytest.fail(f"reverser fixture: after 3,000 steps the smallest reversal margin is {margin:.3f} < {MARGIN}")


def logits(model, ids, mask, kernel: str) -> torch.Tensor:
    model.set_cpu_kernel(kernel)
    for module in model.modules():  # the test model is small: run oneDNN at every size
        if isinstance(module, VaswaniLinear):
            module.onednn_min_macs = 0
    labels = torch.randint(3, 50, (ids.shape[0], 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, labels=labels).logits


@needs_onednn
def test_onednn_kernel_matches_f_linear():
    model, (ids, mask) = make_model(), padded_batch()
    reference = logits(model, ids, mask, "aten")
    assert all(m.__dict__.get("_packed") is None for m in model.modules() if isinstance(m, VaswaniLinear))
    fast = logits(model, ids, mask, "onednn")
    linears = dict(linear_names(model))
    assert len(linears) == 2 * (4 + 2) + 2 * (4 + 4 + 2) + 1  # encoder, decoder, lm_head
    assert packed_layers(model) == set(linears)  # every one of them ran on oneDNN, alone or stacked
    stacked = {name for name, m in linears.items() if "_stacked" in m.__dict__}
    assert stacked == {n for n in linears if n.endswith(("self_attn.w_q", "cross_attn.w_k"))}  # Q,K,V; K,V
    torch.testing.assert_close(fast, reference, atol=1e-5, rtol=0)


def linear_names(model) -> list[tuple[str, VaswaniLinear]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, VaswaniLinear)]


def packed_layers(model) -> set[str]:
    """The linear layers whose last product ran on a packed (oneDNN or int8) weight: their own, or the stacked copy
    `fused_linear` keeps on the first of the projections it ran together (its key holds their weights' addresses)."""
    by_address = {m.weight.data_ptr(): name for name, m in linear_names(model)}
    packed = set()
    for name, m in linear_names(model):
        if m.__dict__.get("_packed") is not None:
            packed.add(name)
        key, stacked = m.__dict__.get("_stacked", (None, None))
        if stacked is not None and stacked.__dict__.get("_packed") is not None:
            packed |= {by_address[address] for address, _ in key if address in by_address}
    return packed


def int8_engine(monkeypatch, engine: str) -> None:
    """ "int8" on this one engine only (nothing timed); skipped where torch has no such engine."""
    from modeling_vaswani.kernels_vaswani import int8_engines_available

    if engine not in int8_engines_available():
        pytest.skip(f"no {engine} quantized engine in this torch")
    monkeypatch.setattr(VaswaniLinear, "int8_engines", (engine,))


@pytest.mark.parametrize("kernel", ["onednn", "int8-fbgemm", "int8-onednn"])
def test_stacked_projections_equal_one_call_per_layer(kernel, monkeypatch):
    if kernel == "onednn" and not torch.backends.mkldnn.is_available():
        pytest.skip("torch built without oneDNN")
    if kernel.startswith("int8"):
        int8_engine(monkeypatch, kernel[5:])
        kernel = "int8"
    model = make_model().set_cpu_kernel(kernel)
    attn = model.model.encoder.layers[0].self_attn
    layers = (attn.w_q, attn.w_k, attn.w_v)
    for layer in layers:
        layer.onednn_min_macs = 0
    x = torch.randn(2, 20, 64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        alone = [layer(x) for layer in layers]
        together = fused_linear(x, *layers)
        assert "_stacked" in attn.w_q.__dict__ and [t.shape for t in together] == [a.shape for a in alone]
        for layer, a, t in zip(layers, alone, together, strict=True):
            if kernel == "int8":  # rows quantized alike, the activation once per call: the same numbers
                assert torch.equal(t, a)
            else:
                torch.testing.assert_close(t, F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=0)
        attn.w_k.weight.mul_(2.0)  # changed in place (its version moves): the stacked copy is rebuilt
        torch.testing.assert_close(fused_linear(x, *layers)[1], 2 * alone[1] - attn.w_k.bias, atol=1e-4, rtol=0)
    model.train()
    assert "_stacked" not in attn.w_q.__dict__  # training drops the stacked copy, as the packed ones


@needs_onednn
def test_stacked_projections_step_aside():
    """One call per layer in training, under "aten", and for a layer with a hook (an adapter's, a probe's)."""
    model = make_model().set_cpu_kernel("onednn")
    attn = model.model.encoder.layers[0].self_attn
    layers = (attn.w_q, attn.w_k, attn.w_v)
    for layer in layers:
        layer.onednn_min_macs = 0
    x = torch.randn(2, 20, 64)
    fused_linear(x, *layers)  # autograd on
    assert "_stacked" not in attn.w_q.__dict__
    seen = []
    hook = attn.w_v.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    with torch.no_grad():
        fused_linear(x, *layers)
        assert "_stacked" not in attn.w_q.__dict__ and seen == [(2, 20, 64)]
        hook.remove()
        model.set_cpu_kernel("aten")
        fused_linear(x, *layers)
        assert "_stacked" not in attn.w_q.__dict__
        model.set_cpu_kernel("onednn")
        fused_linear(x, *layers)
        assert "_stacked" in attn.w_q.__dict__


@needs_onednn
def test_small_products_stay_on_f_linear():
    model, (ids, _) = make_model(), padded_batch()
    model.set_cpu_kernel("onednn")
    with torch.no_grad():
        model(input_ids=ids[:1, :2], decoder_input_ids=ids[:1, :1])  # 2 × 64 × 64 multiply-adds: below the bar
    assert all(m.__dict__.get("_packed") is None for m in model.modules() if isinstance(m, VaswaniLinear))


@needs_onednn
def test_packed_weights_follow_weight_changes_and_training():
    model, (ids, mask) = make_model(), padded_batch()
    before = logits(model, ids, mask, "onednn")
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # tied: the embeddings change too
    after = logits(model, ids, mask, "onednn")
    torch.testing.assert_close(after, logits(model, ids, mask, "aten"), atol=1e-5, rtol=0)
    assert not torch.allclose(before, after)
    model.set_cpu_kernel("onednn").train()
    logits(model, ids, mask, "onednn")
    loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss  # autograd on: F.linear, packed copies freed
    loss.backward()
    assert model.lm_head.weight.grad is not None and model.model.encoder.layers[0].ffn.w_1.weight.grad is not None
    assert all(m.__dict__.get("_packed") is None for m in model.modules() if isinstance(m, VaswaniLinear))


@pytest.mark.parametrize("engine", ["timed", "fbgemm", "onednn"])
def test_int8_kernel_is_close_and_keeps_translations(reverser, engine, monkeypatch):
    """Each engine "int8" may run, and its per-shape timed choice between them ("timed", the default)."""
    from modeling_vaswani.kernels_vaswani import int8_engines_available

    if not int8_engines_available():
        pytest.skip("no int8 quantized engine in this torch")
    if engine != "timed":
        int8_engine(monkeypatch, engine)
    ids, mask = padded_batch(seed=5)
    reference = logits(reverser, ids, mask, "aten")
    quantized = logits(reverser, ids, mask, "int8")
    assert (quantized - reference).abs().max() <= 0.05 * reference.abs().max()
    src = REVERSE_SOURCES
    outputs = {}
    for kernel in ("aten", "int8"):
        reverser.set_cpu_kernel(kernel)
        outputs[kernel] = reverser.generate(src, num_beams=1, max_new_tokens=8)
    reverser.set_cpu_kernel("onednn" if torch.backends.mkldnn.is_available() else "aten")
    assert torch.equal(outputs["aten"][:, 1:7], src.flip(1))  # the model has learned the task ...
    assert torch.equal(outputs["int8"], outputs["aten"])  # ... and int8 keeps every translation
    if engine != "timed":  # the engine asked for is the one that ran
        reverser.set_cpu_kernel("int8")
        logits(reverser, ids, mask, "int8")
        ran = {k for m in reverser.modules() if m.__dict__.get("_packed") for k in m._packed[1]}
        assert ran == {f"int8-{engine}"}
        reverser.set_cpu_kernel("onednn" if torch.backends.mkldnn.is_available() else "aten")


def test_int8_weights_are_not_saved(tmp_path):
    model = make_model()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids, mask = padded_batch()
    if {"fbgemm", "x86"} & set(torch.backends.quantized.supported_engines):
        logits(model, ids, mask, "int8")
    model.save_pretrained(tmp_path)
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.state_dict().keys() == state.keys()
    for key, value in state.items():
        torch.testing.assert_close(loaded.state_dict()[key], value, atol=0, rtol=0)


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="cpu_kernel must be one of"):
        make_model().set_cpu_kernel("fp8")


def expanded_generate(model, *args, **kwargs):
    """transformers' own loops (tests/test_decoding_loop.py's reference): encoder output repeated per beam, the whole
    cache reordered every step."""
    rng = torch.get_rng_state()  # building the twin draws initial weights: keep the caller's seed for sampling
    twin = Reference(model.config).eval()
    torch.set_rng_state(rng)
    twin.load_state_dict(model.state_dict())
    twin.generation_config = copy.deepcopy(model.generation_config)  # the same decoding settings
    return twin.generate(*args, custom_generate=reference_loop, **kwargs)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_beams=4),
        dict(num_beams=3, num_return_sequences=3, length_penalty_rule="transformers"),
        dict(num_beams=2, do_sample=True, num_return_sequences=2),
        dict(num_beams=4, use_cache=False, max_new_tokens=6),
        dict(num_beams=4, min_new_tokens=5, max_new_tokens=7),
    ],
)
def test_shared_cross_attention_matches_expanded_beams(reverser, attn, kwargs):
    reverser.set_attn_implementation(attn)
    ids, mask = padded_batch(seed=4)
    common = dict(attention_mask=mask, return_dict_in_generate=True, output_scores=True, **kwargs)
    torch.manual_seed(0)
    shared = reverser.generate(ids, **common)
    torch.manual_seed(0)
    expanded = expanded_generate(reverser, ids, **common)
    reverser.set_attn_implementation("sdpa")
    assert torch.equal(shared.sequences, expanded.sequences)
    if "sequences_scores" in shared:
        torch.testing.assert_close(shared.sequences_scores, expanded.sequences_scores, atol=1e-5, rtol=0)
    for a, b in zip(shared.scores, expanded.scores, strict=False):  # finished sentences leave: fewer steps,
        live = ~torch.isneginf(a).all(-1)  # and -inf rows from then on (README, Decoding)
        # per-step log-probabilities reach |20|: the batch shapes differ (rows left, keys/values shared), so fp32
        # rounding differs by a few ulps of the value, hence a relative term (sequence scores above: 1e-5 absolute)
        torch.testing.assert_close(a[live], b[live], atol=1e-5, rtol=1e-5)


def test_shared_cross_attention_keeps_output_shapes(reverser):
    reverser.set_attn_implementation("eager")
    ids, mask = padded_batch(seed=4)
    out = reverser.generate(
        ids,
        attention_mask=mask,
        num_beams=4,
        max_new_tokens=4,
        return_dict_in_generate=True,
        output_attentions=True,
        output_hidden_states=True,
    )
    reverser.set_attn_implementation("sdpa")
    B, h, S = ids.shape[0], reverser.config.h, ids.shape[1]
    # one row per source, as MarianMTModel returns them (tests/test_generation_contracts.py compares with Marian)
    assert out.encoder_hidden_states[-1].shape[0] == B and out.encoder_attentions[0].shape == (B, h, S, S)
    for step in out.cross_attentions:
        for layer in step:
            assert layer.shape == (B * 4, h, 1, S)
            torch.testing.assert_close(layer.sum(-1), torch.ones(B * 4, h, 1))


def test_decoder_batch_must_be_a_multiple_of_the_encoder_batch():
    model, (ids, mask) = make_model(), padded_batch()
    memory = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state  # (3, 9, d)
    with pytest.raises(ValueError, match=r"decoder batch \(4\) must be a multiple of the encoder batch \(3\)"):
        model.model.decoder(input_ids=torch.zeros(4, 1, dtype=torch.long), encoder_hidden_states=memory)


def test_eos_ban_equals_transformers_min_length_processors():
    scores = torch.randn(6, 50)
    ids = torch.zeros(6, 4, dtype=torch.long)
    eos = torch.tensor([EOS, 7])
    pairs = [
        (MinLengthLogitsProcessor(5, eos), EosBanUntil(eos, 5)),
        (MinLengthLogitsProcessor(4, eos), EosBanUntil(eos, 4)),
        (MinNewTokensLengthLogitsProcessor(2, 3, eos), EosBanUntil(eos, 2 + 3)),
        (MinNewTokensLengthLogitsProcessor(1, 3, eos), EosBanUntil(eos, 1 + 3)),
    ]
    for theirs, ours in pairs:
        torch.testing.assert_close(ours(ids, scores.clone()), theirs(ids, scores.clone()), atol=0, rtol=0)
    # decode() swaps these processors for EosBanUntil: tests/test_decoding_loop.py's min-length cases check the
    # results against transformers' loops, which keep transformers' processors


@pytest.fixture
def small_chunks():
    """Chunks of 7 rows (vocab 50): a batch spans several, with a short last one."""
    import modeling_vaswani.loss_vaswani as loss

    before, loss.FUSED_LOSS_CHUNK = loss.FUSED_LOSS_CHUNK, 7 * 50
    yield
    loss.FUSED_LOSS_CHUNK = before


def loss_and_grads(model, fused: bool, autocast: bool = False, **kwargs):
    model.config.fused_loss = fused
    model.zero_grad()
    ids, mask = padded_batch(seed=6)
    labels = torch.randint(3, 50, (3, 8), generator=torch.Generator().manual_seed(7))
    labels[1, 5:] = -100
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=ids, attention_mask=mask, labels=labels, **kwargs)
    out.loss.backward()
    return out, {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("kwargs", [{}, {"epsilon_ls": 0.0}, {"num_items_in_batch": torch.tensor(40)}])
def test_fused_loss_matches_the_plain_loss_and_its_gradients(small_chunks, kwargs):
    """Tolerance 1e-6: the same fp32 sums in another order."""
    model = make_model(p_drop=0.0).train()
    plain, plain_grads = loss_and_grads(model, False, **kwargs)
    fused, fused_grads = loss_and_grads(model, True, **kwargs)
    assert fused.logits is None and plain.logits is not None
    torch.testing.assert_close(fused.loss, plain.loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(fused.nll_loss, plain.nll_loss, atol=1e-6, rtol=0)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, atol=1e-6, rtol=0, msg=name)


def test_fused_loss_under_bf16_autocast(small_chunks):
    """bf16 matmuls on both paths: loss within 1% of the plain bf16 loss, and the gradients (all of them, as one
    vector) no further from the fp32 gradients than 1.5 × the plain bf16 path's distance (+1e-3 relative)."""
    model = make_model(p_drop=0.0).train()
    _, reference = loss_and_grads(model, False)
    plain, plain_grads = loss_and_grads(model, False, autocast=True)
    fused, fused_grads = loss_and_grads(model, True, autocast=True)
    torch.testing.assert_close(fused.loss, plain.loss, atol=0, rtol=1e-2)

    def distance(grads):
        flat = torch.cat([(grads[n] - g).flatten() for n, g in reference.items()])
        return flat.norm() / torch.cat([g.flatten() for g in reference.values()]).norm()

    assert distance(fused_grads) <= 1.5 * distance(plain_grads) + 1e-3


@pytest.mark.parametrize("fused", [False, True])
def test_loss_backward_twice_on_a_kept_graph(small_chunks, fused):
    """The fused loss scales its saved weight gradient in place only when the graph is not kept: a second backward on
    a kept graph (retain_graph) gets the same gradients as the first, as on the plain path, and both are the plain
    path's."""
    model = make_model(p_drop=0.0).train()
    model.config.fused_loss = fused
    ids, mask = padded_batch(seed=6)
    labels = torch.randint(3, 50, (3, 8), generator=torch.Generator().manual_seed(7))
    labels[1, 5:] = -100
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    runs = []
    for retain in (True, False):
        model.zero_grad()
        (loss * 3.0).backward(retain_graph=retain)
        runs.append({name: p.grad.clone() for name, p in model.named_parameters()})
    _, plain = loss_and_grads(model, False)
    for name, grad in runs[0].items():
        torch.testing.assert_close(runs[1][name], grad, atol=0, rtol=0, msg=name)
        torch.testing.assert_close(grad, 3.0 * plain[name], atol=3e-6, rtol=0, msg=name)


def test_fused_loss_never_holds_whole_logits(small_chunks):
    """Nothing autograd saves is as large as the (tokens × vocab) logits; eval mode still returns the logits."""
    model = make_model(p_drop=0.0).train()
    model.config.fused_loss = True
    ids, mask = padded_batch()
    labels = torch.randint(3, 50, (3, 8))
    shapes = []

    def pack(tensor):
        shapes.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    assert shapes and not [s for s in shapes if s and s[-1] == 50]  # no (..., vocab) tensor: no logits, no log-probs
    with torch.no_grad():
        assert model.eval()(input_ids=ids, attention_mask=mask, labels=labels).logits.shape == (3, 8, 50)


@pytest.mark.parametrize("fused", [False, True])
def test_training_forward_is_one_graph(fused):
    """torch.compile sees the whole training forward (loss included) as one graph: no graph breaks."""
    torch._dynamo.reset()
    model = make_model(fused_loss=fused).train()
    ids, mask = padded_batch()
    labels = torch.randint(3, 50, (3, 5))
    explanation = torch._dynamo.explain(lambda: model(input_ids=ids, attention_mask=mask, labels=labels).loss)()
    torch._dynamo.reset()
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons


@pytest.mark.skipif(os.environ.get("VASWANI_TEST_COMPILE") != "1", reason="compiles (~20 s): VASWANI_TEST_COMPILE=1")
def test_compiled_fused_training_step_equals_eager():
    """fullgraph torch.compile of the fused-loss training step: loss and gradients within 1e-5 of eager."""
    model = make_model(fused_loss=True).train()
    ids, mask = padded_batch()
    labels = torch.randint(3, 50, (3, 5))
    labels[0, 3:] = -100

    def step():
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss

    eager = step()
    eager.backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    compiled = torch.compile(step, fullgraph=True)()
    compiled.backward()
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=0)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, reference[name], atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("beams", [1, 3])
def test_eos_ban_marks_scores_but_not_raw_logits(beams):
    model, (ids, mask) = make_model(), padded_batch()
    out = model.generate(ids, attention_mask=mask, num_beams=beams, min_new_tokens=3, max_new_tokens=4,
                         return_dict_in_generate=True, output_logits=True, output_scores=True)  # fmt: skip
    for step in range(3):
        assert torch.isfinite(out.logits[step][:, EOS]).all()  # what the model said, untouched
        assert (out.scores[step][:, EOS] == -math.inf).all()  # what decoding used
    assert torch.isfinite(out.scores[3][:, EOS]).all()


def assert_same_training(fast, fast_grads, plain, plain_grads, atol: float) -> None:
    torch.testing.assert_close(fast.loss, plain.loss, atol=atol, rtol=0)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(fast_grads[name], grad, atol=atol, rtol=0, msg=name)


def counted_model_and_plain_training(monkeypatch):
    """The oneDNN training calls' counter, a model whose every product may run oneDNN, and its F.linear loss/grads."""
    calls = count_onednn_training_calls(monkeypatch)
    model = make_model().train()
    for module in all_linears(model):
        module.onednn_min_macs = 0
    model.set_cpu_kernel("aten")
    return calls, model, loss_and_grads(model, False)


def count_onednn_training_calls(monkeypatch) -> list[int]:
    import modeling_vaswani.kernels_vaswani as kernels

    calls, apply = [0], kernels._OneDNNLinear.apply

    def counted(*args):
        calls[0] += 1
        return apply(*args)

    monkeypatch.setattr(kernels._OneDNNLinear, "apply", counted)
    return calls


@needs_onednn
@pytest.mark.parametrize("fused", [False, True])
def test_onednn_training_matches_f_linear(monkeypatch, fused):
    """Training with the oneDNN kernel (forward, dL/dx, dL/dW): loss and every gradient within 1e-5 of F.linear's."""
    calls = count_onednn_training_calls(monkeypatch)
    model = make_model(fused_loss=fused).train()
    for module in model.modules():
        if isinstance(module, VaswaniLinear):
            module.onednn_min_macs = 0
    results = {}
    for kernel in ("aten", "onednn"):
        model.set_cpu_kernel(kernel)
        results[kernel] = loss_and_grads(model, fused)
    assert calls[0] == 2 * (4 + 2) + 2 * (4 + 4 + 2)  # every projection but lm_head, once, with the oneDNN kernel
    (plain, plain_grads), (fast, fast_grads) = results["aten"], results["onednn"]
    assert_same_training(fast, fast_grads, plain, plain_grads, atol=1e-5)


@needs_onednn
def test_autocast_and_small_products_keep_f_linear(monkeypatch):
    calls = count_onednn_training_calls(monkeypatch)
    model = make_model().train()
    loss_and_grads(model, False)  # 64-wide layers on 24 tokens: below the 4M multiply-add bar
    for module in model.modules():
        if isinstance(module, VaswaniLinear):
            module.onednn_min_macs = 0
    loss_and_grads(model, False, autocast=True)  # bf16 autocast: F.linear, which autocast casts
    assert calls[0] == 0


@needs_onednn
@pytest.mark.parametrize("kernel", ["onednn", "int8"])
def test_fused_optimizer_steps_between_evaluations_are_seen(kernel):
    """A fused AdamW step changes weights without bumping their version counter: the eval/train switches that
    Trainer makes around its evaluations must drop the packed inference copies (lm_head never runs in a fused-loss
    training step, so only the switch can refresh it)."""
    model, (ids, mask) = make_model(fused_loss=True), padded_batch()
    for module in model.modules():
        if isinstance(module, VaswaniLinear):
            module.onednn_min_macs = 0
    decoder_ids = torch.randint(3, 50, (3, 5), generator=torch.Generator().manual_seed(2))

    def evaluate():  # no set_cpu_kernel in between: only the mode switches may refresh the copies
        with torch.no_grad():
            return model.eval()(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits

    model.set_cpu_kernel(kernel)
    before = evaluate()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
    model.train()
    model(input_ids=ids, attention_mask=mask, labels=torch.randint(3, 50, (3, 5))).loss.backward()
    optimizer.step()
    after = evaluate()
    model.set_cpu_kernel("aten")
    reference = evaluate()
    assert not torch.allclose(before, after)
    tolerance = 1e-5 if kernel == "onednn" else 0.05 * reference.abs().max().item()
    torch.testing.assert_close(after, reference, atol=tolerance, rtol=0)


def all_linears(model) -> list[VaswaniLinear]:
    return [m for m in model.modules() if isinstance(m, VaswaniLinear)]


@pytest.fixture
def fresh_kernel_table():
    """An empty table of "auto"'s choices for the test, the process's own back afterwards."""
    import modeling_vaswani.kernels_vaswani as kernels

    saved = dict(kernels._KERNEL_TABLE)
    kernels._KERNEL_TABLE.clear()
    yield kernels._KERNEL_TABLE
    kernels._KERNEL_TABLE.clear()
    kernels._KERNEL_TABLE.update(saved)


@needs_onednn
def test_auto_kernel_calibrates_each_shape_and_every_choice_matches_f_linear(fresh_kernel_table):
    """ "auto" times oneDNN and F.linear once per shape (d_in, d_out, rows bucket) on this CPU and keeps the faster;
    whatever it picks, and with the table forced to either kernel, logits stay within 1e-5 of F.linear's."""
    from modeling_vaswani.kernels_vaswani import FP32_CPU_KERNELS, cpu_isa, cpu_kernel_table

    model, (ids, mask) = make_model(), padded_batch()
    reference = logits(model, ids, mask, "aten")
    auto = logits(model, ids, mask, "auto")
    table = fresh_kernel_table
    # encoder and decoder rows: 27 and 15 (two buckets); shapes 64→64, 64→128, 128→64, the 64→50 lm_head, and the
    # stacked projections (fused_linear): Q,K,V 64→192 in both stacks, K,V 64→128 of the encoder output's 27 rows
    assert {(k[2], k[3], k[4], k[6]) for k in table} == {
        ("inference", d_in, d_out, rows)
        for rows, shapes in (
            (32, [(64, 64), (64, 128), (128, 64), (64, 192)]),
            (16, [(64, 64), (64, 128), (128, 64), (64, 50), (64, 192)]),
        )
        for d_in, d_out in shapes
    }
    assert set(table.values()) <= set(FP32_CPU_KERNELS)
    assert all(k[0] == cpu_isa() and k[1] == torch.get_num_threads() for k in table)
    assert len(cpu_kernel_table()) == len(table)
    torch.testing.assert_close(auto, reference, atol=1e-5, rtol=0)
    for forced in FP32_CPU_KERNELS:
        for key in table:
            table[key] = forced
        model.set_cpu_kernel("auto")
        torch.testing.assert_close(logits(model, ids, mask, "auto"), reference, atol=1e-5, rtol=0, msg=forced)
        ran = packed_layers(model)  # the table's choice is what ran
        assert ran == ({name for name, _ in linear_names(model)} if forced == "onednn" else set())


@needs_onednn
def test_auto_kernel_table_is_keyed_by_the_instruction_set(fresh_kernel_table, monkeypatch):
    """A oneDNN ISA cap (benchmarks' --isa) is another CPU class: its shapes are measured again, not reused. The caps
    are read once per process (as oneDNN reads its own), not on every call: a change shows after `cache_clear()`."""
    from modeling_vaswani.kernels_vaswani import cpu_isa

    model, (ids, mask) = make_model(), padded_batch()
    logits(model, ids, mask, "auto")
    first, before = set(fresh_kernel_table), cpu_isa()
    try:
        with monkeypatch.context() as patch:
            patch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
            logits(model, ids, mask, "auto")
            assert set(fresh_kernel_table) == first  # the hot path does not read the environment again
            cpu_isa.cache_clear()
            logits(model, ids, mask, "auto")
    finally:
        cpu_isa.cache_clear()
    assert len(fresh_kernel_table) == 2 * len(first)
    assert {k[0] for k in set(fresh_kernel_table) - first} == {
        f"{torch.backends.cpu.get_cpu_capability()}, oneDNN ≤ AVX2"
    }
    assert cpu_isa() == before


@needs_onednn
def test_auto_kernel_picks_the_faster_kernel(fresh_kernel_table, monkeypatch):
    """The choice follows the timing: a oneDNN kernel made 20 ms slower is never picked, for inference or training."""
    monkeypatch.setattr(VaswaniLinear, "calibrate_training", True)
    import time as time_module

    import modeling_vaswani.kernels_vaswani as kernels

    fast_linear, apply = VaswaniLinear._fast_linear, kernels._OneDNNLinear.apply

    def slow_fast_linear(self, x, kernel):
        time_module.sleep(0.02)
        return fast_linear(self, x, kernel)

    def slow_apply(*args):
        time_module.sleep(0.02)
        return apply(*args)

    monkeypatch.setattr(VaswaniLinear, "_fast_linear", slow_fast_linear)
    monkeypatch.setattr(kernels._OneDNNLinear, "apply", slow_apply)
    model, (ids, mask) = make_model(), padded_batch()
    logits(model, ids, mask, "auto")
    loss_and_grads(model.train(), False)
    assert {k[2] for k in fresh_kernel_table} == {"inference", "training"}
    assert set(fresh_kernel_table.values()) == {"aten"}


def test_int8_engine_is_timed_per_shape_and_every_choice_is_close(fresh_kernel_table):
    """ "int8" times its engines (fbgemm, oneDNN) once per shape on this CPU and keeps the faster, and the copy of
    the weight packed for the other one is dropped; whatever it picks, and with the table forced to either engine
    or to a mix of both, logits stay within the int8 tolerance (5% of the largest |logit|) of F.linear's."""
    from modeling_vaswani.kernels_vaswani import int8_engines_available

    engines = int8_engines_available()
    if len(engines) < 2:
        pytest.skip(f"one int8 engine in this torch: {engines}")
    model, (ids, mask) = make_model(), padded_batch()
    reference = logits(model, ids, mask, "aten")
    tolerance = 0.05 * reference.abs().max()
    timed = logits(model, ids, mask, "int8")
    table = fresh_kernel_table
    keys = sorted(k for k in table if k[2] == "int8")
    assert keys and {table[k] for k in keys} <= set(engines)
    assert {(k[3], k[4]) for k in keys} >= {(64, 64), (64, 128), (128, 64), (64, 50), (64, 192)}
    for layer in all_linears(model):  # each layer ran one shape: one packed copy kept, the chosen engine's
        copies = layer.__dict__.get("_packed") and layer._packed[1]
        assert not copies or len(copies) == 1, copies.keys()
    assert (timed - reference).abs().max() <= tolerance
    for forced in (*engines, "mixed"):
        for i, key in enumerate(keys):
            table[key] = engines[i % 2] if forced == "mixed" else forced
        assert (logits(model, ids, mask, "int8") - reference).abs().max() <= tolerance, forced


@needs_onednn
@pytest.mark.parametrize("budget_s, timed", [(1e9, "CALIBRATION_MAX_REPEATS"), (0.0, "CALIBRATION_REPEATS")])
def test_auto_kernel_times_short_calls_more_often(fresh_kernel_table, monkeypatch, budget_s, timed):
    """Calls shorter than the budget get more timed calls, up to CALIBRATION_MAX_REPEATS (the fastest of 3 flipped
    between runs for kernels 10% apart); calls that use up the budget get CALIBRATION_REPEATS."""
    import modeling_vaswani.kernels_vaswani as kernels

    calls, fast_linear = [], VaswaniLinear._fast_linear

    def counted(self, x, kernel):
        calls.append(x.shape)
        return fast_linear(self, x, kernel)

    monkeypatch.setattr(VaswaniLinear, "_fast_linear", counted)
    monkeypatch.setattr(kernels, "CALIBRATION_BUDGET_S", budget_s)
    assert VaswaniLinear(64, 64).eval()._calibrate("inference", 8) in ("onednn", "aten")
    assert len(calls) == 1 + getattr(kernels, timed)  # one untimed call, then the timed ones


@needs_onednn
def test_training_under_auto_is_reproducible_by_default(fresh_kernel_table):
    """By default "auto" times nothing in training: the same kernel (the instruction set's entry in
    TRAINING_KERNEL_BY_ISA) runs in every process, so a run and its resume round alike."""
    model = make_model().train()
    for module in all_linears(model):
        module.onednn_min_macs = 0
    model.set_cpu_kernel("auto")
    loss_and_grads(model, False)
    assert not any(k[2] == "training" for k in fresh_kernel_table)


def test_training_kernel_is_keyed_by_the_instruction_set(monkeypatch):
    """Training's kernel without timing comes from TRAINING_KERNEL_BY_ISA, keyed by the class oneDNN runs: its cap
    (benchmarks' --isa) where one is set, else ATen's capability; unlisted classes get F.linear."""
    import modeling_vaswani.kernels_vaswani as kernels

    assert kernels.training_isa("AVX512", None) == "AVX512"
    assert kernels.training_isa("AVX512", "avx2") == "AVX2"  # an AVX-512 machine measured as an AVX2 one
    assert kernels.training_isa("AVX512", "AVX512_CORE_VNNI") == "AVX512"
    assert kernels.training_isa("AVX512", "AVX10_1_512_AMX") == "AVX512"
    assert kernels.training_isa("AVX2", "AVX512_CORE") == "AVX2"  # a cap does not raise the CPU's class
    assert kernels.training_isa("DEFAULT", None) == "DEFAULT"
    assert kernels.TRAINING_KERNEL_BY_ISA == {"AVX512": "onednn", "AVX512 GenuineIntel": "aten", "AVX2": "aten"}
    try:
        for vendor, expected in (("AuthenticAMD", "onednn"), ("GenuineIntel", "aten"), ("", "onednn")):
            monkeypatch.setattr(kernels, "cpu_vendor", lambda vendor=vendor: vendor)  # MKL's fast code: Intel's
            monkeypatch.setattr(kernels.torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
            monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
            monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
            kernels.training_kernel.cache_clear()
            assert kernels.training_kernel() == (expected if torch.backends.mkldnn.is_available() else "aten")
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # AVX2 on either vendor: torch's matmul
            kernels.training_kernel.cache_clear()
            assert kernels.training_kernel() == "aten"
        monkeypatch.undo()
        for limit, expected in (("AVX2", "aten"), ("SSE41", "aten")):
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", limit)
            kernels.training_kernel.cache_clear()
            assert kernels.training_kernel() == expected
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
        monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
        kernels.training_kernel.cache_clear()
        isa = torch.backends.cpu.get_cpu_capability()
        table = kernels.TRAINING_KERNEL_BY_ISA
        native = table.get(f"{isa} {kernels.cpu_vendor()}", table.get(isa, "aten"))
        assert kernels.training_kernel() == (native if torch.backends.mkldnn.is_available() else "aten")
    finally:
        monkeypatch.undo()
        kernels.training_kernel.cache_clear()


@needs_onednn
@pytest.mark.parametrize("table", ["onednn", "aten"])
def test_training_under_auto_runs_the_tables_kernel(monkeypatch, fresh_kernel_table, table):
    """Without `calibrate_training`, every training product under "auto" runs `training_kernel()`'s choice (lm_head:
    F.linear always), times nothing, and gives F.linear's loss and gradients within 1e-5."""
    import modeling_vaswani.kernels_vaswani as kernels

    calls, model, (plain, plain_grads) = counted_model_and_plain_training(monkeypatch)
    monkeypatch.setattr(kernels, "training_kernel", lambda: table)
    model.set_cpu_kernel("auto")
    fast, fast_grads = loss_and_grads(model, False)
    assert calls[0] == (2 * (4 + 2) + 2 * (4 + 4 + 2) if table == "onednn" else 0)
    assert not fresh_kernel_table
    assert_same_training(fast, fast_grads, plain, plain_grads, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize("forced", ["onednn", "aten"])
def test_auto_kernel_in_training_matches_f_linear(monkeypatch, fresh_kernel_table, forced):
    """Training under "auto" runs the table's choice per shape (forward, dL/dx, dL/dW); loss and every gradient within
    1e-5 of F.linear's whichever kernel the table names."""
    monkeypatch.setattr(VaswaniLinear, "calibrate_training", True)
    calls, model, (plain, plain_grads) = counted_model_and_plain_training(monkeypatch)
    model.set_cpu_kernel("auto")
    loss_and_grads(model, False)  # calibrates every training shape
    assert {k[2] for k in fresh_kernel_table} == {"training"}
    for key in fresh_kernel_table:
        fresh_kernel_table[key] = forced
    calls[0] = 0
    fast, fast_grads = loss_and_grads(model, False)
    assert calls[0] == (2 * (4 + 2) + 2 * (4 + 4 + 2) if forced == "onednn" else 0)  # lm_head: F.linear always
    assert_same_training(fast, fast_grads, plain, plain_grads, atol=1e-5)


def test_max_indices_are_argmax():
    """Greedy search takes max(-1).indices (faster on CPU) for argmax(-1): the same index, the first of tied maxima,
    and NaN counted as the maximum, at the decoding loop's sizes and at odd ones."""
    g = torch.Generator().manual_seed(0)
    for rows, vocab in ((32, 37000), (3, 50), (5, 17), (1, 1)):
        scores = torch.randn(rows, vocab, generator=g)
        scores[:, vocab // 3 :: 7] = scores.amax(-1, keepdim=True).clone()  # ties at the maximum
        scores[0, vocab // 2] = float("inf")
        if rows > 2:
            scores[1, vocab - 1] = float("nan")
            scores[2] = float("-inf")
        assert torch.equal(scores.max(-1).indices, scores.argmax(-1))


def test_beam_topk_is_the_flat_topk():
    """Beam search's two-stage top-k (each beam's k best, then the sentence's k best of those) gives the scores and
    flattened indices of torch.topk over all (beam score + log-probability) sums, -inf bans and equal beam scores
    included."""
    from modeling_vaswani.generation_vaswani import beam_topk

    g = torch.Generator().manual_seed(0)
    for n, nb, V, k in ((32, 4, 37000, 8), (3, 4, 50, 8), (2, 1, 7, 2), (5, 3, 4, 6), (2, 4, 9, 9)):
        log_probs = torch.randn(n, nb, V, generator=g).log_softmax(-1)
        log_probs[0, :, : V // 2] = -math.inf  # banned tokens
        beam_scores = torch.randn(n, nb, generator=g) * 3
        beam_scores[-1] = beam_scores[-1, 0]  # one sentence's beams tie
        flat_scores, flat_idx = torch.topk((log_probs + beam_scores[:, :, None]).view(n, nb * V), k)
        scores, idx = beam_topk(log_probs, beam_scores, k)
        assert torch.equal(scores, flat_scores)
        assert torch.equal(idx, flat_idx), (n, nb, V, k)
