"""Where the paper's ε_ls = 0.1 (§5.4) lives: Trainer's `label_smoothing_factor`, not the model's default loss.

- transformers' own `Seq2SeqTrainer` with `label_smoothing_factor=0.1` trains our model, fused loss switched on or
  not: its `LabelSmoother` sees the logits of a call without labels;
- `VaswaniTrainer` (the recipe's path, training/trainer/trainer.py) hands ε_ls to the model's own loss, fused or not, and gets
  the same loss and the same gradients as `LabelSmoother`, normalised by `num_items_in_batch` alike.
"""

import math

import pytest
import torch
from transformers import Seq2SeqTrainer, default_data_collator

from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from training.trainer.trainer import VaswaniTrainer

from tiny_runs import cpu_trainer_args

EPS = 0.1


def make_model(fused: bool) -> VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    config = VaswaniConfig(vocab_size=40, d_model=16, d_ff=32, h=2, encoder_layers=1, decoder_layers=1, p_drop=0.0)
    config.fused_loss = fused
    return VaswaniForConditionalGeneration(config).train()


def batch(model: VaswaniForConditionalGeneration) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    src = torch.randint(3, 40, (4, 6), generator=g)
    labels = torch.randint(3, 40, (4, 5), generator=g)
    labels[1, 3:] = -100
    labels[3, 1:] = -100
    return {
        "input_ids": src,
        "attention_mask": torch.ones_like(src),
        "labels": labels,
        # what DataCollatorForSeq2Seq(model=...) adds: Trainer's LabelSmoother pops the labels before the forward
        "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels),
    }


def loss_and_grads(trainer, model, inputs, num_items: int) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad()
    loss = trainer.compute_loss(model, dict(inputs), num_items_in_batch=torch.tensor(num_items))
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("fused", [True, False])
def test_recipe_path_equals_trainers_label_smoother(tmp_path, fused, one_thread):
    model = make_model(fused)
    inputs = batch(model)
    n = 2 * int(inputs["labels"].ne(-100).sum())  # as if this were one of two accumulation steps
    args = cpu_trainer_args(tmp_path, label_smoothing_factor=EPS, warmup_steps=4)
    plain = Seq2SeqTrainer(model=model, args=args)
    ours = VaswaniTrainer(model=model, args=args, max_tokens=64)
    assert plain.label_smoother is not None and ours.label_smoother is None
    expected, expected_grads = loss_and_grads(plain, model, inputs, n)
    got, grads = loss_and_grads(ours, model, inputs, n)
    assert got == pytest.approx(expected, rel=1e-5)
    for a, b in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    with torch.no_grad():  # and it is smoothing: the model's own default loss is the plain cross-entropy
        assert model.eval()(**inputs).loss.item() != pytest.approx(expected, rel=1e-3)


def test_plain_seq2seq_trainer_trains_the_fused_model(tmp_path, one_thread):
    model = make_model(fused=True)
    g = torch.Generator().manual_seed(3)
    rows = []
    for _ in range(16):
        labels = torch.randint(3, 40, (1, 4), generator=g)
        rows.append({
            "input_ids": torch.randint(3, 40, (6,), generator=g),
            "labels": labels[0],
            "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels)[0],
        })  # fmt: skip
    args = cpu_trainer_args(tmp_path, label_smoothing_factor=EPS, max_steps=3, per_device_train_batch_size=4)
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=rows, data_collator=default_data_collator)
    before = [p.detach().clone() for p in model.parameters()]
    result = trainer.train()
    assert result.global_step == 3 and torch.isfinite(torch.tensor(result.training_loss))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_logged_nll_is_per_target_token_and_equals_the_loss_without_smoothing(tmp_path, one_thread):
    """With ε_ls = 0 the logged NLL is the loss Trainer logs, one step a log and two accumulation steps: the NLL is
    summed over target tokens by `VaswaniTrainer`, not scaled by a copy of Trainer's loss-scaling rule."""
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq

    from training.data.tokenizer import train_tokenizer

    model = make_model(fused=False)
    tokenizer = train_tokenizer(["a b c d e f g h"] * 20, vocab_size=40)
    g = torch.Generator().manual_seed(4)
    rows = {"input_ids": [], "labels": [], "src_len": [], "tgt_len": []}
    for i in range(24):
        src = torch.randint(4, 40, (3 + i % 5,), generator=g).tolist()
        tgt = torch.randint(4, 40, (2 + i % 7,), generator=g).tolist()
        rows["input_ids"].append(src)
        rows["labels"].append(tgt)
        rows["src_len"].append(len(src))
        rows["tgt_len"].append(len(tgt))
    args = cpu_trainer_args(
        tmp_path, label_smoothing_factor=0.0, max_steps=4, gradient_accumulation_steps=2, warmup_steps=2
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    trainer = VaswaniTrainer(
        model=model, args=args, train_dataset=Dataset.from_dict(rows), data_collator=collator, max_tokens=40
    )
    trainer.train()
    logged = [row for row in trainer.state.log_history if "loss" in row and "nll" in row]
    assert len(logged) == 4
    for row in logged:
        assert row["nll"] == pytest.approx(row["loss"], abs=2e-4)  # both rounded to 4 decimals
        assert row["ppl"] == pytest.approx(math.exp(row["nll"]), rel=1e-3)
