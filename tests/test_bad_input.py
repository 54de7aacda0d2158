"""Bad inputs and bad configs fail early with a ValueError that names the problem; long inputs still work."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration

VOCAB = 99
TINY = dict(vocab_size=VOCAB, d_model=16, d_ff=32, h=2, encoder_layers=2, decoder_layers=2)
REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model() -> VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    return VaswaniForConditionalGeneration(VaswaniConfig(**TINY)).eval()


@pytest.fixture(scope="module")
def src() -> torch.Tensor:
    return torch.tensor([[5, 6, 7, 2], [8, 9, 2, 1]])


@pytest.fixture(scope="module")
def tgt() -> torch.Tensor:
    return torch.tensor([[0, 5, 6, 7], [0, 8, 9, 2]])


@pytest.fixture
def calls(model):
    """Names of the embedding/layer modules that ran during the test (forward pre-hooks)."""
    ran: list[str] = []
    watched = {
        "encoder": [model.model.encoder.embed_tokens, *model.model.encoder.layers],
        "decoder": [model.model.decoder.embed_tokens, *model.model.decoder.layers],
    }
    handles = [
        module.register_forward_pre_hook(lambda *_, stack=stack: ran.append(stack))
        for stack, modules in watched.items()
        for module in modules
    ]
    yield ran
    for handle in handles:
        handle.remove()


# ---- token ids out of range ----


@pytest.mark.parametrize("bad", [-1, -100, VOCAB, VOCAB + 1000], ids=lambda v: f"id={v}")
def test_input_ids_out_of_range(model, src, tgt, calls, bad):
    """Checked at the top of the encoder: no embedding lookup or layer has run."""
    ids = src.clone()
    ids[1, 1] = bad
    with pytest.raises(ValueError, match=rf"input_ids holds token id {bad}, outside \[0, vocab_size={VOCAB}\)"):
        model(input_ids=ids, decoder_input_ids=tgt)
    assert calls == []


@pytest.mark.parametrize("bad", [-1, VOCAB], ids=lambda v: f"id={v}")
def test_decoder_input_ids_out_of_range(model, src, tgt, calls, bad):
    """Checked at the top of the decoder: no decoder embedding lookup or layer has run."""
    ids = tgt.clone()
    ids[0, 2] = bad
    with pytest.raises(ValueError, match=rf"decoder_input_ids holds token id {bad}, outside \[0, vocab_size={VOCAB}\)"):
        model(input_ids=src, decoder_input_ids=ids)
    assert "decoder" not in calls


def test_generate_rejects_bad_input_ids(model, src):
    ids = src.clone()
    ids[0, 0] = VOCAB
    with pytest.raises(ValueError, match="input_ids holds token id"):
        model.generate(ids, max_new_tokens=2)


def test_labels_minus_100_is_allowed(model, src):
    labels = torch.tensor([[5, 6, 2, -100], [8, -100, 9, 2]])
    loss = model(input_ids=src, labels=labels).loss
    assert torch.isfinite(loss)


@pytest.mark.parametrize("position", [1, 3], ids=["middle", "last"])
@pytest.mark.parametrize("bad", [-5, VOCAB], ids=lambda v: f"id={v}")
def test_labels_out_of_range(model, src, calls, bad, position):
    """A label other than -100 outside [0, vocab) is a ValueError naming labels (not the shifted decoder inputs)."""
    labels = torch.tensor([[5, 6, 7, 2], [8, 9, 10, 2]])
    labels[0, position] = bad
    with pytest.raises(ValueError, match=rf"labels holds token id {bad}, outside \[0, vocab_size={VOCAB}\)"):
        model(input_ids=src, labels=labels)
    assert calls == []


def test_labels_out_of_range_with_decoder_input_ids(model, src, tgt):
    labels = torch.tensor([[5, 6, 7, 2], [8, 9, 2, VOCAB]])
    with pytest.raises(ValueError, match=rf"labels holds token id {VOCAB}, outside \[0, vocab_size={VOCAB}\)"):
        model(input_ids=src, decoder_input_ids=tgt, labels=labels)


@pytest.mark.parametrize("shape", [(0, 4), (2, 0)], ids=str)
def test_empty_labels(model, src, shape):
    with pytest.raises(ValueError, match=r"labels must be a non-empty \(batch, length\) tensor"):
        model(input_ids=src, labels=torch.zeros(shape, dtype=torch.long))


def test_labels_shape_mismatch(model, src, tgt):
    with pytest.raises(ValueError, match=r"labels have shape \(2, 3\), expected \(2, 4\)"):
        model(input_ids=src, decoder_input_ids=tgt, labels=tgt[:, 1:])


# ---- shapes ----


@pytest.mark.parametrize("shape", [(2, 3), (2, 5), (1, 4), (3, 4)], ids=str)
def test_attention_mask_shape_mismatch(model, src, tgt, calls, shape):
    mask = torch.ones(shape, dtype=torch.long)
    expected = re.escape(f"attention mask of input_ids has shape {shape}, expected (2, 4)")
    with pytest.raises(ValueError, match=expected):
        model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt)
    assert calls == []


@pytest.mark.parametrize("mask", [[1, 1, 1, 1], [1, 1, 0, 0]], ids=["ones", "padded"])
def test_attention_mask_one_dimensional(model, src, tgt, mask):
    with pytest.raises(ValueError, match=r"attention.mask"):
        model(input_ids=src, attention_mask=torch.tensor(mask), decoder_input_ids=tgt)


@pytest.mark.parametrize("shape", [(2, 2), (1, 4), (3, 4)], ids=str)
def test_decoder_attention_mask_shape_mismatch(model, src, tgt, shape):
    with pytest.raises(ValueError, match=r"attention.mask"):
        model(input_ids=src, decoder_input_ids=tgt, decoder_attention_mask=torch.ones(shape, dtype=torch.long))


@pytest.mark.parametrize("shape", [(0, 4), (2, 0), (0, 0), (4,)], ids=str)
def test_empty_or_malformed_input_ids(model, tgt, calls, shape):
    """0 rows, 0 columns or a 1-D tensor: rejected, naming input_ids and the shape."""
    ids = torch.full(shape, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"input_ids must be a non-empty \(batch, length\) tensor, got shape"):
        model(input_ids=ids, decoder_input_ids=tgt[: max(ids.shape[0], 1)])
    assert calls == []


@pytest.mark.parametrize("shape", [(0, 4), (2, 0)], ids=str)
def test_empty_decoder_input_ids(model, src, shape):
    with pytest.raises(ValueError, match=r"decoder_input_ids must be a non-empty \(batch, length\) tensor"):
        model(input_ids=src, decoder_input_ids=torch.zeros(shape, dtype=torch.long))


def test_empty_batch_in_generate(model):
    with pytest.raises(ValueError, match="input_ids must be a non-empty"):
        model.generate(torch.zeros(0, 4, dtype=torch.long), max_new_tokens=2)


# ---- config ----


@pytest.mark.parametrize("field", ["vocab_size", "d_model", "d_ff", "h", "encoder_layers", "decoder_layers"])
@pytest.mark.parametrize("value", [0, -1])
def test_config_non_positive_size(field, value):
    with pytest.raises(ValueError, match=rf"VaswaniConfig\.{field} must be a positive integer, got {value}"):
        VaswaniConfig(**{**TINY, field: value})


@pytest.mark.parametrize(("d_model", "h"), [(16, 3), (10, 4), (512, 7)])
def test_config_d_model_not_divisible_by_h(d_model, h):
    with pytest.raises(ValueError, match=rf"d_model \({d_model}\) must be divisible by VaswaniConfig\.h \({h}\)"):
        VaswaniConfig(**{**TINY, "d_model": d_model, "h": h})


@pytest.mark.parametrize("field", ["p_drop", "attention_dropout", "activation_dropout", "label_smoothing"])
@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_config_rate_outside_unit_interval(field, value):
    with pytest.raises(ValueError, match=rf"VaswaniConfig\.{field} must be in \[0, 1\), got {value}"):
        VaswaniConfig(**{**TINY, field: value})


@pytest.mark.parametrize("field", ["p_drop", "attention_dropout", "activation_dropout", "label_smoothing"])
@pytest.mark.parametrize("value", [0.0, 0.999])
def test_config_rate_inside_unit_interval_is_accepted(field, value):
    assert getattr(VaswaniConfig(**{**TINY, field: value}), field) == value


@pytest.mark.parametrize("activation", ["swish", "RELU", ""])
def test_config_unknown_activation(activation):
    with pytest.raises(ValueError, match=r"VaswaniConfig\.activation_function must be one of"):
        VaswaniConfig(**{**TINY, "activation_function": activation})


def test_config_from_json_is_validated(tmp_path):
    """A bad config.json is rejected on load, not only in the constructor."""
    VaswaniConfig(**TINY).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "h": 3}))
    with pytest.raises(ValueError, match=r"must be divisible by VaswaniConfig\.h \(3\)"):
        VaswaniConfig.from_pretrained(tmp_path)


# ---- generate ----


def test_generate_unknown_length_penalty_rule(model, src, calls):
    with pytest.raises(ValueError, match=r"length_penalty_rule must be 'gnmt' or 'transformers', got 'bogus'"):
        model.generate(src, length_penalty_rule="bogus")
    assert calls == []


# ---- long inputs ----


def test_source_of_2000_tokens(model):
    """Positions are computed, not looked up: far past any training length, forward and a 1-step generate work."""
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(3, VOCAB, (1, 2000), generator=generator)
    with torch.no_grad():
        out = model(input_ids=src, decoder_input_ids=torch.tensor([[0, 5, 6]]))
    assert out.logits.shape == (1, 3, VOCAB)
    assert out.encoder_last_hidden_state.shape == (1, 2000, TINY["d_model"])
    assert torch.isfinite(out.encoder_last_hidden_state).all() and torch.isfinite(out.logits).all()
    generated = model.generate(src, max_new_tokens=1)
    assert generated.shape == (1, 2)
    assert generated[0, 0] == model.config.decoder_start_token_id


def test_checks_keep_no_state_on_the_model(model, src, tgt):
    """A refused batch leaves nothing behind on any module (no deferred flags): the next good call runs as before."""
    before = {name: set(vars(module)) for name, module in model.named_modules()}
    bad = src.clone()
    bad[0, 0] = VOCAB
    with torch.no_grad():
        reference = model(input_ids=src, decoder_input_ids=tgt).logits
    for grad in (False, True):
        with torch.set_grad_enabled(grad), pytest.raises(ValueError, match="input_ids holds token id"):
            model(input_ids=bad, decoder_input_ids=tgt)
    assert {name: set(vars(module)) for name, module in model.named_modules()} == before
    with torch.no_grad():
        assert torch.equal(model(input_ids=src, decoder_input_ids=tgt).logits, reference)


# ---- accelerator: checked outside autograd; a training step's batch is checked by the collator (tests/test_batching.py)

CUDA_CHILD = textwrap.dedent(
    """
    import json, sys
    import torch
    from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration

    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig(**json.loads(sys.argv[1]))).cuda()
    good = torch.tensor([[5, 6, 7, 2]], device="cuda")
    steps = []

    def run(name, fn):
        try:
            value = fn()
            torch.cuda.synchronize()  # a device-side assert would surface here
            steps.append([name, "ok", value])
        except Exception as err:
            steps.append([name, type(err).__name__, str(err)[:300]])

    def inference(ids):
        with torch.no_grad():
            return model.eval()(input_ids=ids, decoder_input_ids=good).logits.isfinite().all().item()

    def evaluation_loss(ids, labels):
        with torch.no_grad():
            return model.eval()(input_ids=ids, labels=labels).loss.isfinite().item()

    def generate(ids):
        return model.eval().generate(ids, max_new_tokens=3).shape[0]

    def train_step(ids, labels):
        model.train().zero_grad()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        return loss.isfinite().item()

    for bad in json.loads(sys.argv[2]):
        bad_ids = good.clone()
        bad_ids[0, 2] = bad
        run(f"inference {bad}", lambda: inference(bad_ids))
        run(f"labels {bad}", lambda: evaluation_loss(good, bad_ids))
        run(f"generate {bad}", lambda: generate(bad_ids))
        run(f"train after {bad}", lambda: train_step(good, good))
        run(f"inference after {bad}", lambda: inference(good))
    print(json.dumps(steps))
    """
)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bad_ids_value_error_not_device_assert():
    """On CUDA outside autograd (inference, evaluation loss, generate): a ValueError at once, never a device-side
    assert, and the process's CUDA context stays usable for training and inference.

    Run in a child process: a device-side assert would leave this process's CUDA context unusable.
    """
    bad_values = [-1, VOCAB]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, "-c", CUDA_CHILD, json.dumps(TINY), json.dumps(bad_values)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    steps = {name: (outcome, detail) for name, outcome, detail in json.loads(proc.stdout.strip().splitlines()[-1])}
    for bad in bad_values:
        for step, name in (("inference", "input_ids"), ("labels", "labels"), ("generate", "input_ids")):
            outcome, detail = steps[f"{step} {bad}"]
            assert outcome == "ValueError" and re.search(rf"{name} holds token id {bad}\b", detail), (step, detail)
        assert steps[f"train after {bad}"] == ("ok", True), steps
        assert steps[f"inference after {bad}"] == ("ok", True), steps
