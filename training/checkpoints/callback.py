"""The Trainer side of complete checkpoints (training/checkpoints/complete.py): the marker written after every save, and
resuming without a false "missing keys" warning."""

from pathlib import Path

from transformers import TrainerCallback

from training.checkpoints.complete import write_marker
from training.common.files import follow_umask_in


class CompleteCheckpointCallback(TrainerCallback):
    """After Trainer has saved a checkpoint (every file, every process), write its completion marker and give its
    files the user's umask (safetensors writes 0600)."""

    def on_save(self, args, state, control, **kwargs):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # every process has written its rng_state_<rank>.pth
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if args.should_save and folder.is_dir():
            follow_umask_in(folder)
            write_marker(folder, state.global_step)
        return control


class CompleteCheckpointsMixin:
    """For a Trainer subclass: completion markers on every checkpoint, and no false "missing keys" warning when a
    checkpoint is resumed (transformers' check knows only the legacy `_keys_to_ignore_on_save`, so the tied
    embedding names, stored once, look missing although the weights come back exact). `_issue_warnings_after_load`
    is private, but Trainer has no public hook after loading a checkpoint; tests/test_train_script.py resumes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_callback(CompleteCheckpointCallback())

    def _issue_warnings_after_load(self, load_result):
        tied = set(getattr(self.model, "all_tied_weights_keys", None) or ())
        missing = [k for k in load_result.missing_keys if k not in tied]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))
