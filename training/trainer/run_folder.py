"""The run folder (`--output_dir`) of `train`: never mixed with another run (`check_output_dir`: --resume or
--overwrite_output_dir), and left as it was found when a run fails before training starts (`OutputFolder`).
Only the standard library and our light modules at import time.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from training.checkpoints.complete import Problems, describe_all, find_resumable, move_aside


def check_output_dir(s: dict[str, Any]) -> tuple[Path | None, list[Problems]]:
    """Refuse to mix runs: a non-empty output_dir needs --resume or --overwrite_output_dir. Nothing is written.

    With --resume: the newest checkpoint whose every file is present and intact (training/checkpoints/complete.py),
    and the newer ones that are not, to be moved aside once the run starts."""
    out = Path(s["output_dir"])
    if s.get("resume") and s.get("overwrite_output_dir"):
        raise SystemExit("--resume and --overwrite_output_dir contradict each other")
    if out.exists() and not out.is_dir():
        raise SystemExit(f"--output_dir {out} is a file")
    if s.get("resume"):
        checkpoint, rejected = find_resumable(out)
        if checkpoint is None:
            found = f" ({describe_all(rejected)})" if rejected else ""
            raise SystemExit(
                f"--resume: no complete checkpoint in {out}{found}; nothing was changed. Start again with "
                "--overwrite_output_dir, or restore the files named"
            )
        saved = json.loads((checkpoint / "config.json").read_text())
        wanted = json.loads(Path(s["model_config"]).read_text())
        diff = [
            k
            for k in wanted
            if k not in ("vocab_size", "architectures", "label_smoothing") and saved.get(k) != wanted[k]
        ]
        if diff:
            raise SystemExit(
                f"--resume: {checkpoint} is from another model ({', '.join(f'{k}={saved.get(k)!r}' for k in diff)}"
                f" where {s['model_config']} says {', '.join(f'{k}={wanted[k]!r}' for k in diff)})"
            )
        return checkpoint, rejected
    if out.exists() and any(out.iterdir()) and not s.get("overwrite_output_dir"):
        raise SystemExit(f"{out} is not empty: pass --resume to continue that run or --overwrite_output_dir")
    return None, []


class OutputFolder:
    """The run folder, left as it was found if the run fails before training starts (bad data, a tokenizer that
    does not fit the model, ...): a folder this run created is removed, one that --overwrite_output_dir replaces is
    only moved aside until training starts, and put back on failure."""

    def __init__(self, path: Path, overwrite: bool, is_main: bool) -> None:
        self.path, self.is_main = path, is_main
        self.existed = path.exists()
        self.was_empty = self.existed and not any(path.iterdir())
        self.replaced: Path | None = None
        if is_main and overwrite and self.existed and any(path.iterdir()):
            self.replaced = move_aside(path, ".replaced")
            self.existed = False
        if is_main:
            path.mkdir(parents=True, exist_ok=True)

    def started(self) -> None:
        """Training has started: the replaced run is gone for good."""
        if self.is_main and self.replaced is not None:
            shutil.rmtree(self.replaced)
            self.replaced = None

    def failed(self) -> None:
        if not self.is_main:
            return
        if self.replaced is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.replaced.rename(self.path)
        elif not self.existed:
            shutil.rmtree(self.path, ignore_errors=True)
        elif self.was_empty:
            for child in self.path.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
