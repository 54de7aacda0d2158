"""`VaswaniTrainer`: transformers' Seq2SeqTrainer with the paper's batches and schedule, and run bookkeeping.

What it adds to `Seq2SeqTrainer`, each because Trainer lacks it:
- token-budget batches (training/trainer/batching.py) and the §5.3 learning-rate schedule (training/trainer/schedule.py);
- ε_ls (§5.4, `label_smoothing_factor`) applied by the model's own loss instead of Trainer's `LabelSmoother`: the
  same value (tests/test_loss.py compares the two), but the model's fused loss never builds the logits that
  `LabelSmoother` needs;
- the plain NLL and perplexity logged next to the label-smoothed loss that training minimises;
- source + target tokens counted on the device (no sync) for a tokens/s figure, with and without padding;
- complete checkpoints (training/checkpoints/complete.py): a marker recording every file's size and hash is written last,
  so a kill mid-write or a damaged file never resumes from half a checkpoint;
- a progress bar that shows loss and learning rate instead of printing a dict per log line;
- the model's generation config left as it was by evaluation (Seq2SeqTrainer fills it with global defaults).
"""

import copy
import math
from typing import Any

import torch
from transformers import Seq2SeqTrainer
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_pt_utils import nested_gather

from training.checkpoints.callback import CompleteCheckpointsMixin
from training.trainer.batching import TokenBudgetTrainerMixin
from training.trainer.schedule import PaperScheduleTrainerMixin


class VaswaniTrainer(CompleteCheckpointsMixin, TokenBudgetTrainerMixin, PaperScheduleTrainerMixin, Seq2SeqTrainer):
    """Seq2SeqTrainer + token-budget batches + the paper's schedule + NLL/token logging + complete checkpoints."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epsilon_ls, self.label_smoother = self.args.label_smoothing_factor, None  # the model smooths (above)
        self._nll_sum: torch.Tensor | None = None
        self._nll_since = 0
        self.tokens_seen = torch.zeros((), dtype=torch.long, device=self.args.device)
        self.padded_tokens_seen = torch.zeros((), dtype=torch.long, device=self.args.device)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if "labels" in inputs:
            inputs = {**inputs, "epsilon_ls": self.epsilon_ls}
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if model.training and isinstance(outputs, dict) and outputs.get("nll_loss") is not None:
            # Scale the NLL exactly as Trainer scales the loss, so the two logged numbers are comparable.
            nll = outputs["nll_loss"].detach()
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                nll = nll * self.accelerator.num_processes
            else:
                nll = nll / self.current_gradient_accumulation_steps
            self._nll_sum = nll if self._nll_sum is None else self._nll_sum + nll
            self.count_tokens(inputs)
        return (loss, outputs) if return_outputs else loss

    def count_tokens(self, inputs: dict[str, Any]) -> None:
        """Add a training micro-batch to `tokens_seen` (real source + target tokens) and `padded_tokens_seen` (the
        same with padding: the tensors' sizes), on the device, without a sync."""
        labels, mask = inputs.get("labels"), inputs.get("attention_mask")
        if labels is not None and mask is not None:
            self.tokens_seen += mask.sum() + labels.ne(-100).sum()
            self.padded_tokens_seen += mask.numel() + labels.numel()

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._nll_sum is not None:
            steps = max(self.state.global_step - self._nll_since, 1)
            gathered = nested_gather(self._nll_sum.unsqueeze(0), self.args.parallel_mode)
            nll = gathered.mean().item() / steps
            logs["nll"] = round(nll, 4)
            logs["ppl"] = round(math.exp(min(nll, 50.0)), 3)
            self._nll_sum, self._nll_since = None, self.state.global_step
        super().log(logs, start_time)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        # Seq2SeqTrainer.prediction_step fills the model's generation config with transformers' global defaults
        # (max_length=20, ...) in place, which would then be saved with the model: keep the model's own.
        kept = copy.deepcopy(self.model.generation_config)
        try:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        finally:
            self.model.generation_config = kept


class PostfixProgressCallback(ProgressCallback):
    """Trainer's progress bar, with the latest loss and learning rate as its postfix instead of printed dicts."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs:
            shown = {k: logs[k] for k in ("loss", "nll", "learning_rate") if k in logs}
            if shown:
                self.training_bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()}, refresh=False)
            else:  # evaluation results and the final summary still get printed
                self.training_bar.write(str({k: v for k, v in logs.items() if k != "total_flos"}))
