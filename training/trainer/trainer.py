"""`VaswaniTrainer`: transformers' Seq2SeqTrainer with the paper's batches and schedule, and run bookkeeping.

What it adds to `Seq2SeqTrainer`, each because Trainer lacks it:
- token-budget batches (training/trainer/batching.py) and the §5.3 learning-rate schedule (training/trainer/schedule.py);
- ε_ls (§5.4, `label_smoothing_factor`) applied by the model's own loss instead of Trainer's `LabelSmoother`: the
  same value (tests/test_loss.py compares the two), but the model's fused loss never builds the logits that
  `LabelSmoother` needs;
- the plain NLL per target token and perplexity logged next to the label-smoothed loss that training minimises
  (summed over the tokens since the last log, as fairseq's nll_loss; with ε_ls = 0 and one step a log, equal to the
  loss);
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
        # NLL over the target tokens since the last log, summed on the device (no sync per step)
        self._nll_sum = torch.zeros((), dtype=torch.float32, device=self.args.device)
        self._nll_tokens = torch.zeros((), dtype=torch.long, device=self.args.device)
        self.tokens_seen = torch.zeros((), dtype=torch.long, device=self.args.device)
        self.padded_tokens_seen = torch.zeros((), dtype=torch.long, device=self.args.device)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if "labels" in inputs:
            inputs = {**inputs, "epsilon_ls": self.epsilon_ls}
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if model.training and isinstance(outputs, dict) and outputs.get("nll_loss") is not None:
            # The model's nll_loss is this micro-batch's NLL sum over its denominator: num_items_in_batch when
            # given (the step's target tokens, all processes), else its own target tokens. Undone here into a sum,
            # so the logged NLL is per target token whatever Trainer does to scale the loss (tests/test_trainer_label_smoothing.py).
            tokens = inputs["labels"].ne(-100).sum()
            denominator = tokens if num_items_in_batch is None else num_items_in_batch
            self._nll_sum += outputs["nll_loss"].detach().float() * denominator
            self._nll_tokens += tokens
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
        if "loss" in logs:
            both = torch.stack([self._nll_sum, self._nll_tokens.float()]).unsqueeze(0)  # (1, 2)
            nll_sum, tokens = nested_gather(both, self.args.parallel_mode).sum(0).tolist()  # all processes
            if tokens > 0:
                nll = nll_sum / tokens
                logs["nll"] = round(nll, 4)
                logs["ppl"] = round(math.exp(min(nll, 50.0)), 3)
            self._nll_sum.zero_()
            self._nll_tokens.zero_()
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
