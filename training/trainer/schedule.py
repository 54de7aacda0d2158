"""The learning-rate schedule of §5.3, as a PyTorch scheduler that plugs into `Trainer`.

§5.3: "We varied the learning rate over the course of training, according to the formula

    lrate = d_model^-0.5 · min(step_num^-0.5, step_num · warmup_steps^-1.5)

This corresponds to increasing the learning rate linearly for the first warmup_steps training steps, and
decreasing it thereafter proportionally to the inverse square root of the step number. We used
warmup_steps = 4000." step_num counts optimizer steps from 1.

Why this is written here: transformers' closest built-in, `get_inverse_sqrt_schedule` ("inverse_sqrt"), is one
step behind the paper (its multiplier at the k-th optimizer step is (k-1)/warmup, so the first step has learning
rate 0 and every later step gets the paper's value for step k-1) and leaves the peak d_model^-0.5 · warmup^-0.5
to be worked out by hand as the base learning rate. The scheduler below gives the paper's value at every step.

How it plugs into `Trainer` (see `PaperScheduleTrainerMixin`): Trainer creates the scheduler once the optimizer
exists (`create_scheduler`), reads the learning rate for its logs after `optimizer.step()` and calls
`lr_scheduler.step()` after every optimizer step. A `LambdaLR` created with `last_epoch=-1` sets the learning
rate of the first optimizer step to base_lr · λ(0), so λ(s) is the paper's value for step_num = s + 1.
`TrainingArguments.learning_rate` is the optimizer's base learning rate and so multiplies the paper's formula:
`learning_rate=1.0` is the paper exactly.
"""

import logging
import math
from typing import Any

import torch
from transformers import TrainingArguments

from training.common.checks import require_positive_integer

logger = logging.getLogger(__name__)


def _check(d_model: int, warmup_steps: int) -> None:
    require_positive_integer("d_model", d_model)
    require_positive_integer("warmup_steps", warmup_steps, ": the §5.3 schedule divides by it (the paper uses 4000)")


def paper_lrate(step_num: int, d_model: int, warmup_steps: int) -> float:
    """§5.3: lrate = d_model^-0.5 · min(step_num^-0.5, step_num · warmup_steps^-1.5), step_num counted from 1.

    The peak, d_model^-0.5 · warmup_steps^-0.5, is reached at step_num = warmup_steps.
    """
    _check(d_model, warmup_steps)
    if step_num < 1:
        raise ValueError(f"step_num counts optimizer steps from 1, got {step_num}")
    return d_model**-0.5 * min(step_num**-0.5, step_num * warmup_steps**-1.5)


def get_paper_schedule(
    optimizer: torch.optim.Optimizer, d_model: int, warmup_steps: int, scale: float = 1.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """A `LambdaLR` under which the k-th optimizer step (k = 1, 2, ...) uses base_lr · scale · paper_lrate(k) (§5.3).

    With the optimizer's base learning rate 1.0 (and scale 1.0) that is the paper's lrate exactly. Under `Trainer`
    the base learning rate is `TrainingArguments.learning_rate`, so it is the multiplier of the formula.
    """
    _check(d_model, warmup_steps)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive number, got {scale!r}")

    # A function, not a callable object: LambdaLR.state_dict() then stores only the step count and base lrs, so a
    # resumed run takes d_model and warmup_steps from its own configuration.
    def lr_lambda(last_epoch: int) -> float:
        return scale * paper_lrate(last_epoch + 1, d_model, warmup_steps)  # lambda(0) is used by optimizer step 1

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


class PaperScheduleTrainerMixin:
    """Makes a `Trainer`/`Seq2SeqTrainer` use the §5.3 schedule instead of `lr_scheduler_type`.

    Combine it before the Trainer class: `class T(PaperScheduleTrainerMixin, Seq2SeqTrainer)`, constructed as
    `T(model=..., args=..., warmup_steps=4000, ...)`. Keyword arguments:

    - `warmup_steps`: the paper's warmup_steps (4000). When omitted, `TrainingArguments.warmup_steps` is used; it
      must then be a whole number of steps ≥ 1 (a fraction of the run is not the paper's schedule). Giving both
      with different values is an error.
    - `d_model`: defaults to the model's `config.d_model`.

    `TrainingArguments.learning_rate` multiplies the formula (1.0 is the paper); `lr_scheduler_type` and its
    kwargs are not used. The paper's optimizer (§5.3) is Trainer's AdamW with adam_beta1=0.9, adam_beta2=0.98,
    adam_epsilon=1e-9 and weight_decay=0, set through `TrainingArguments`.
    """

    d_model: int
    warmup_steps: int

    def __init__(self, *args: Any, warmup_steps: int | None = None, d_model: int | None = None, **kwargs: Any):
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        from_args = getattr(training_args, "warmup_steps", 0) or 0
        if warmup_steps is None:
            if not (from_args >= 1 and float(from_args).is_integer()):
                raise ValueError(
                    "the §5.3 schedule needs warmup_steps as a whole number of steps ≥ 1 (the paper uses 4000): "
                    f"pass warmup_steps= to the trainer or set TrainingArguments.warmup_steps, got {from_args!r}"
                )
            warmup_steps = int(from_args)
        elif from_args and from_args != warmup_steps:
            raise ValueError(
                f"warmup_steps={warmup_steps} for the §5.3 schedule contradicts TrainingArguments.warmup_steps="
                f"{from_args}; set one of them"
            )
        # checked before Trainer's (longer) set-up; d_model from the model's config is checked after it
        require_positive_integer(
            "warmup_steps", warmup_steps, ": the §5.3 schedule divides by it (the paper uses 4000)"
        )
        if d_model is not None:
            require_positive_integer("d_model", d_model)
        super().__init__(*args, **kwargs)
        self.warmup_steps = warmup_steps
        self.d_model = d_model if d_model is not None else int(self.model.config.d_model)
        _check(self.d_model, self.warmup_steps)
        lr: float = self.args.learning_rate
        peak = lr * paper_lrate(self.warmup_steps, self.d_model, self.warmup_steps)
        if lr == TrainingArguments.__dataclass_fields__["learning_rate"].default:
            logger.warning(
                f"learning_rate={lr} is Trainer's default; under the §5.3 schedule it multiplies the paper's formula "
                f"(peak {peak:.3g}); learning_rate=1.0 is the paper's schedule"
            )
        logger.info(
            f"§5.3 schedule: lr = {lr} · {self.d_model}^-0.5 · min(step^-0.5, step · {self.warmup_steps}^-1.5), "
            f"peak {peak:.3g} at step {self.warmup_steps}"
        )

    def create_scheduler(
        self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """`Trainer.create_scheduler` with the §5.3 schedule (same contract: created once, flagged as Trainer-made)."""
        if self.lr_scheduler is None:
            self.lr_scheduler = get_paper_schedule(
                optimizer if optimizer is not None else self.optimizer, self.d_model, self.warmup_steps
            )
            # Trainer drops the scheduler it created before a later train() call and creates a fresh one
            self._created_lr_scheduler = True
        return self.lr_scheduler
