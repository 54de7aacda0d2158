"""The §5.3 learning-rate schedule: the formula, the scheduler's step convention, and a real Seq2SeqTrainer run."""

import math

import datasets
import pytest
import torch
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback

from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from training.trainer.schedule import PaperScheduleTrainerMixin, get_paper_schedule, paper_lrate

from tiny_runs import cpu_trainer_args


def formula(step: int, d_model: int, warmup: int) -> float:
    """§5.3, written out again: lrate = d_model^-0.5 · min(step_num^-0.5, step_num · warmup_steps^-1.5)."""
    return (1 / math.sqrt(d_model)) * min(1 / math.sqrt(step), step / warmup / math.sqrt(warmup))


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (1, 512**-0.5 * 4000**-1.5),  # 1.7469e-07: the first step
        (100, 100 * 512**-0.5 * 4000**-1.5),  # still warming up: linear in the step
        (4000, 6.987712429686844e-04),  # the peak, (512 · 4000)^-0.5
        (10000, 4.419417382415922e-04),  # 512^-0.5 / 100
        (100000, 1.397542485937369e-04),  # the base model's last step
    ],
)
def test_paper_lrate_at_several_steps(step, expected):
    assert paper_lrate(step, 512, 4000) == pytest.approx(expected, rel=1e-12)
    assert paper_lrate(step, 512, 4000) == pytest.approx(formula(step, 512, 4000), rel=1e-12)


def test_paper_lrate_rises_linearly_to_the_peak_at_warmup_then_falls_as_inverse_sqrt():
    d, w = 512, 4000
    assert paper_lrate(w, d, w) > paper_lrate(w - 1, d, w)
    assert paper_lrate(w, d, w) > paper_lrate(w + 1, d, w)
    for k in (1, 7, 1234, w):
        assert paper_lrate(k, d, w) / k == pytest.approx(paper_lrate(1, d, w), rel=1e-12)
    for k in (w, 4321, 99999):
        assert paper_lrate(k, d, w) * math.sqrt(k) == pytest.approx(d**-0.5, rel=1e-12)
    assert paper_lrate(20000, 1024, w) == pytest.approx(paper_lrate(20000, 512, w) / math.sqrt(2), rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step_num": 0, "d_model": 512, "warmup_steps": 4000}, "step_num counts optimizer steps from 1"),
        ({"step_num": 1, "d_model": 512, "warmup_steps": 0}, "warmup_steps must be a positive integer"),
        ({"step_num": 1, "d_model": 512, "warmup_steps": -5}, "warmup_steps must be a positive integer"),
        ({"step_num": 1, "d_model": 0, "warmup_steps": 4000}, "d_model must be a positive integer"),
    ],
)
def test_paper_lrate_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        paper_lrate(**kwargs)


def optimizer_with_lr(lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def test_scheduler_gives_step_k_the_lrate_of_step_k():
    optimizer = optimizer_with_lr(1.0)
    scheduler = get_paper_schedule(optimizer, d_model=64, warmup_steps=4)
    used = []
    for _ in range(9):  # Trainer's order: optimizer.step() with the current lr, then scheduler.step()
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert used == pytest.approx([formula(k, 64, 4) for k in range(1, 10)], rel=1e-12)
    assert used[3] == max(used)  # the peak at step_num = warmup_steps


def test_base_lr_and_scale_multiply_the_formula():
    optimizer = optimizer_with_lr(0.5)
    scheduler = get_paper_schedule(optimizer, d_model=64, warmup_steps=4, scale=2.0)
    for k in range(1, 7):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * 2.0 * formula(k, 64, 4), rel=1e-12)
        optimizer.step()
        scheduler.step()


def test_scheduler_resumes_from_its_state_dict_at_the_next_step():
    optimizer = optimizer_with_lr(1.0)
    scheduler = get_paper_schedule(optimizer, d_model=64, warmup_steps=4)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    saved_optimizer, saved_scheduler = optimizer.state_dict(), scheduler.state_dict()
    resumed_optimizer = optimizer_with_lr(1.0)  # as Trainer resumes: fresh objects, then both state dicts
    resumed = get_paper_schedule(resumed_optimizer, d_model=64, warmup_steps=4)
    resumed_optimizer.load_state_dict(saved_optimizer)
    resumed.load_state_dict(saved_scheduler)
    assert resumed_optimizer.param_groups[0]["lr"] == pytest.approx(formula(6, 64, 4), rel=1e-12)
    resumed_optimizer.step()
    resumed.step()
    assert resumed_optimizer.param_groups[0]["lr"] == pytest.approx(formula(7, 64, 4), rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"d_model": 64, "warmup_steps": 0}, "warmup_steps must be a positive integer"),
        ({"d_model": -1, "warmup_steps": 4}, "d_model must be a positive integer"),
        ({"d_model": 64, "warmup_steps": 4, "scale": 0.0}, "scale must be a positive number"),
    ],
)
def test_get_paper_schedule_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        get_paper_schedule(optimizer_with_lr(1.0), **kwargs)


# ---- under a real Seq2SeqTrainer ----


class PaperTrainer(PaperScheduleTrainerMixin, Seq2SeqTrainer):
    pass


class LearningRateSeen(TrainerCallback):
    """The learning rate in the optimizer just before each optimizer step: the one that step uses."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.lrs.append(optimizer.param_groups[0]["lr"])


def tiny_model() -> VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    config = VaswaniConfig(vocab_size=30, d_model=16, d_ff=32, h=2, encoder_layers=1, decoder_layers=1, p_drop=0.0)
    return VaswaniForConditionalGeneration(config)


def tiny_dataset(rows: int = 12) -> datasets.Dataset:
    g = torch.Generator().manual_seed(1)
    return datasets.Dataset.from_dict(
        {
            "input_ids": torch.randint(3, 30, (rows, 5), generator=g).tolist(),
            "attention_mask": [[1] * 5] * rows,
            "labels": torch.randint(3, 30, (rows, 4), generator=g).tolist(),
        }
    )


def training_args(tmp_path, **overrides) -> Seq2SeqTrainingArguments:
    settings = {
        "per_device_train_batch_size": 2,
        "max_steps": 6,
        "learning_rate": 1.0,  # the multiplier of the formula: 1.0 is the paper
        "adam_beta1": 0.9,
        "adam_beta2": 0.98,
        "adam_epsilon": 1e-9,
        **overrides,
    }
    return cpu_trainer_args(tmp_path, **settings)


def test_seq2seq_trainer_logs_and_uses_the_paper_lrate_at_every_step(tmp_path):
    seen = LearningRateSeen()
    trainer = PaperTrainer(
        model=tiny_model(),
        args=training_args(tmp_path),
        train_dataset=tiny_dataset(),
        callbacks=[seen],
        warmup_steps=4,
    )
    assert trainer.d_model == 16  # from the model's config
    trainer.train()
    expected = [formula(k, 16, 4) for k in range(1, 7)]
    logged = {r["step"]: r["learning_rate"] for r in trainer.state.log_history if "learning_rate" in r}
    assert sorted(logged) == [1, 2, 3, 4, 5, 6]
    assert [logged[k] for k in range(1, 7)] == pytest.approx(expected, rel=1e-12)
    assert seen.lrs == pytest.approx(expected, rel=1e-12)
    assert isinstance(trainer.lr_scheduler, torch.optim.lr_scheduler.LambdaLR)
    assert trainer.optimizer.param_groups[0]["betas"] == (0.9, 0.98)
    assert trainer.optimizer.param_groups[0]["eps"] == 1e-9


def test_trainer_learning_rate_scales_the_schedule_and_warmup_can_come_from_training_arguments(tmp_path):
    seen = LearningRateSeen()
    trainer = PaperTrainer(
        model=tiny_model(),
        args=training_args(tmp_path, learning_rate=2.0, warmup_steps=3, max_steps=5),
        train_dataset=tiny_dataset(),
        callbacks=[seen],
        d_model=512,  # an explicit d_model wins over the model's
    )
    assert trainer.warmup_steps == 3 and trainer.d_model == 512
    trainer.train()
    assert seen.lrs == pytest.approx([2.0 * formula(k, 512, 3) for k in range(1, 6)], rel=1e-12)


@pytest.mark.parametrize(
    ("arg_overrides", "mixin_kwargs", "message"),
    [
        ({}, {}, "needs warmup_steps as a whole number of steps"),
        ({"warmup_steps": 0.1}, {}, "needs warmup_steps as a whole number of steps"),
        ({}, {"warmup_steps": 0}, "warmup_steps must be a positive integer"),
        ({"warmup_steps": 10}, {"warmup_steps": 4}, "contradicts TrainingArguments.warmup_steps=10"),
        ({}, {"warmup_steps": 4, "d_model": 0}, "d_model must be a positive integer"),
    ],
)
def test_the_trainer_refuses_a_schedule_that_contradicts_itself(tmp_path, arg_overrides, mixin_kwargs, message):
    with pytest.raises(ValueError, match=message):
        PaperTrainer(model=tiny_model(), args=training_args(tmp_path, **arg_overrides), **mixin_kwargs)
