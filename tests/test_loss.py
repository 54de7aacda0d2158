"""The training loss: label smoothing ε_ls (§5.4) against its definition, the plain NLL, shifting, normalisation."""

import pytest
import torch
import torch.nn.functional as F

from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration

PAD, START = 1, 0


@pytest.fixture(scope="module")
def model() -> VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    config = VaswaniConfig(vocab_size=30, d_model=16, d_ff=32, h=2, encoder_layers=1, decoder_layers=1, p_drop=0.0)
    return VaswaniForConditionalGeneration(config).eval()


def inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    src = torch.randint(3, 30, (4, 6), generator=g)
    labels = torch.randint(3, 30, (4, 5), generator=g)
    labels[1, 3:] = -100
    labels[3, 1:] = -100
    return {"input_ids": src, "attention_mask": torch.ones_like(src), "labels": labels}


def smoothed_by_definition(logits: torch.Tensor, labels: torch.Tensor, eps: float) -> torch.Tensor:
    """Cross-entropy against q = (1 - ε)·onehot(y) + ε/V (Szegedy et al., 2016), averaged over kept tokens."""
    V = logits.shape[-1]
    keep = labels.ne(-100)
    q = torch.full(logits.shape, eps / V, dtype=torch.float64)
    q[keep] += (1 - eps) * F.one_hot(labels[keep], V).double()
    per_token = -(q * logits.double().log_softmax(-1)).sum(-1)
    return per_token[keep].mean()


@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_label_smoothed_loss_matches_its_definition(model, eps):
    expected = smoothed_by_definition(model(**inputs()).logits, inputs()["labels"], eps)
    assert model(**inputs(), epsilon_ls=eps).loss.item() == pytest.approx(expected.item(), rel=1e-5)
    model.config.label_smoothing = eps  # a config that asks for smoothing gets it too
    try:
        assert model(**inputs()).loss.item() == pytest.approx(expected.item(), rel=1e-5)
    finally:
        model.config.label_smoothing = 0.0


def test_loss_is_plain_cross_entropy_by_default_and_nll_is_returned(model):
    """As every transformers model: `loss` is the cross-entropy against `labels` (tests/test_generation_contracts.py
    checks it against MarianMTModel too); the paper's ε_ls belongs to the training recipe."""
    batch = inputs()
    out = model(**batch)
    nll = F.cross_entropy(out.logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
    assert model.config.label_smoothing == 0.0
    assert out.loss.item() == pytest.approx(nll.item(), rel=1e-6)
    assert out.nll_loss.item() == pytest.approx(nll.item(), rel=1e-6)
    smoothed = model(**batch, epsilon_ls=0.1)
    assert smoothed.nll_loss.item() == pytest.approx(nll.item(), rel=1e-6)  # nll_loss stays the plain NLL
    assert smoothed.loss.item() != pytest.approx(nll.item(), rel=1e-3)


def test_labels_are_shifted_right_into_decoder_inputs(model):
    batch = inputs()
    shifted = model.prepare_decoder_input_ids_from_labels(batch["labels"])
    assert torch.equal(shifted[:, 0], torch.full((4,), START))
    expected = batch["labels"][:, :-1].masked_fill(batch["labels"][:, :-1].eq(-100), PAD)
    assert torch.equal(shifted[:, 1:], expected)
    explicit = model(**{k: v for k, v in batch.items() if k != "labels"}, decoder_input_ids=shifted)
    assert torch.equal(model(**batch).logits, explicit.logits)


def test_num_items_in_batch_normalises_over_accumulated_tokens(model):
    """Trainer passes the target-token count of all accumulation steps; the loss is then a sum over that count."""
    batch = inputs()
    n_tokens = int(batch["labels"].ne(-100).sum())
    mean = model(**batch).loss
    summed = model(**batch, num_items_in_batch=torch.tensor(4 * n_tokens)).loss
    assert summed.item() == pytest.approx(mean.item() / 4, rel=1e-6)


def test_loss_backpropagates_into_the_shared_matrix(model):
    model.zero_grad()
    model(**inputs()).loss.backward()
    grad = model.model.shared.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    model.zero_grad()
