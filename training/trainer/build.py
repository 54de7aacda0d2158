"""The run's VaswaniTrainer from its settings: the tokenized data (training/data/prepare.py), the model of
`--model_config` with the paper's decoding, Seq2SeqTrainingArguments and the metrics; and the callbacks `train` adds
(the time to the first step, rounded evaluation results on the progress bar).

`s` is the settings dict of `training.train.parse_settings`. Only the standard library at import time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from training.data.prepare import micro_batch_tokens, prepare_data

# the settings handed to Seq2SeqTrainingArguments under their own names; tests/test_train_script.py checks that they
# are its fields and that every setting of `train` it has is among them or set by build_trainer itself
TRAINING_ARGUMENTS = ("max_steps", "gradient_accumulation_steps", "adam_beta1", "adam_beta2", "adam_epsilon",
                      "label_smoothing_factor", "max_grad_norm", "bf16", "fp16", "seed", "logging_steps",
                      "eval_steps", "save_steps", "save_total_limit", "dataloader_num_workers")  # fmt: skip
# transformers 5 takes TensorBoard's folder from the environment: a user's own setting wins, read before any run of
# this process sets it for its run folder
USER_TENSORBOARD_DIR = os.environ.get("TENSORBOARD_LOGGING_DIR")


def select_device(s: dict[str, Any]) -> bool:
    """Make `--device` take effect; returns whether to run on the CPU. SystemExit if the device is not there."""
    device = s.get("device")
    if device is not None and device.startswith("cuda:"):
        # one GPU for this (single) process: the ordinary way, before CUDA is first used
        os.environ["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
    import torch

    if device is not None and device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: no CUDA GPU is visible to torch")
    use_cpu = device == "cpu" or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
    return use_cpu or not torch.cuda.is_available()


def build_trainer(
    s: dict[str, Any],
    state,
    raw,
    out: Path,
    use_cpu: bool,
    checkpoint: Path | None = None,
    load_seconds: float | None = None,
):
    """Tokenizer, tokenized data (`prepare_data` on `raw`, the splits of `load_data`), model and VaswaniTrainer: the
    part of a run that writes into the run folder `out` before training starts (train's main() undoes it if this
    fails). `state` is Accelerate's PartialState; `checkpoint` the one a --resume continues from. Returns (trainer,
    data, tokenizer, drop statistics, the sacreBLEU signatures filled by evaluation)."""
    import numpy as np
    import torch
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments
    from transformers.trainer_callback import ProgressCallback

    import modeling_vaswani
    from training.evaluation.metrics import compute_bleu_chrf
    from training.trainer.trainer import VaswaniTrainer

    data, tokenizer, drop_stats, preparation = prepare_data(s, state, raw, out, checkpoint)
    config = modeling_vaswani.VaswaniConfig.from_json_file(s["model_config"])
    config.vocab_size = len(tokenizer)
    config.fused_loss = s["fused_loss"]  # training loss without whole (tokens × vocab) logits
    special = {
        "pad": (config.pad_token_id, tokenizer.pad_token_id),
        "bos": (config.bos_token_id, tokenizer.bos_token_id),
        "eos": (config.eos_token_id, tokenizer.eos_token_id),
    }
    if any(a != b for a, b in special.values()):
        raise SystemExit(f"the tokenizer's special ids differ from the model config's: {special}")
    torch.manual_seed(s["seed"])
    model = modeling_vaswani.VaswaniForConditionalGeneration(config).use_paper_decoding()  # §6.1, saved with it

    os.environ["TENSORBOARD_LOGGING_DIR"] = USER_TENSORBOARD_DIR or str(out / "tensorboard")
    training_args = Seq2SeqTrainingArguments(
        **{name: s.get(name) for name in TRAINING_ARGUMENTS},  # ε_ls among them: the model's own loss stays plain CE
        output_dir=str(out),
        per_device_train_batch_size=1,  # unused: batches are token budgets (training/trainer/batching.py)
        per_device_eval_batch_size=32,  # predict() and evaluation under DDP use fixed-size batches
        learning_rate=s["lr_scale"],  # the §5.3 schedule's multiplier (training/trainer/schedule.py)
        weight_decay=0.0,
        eval_strategy="steps" if "validation" in data else "no",
        save_strategy="steps",
        predict_with_generate=True,
        report_to=["tensorboard"],
        data_seed=s["seed"],
        remove_unused_columns=False,
        ignore_data_skip=bool(
            s.get("streaming")
        ),  # a stream resumes at its saved position (training/data/streaming.py)
        disable_tqdm=False,
        use_cpu=use_cpu,
    )

    signatures: dict[str, str] = {}

    def compute_metrics(prediction) -> dict[str, float]:
        preds = np.where(prediction.predictions < 0, tokenizer.pad_token_id, prediction.predictions)
        labels = np.where(prediction.label_ids < 0, tokenizer.pad_token_id, prediction.label_ids)
        hyps = tokenizer.batch_decode(preds, skip_special_tokens=True)
        refs = tokenizer.batch_decode(labels, skip_special_tokens=True)
        scores = compute_bleu_chrf(hyps, refs)
        signatures.update(bleu=scores["signature"], chrf=scores["chrf_signature"])
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}

    trainer = VaswaniTrainer(
        model=model,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data.get("validation"),
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        processing_class=tokenizer,
        compute_metrics=compute_metrics,
        max_tokens=micro_batch_tokens(s, state.num_processes),
        d_model=config.d_model,
        warmup_steps=s["warmup_steps"],
    )
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(rounded_progress_callback())
    trainer.data_preparation = {"load_seconds": load_seconds, **preparation}
    return trainer, data, tokenizer, drop_stats, signatures


def first_step_callback(started: float, trainer=None):
    """A callback that records the seconds from `started` (time.time() at the command's start) to the end of the
    first optimizer step this process takes (`seconds`): how long data preparation and setup keep training waiting.

    With `trainer` (a VaswaniTrainer: it counts `tokens_seen`), it also splits the training time at the end of that
    first step, for a throughput that the data loader's start does not weigh on: `first_step_train_seconds` (from
    train()'s start: the loader's first batch, e.g. a stream's first chunk, and the step), and, over the steps
    after it, `steady_seconds` and `steady_tokens` (this process's real source + target tokens)."""
    from transformers import TrainerCallback

    class FirstStep(TrainerCallback):
        seconds: float | None = None
        first_step_train_seconds: float | None = None
        steady_seconds: float | None = None
        steady_tokens: int | None = None
        _begin = _first = _tokens_at_first = None

        def on_train_begin(self, args, state, control, **kwargs):
            self._begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if self.seconds is None:
                self.seconds = round(time.time() - started, 2)
            if trainer is None or self._begin is None:
                return
            if self._first is None:  # .item() waits for the device: the step really ended
                self._tokens_at_first = int(trainer.tokens_seen.item())
                self._first = time.perf_counter()
                self.first_step_train_seconds = round(self._first - self._begin, 3)
            elif state.global_step >= state.max_steps or control.should_training_stop:
                self.steady_tokens = int(trainer.tokens_seen.item()) - self._tokens_at_first
                self.steady_seconds = round(time.perf_counter() - self._first, 3)

    return FirstStep()


def rounded_progress_callback():
    """The progress bar of training/trainer/trainer.py, with evaluation results printed to 4 significant digits instead of
    16 (trainer_state.json and run_summary.json keep full precision: the callback gets a copy)."""
    from training.trainer.trainer import PostfixProgressCallback

    class RoundedProgressCallback(PostfixProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            shown = {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in (logs or {}).items()}
            return super().on_log(args, state, control, logs=shown, **kwargs)

    return RoundedProgressCallback
