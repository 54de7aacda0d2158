"""Complete checkpoints: what makes one, how it is checked, and what happens to a damaged one.

Trainer writes a checkpoint as several files (weights, optimizer, scheduler, trainer state, RNG) and resumes from
whatever it finds: a missing `optimizer.pt` or `scheduler.pt` silently restarts Adam and the schedule, a truncated
file fails with a library traceback. Trainer has no notion of a complete checkpoint, so this module adds one:

- `CompleteCheckpointCallback` (training/checkpoints/callback.py, a TrainerCallback: after every save) writes
  `checkpoint_complete.json` last and atomically. It records the size and SHA-256 of every file of the checkpoint.
- `checkpoint_problems` says what is wrong with a checkpoint: no marker (a kill mid-write), a missing file, or a
  file whose size or hash differs from the record (truncated, overwritten, bit rot). Files of checkpoints written
  before the record existed are checked by reading their structure (safetensors header, torch's zip archive with
  its CRCs, JSON).
- `find_resumable` picks the newest checkpoint without problems and lists the newer ones that have problems;
  `move_aside` renames those to `incomplete-…` / `damaged-…` under a name no earlier move has taken, so a second or
  third kill in the same save still resumes. Nothing is deleted.

`training.train --resume` and `training.average` use these; tests/test_checkpoints.py kills, deletes and corrupts.
This module imports neither torch nor transformers (the commands' `--help` stays fast).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

COMPLETE_MARKER = "checkpoint_complete.json"
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
TRAINER_STATE = "trainer_state.json"
OPTIMIZER = "optimizer.pt"
SCHEDULER = "scheduler.pt"
_HASH_CHUNK = 1 << 22


def checkpoint_number(folder: Path) -> int | None:
    match = CHECKPOINT_RE.match(folder.name)
    return int(match.group(1)) if match else None


def checkpoint_folders(run_dir: str | os.PathLike) -> list[Path]:
    """The run's `checkpoint-N` folders, oldest (smallest N) first, with or without a marker."""
    root = Path(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and checkpoint_number(p) is not None]
    return sorted(found, key=checkpoint_number)


def has_marker(folder: Path) -> bool:
    return (folder / COMPLETE_MARKER).is_file()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_marker(folder: Path, global_step: int) -> Path:
    """Record every file of `folder` (size, SHA-256) in the completion marker, written last and atomically."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(COMPLETE_MARKER))
    record = {
        "global_step": global_step,
        "files": {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": sha256(p)} for p in files},
    }
    tmp = folder / (COMPLETE_MARKER + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, folder / COMPLETE_MARKER)  # atomic: the marker is either absent or whole
    return folder / COMPLETE_MARKER


def weight_file_names(folder: Path) -> list[str]:
    """model.safetensors, or the index and the shards it names (empty if the folder has neither)."""
    if (folder / WEIGHTS).is_file():
        return [WEIGHTS]
    if (folder / WEIGHTS_INDEX).is_file():
        try:
            shards = sorted(set(json.loads((folder / WEIGHTS_INDEX).read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return [WEIGHTS_INDEX]  # its own check reports it unreadable
        return [WEIGHTS_INDEX, *shards]
    return []


def required_files(folder: Path, purpose: str) -> list[str]:
    """What a checkpoint needs: for "weights" (averaging, loading) the weights and config.json; for "resume" also
    the trainer state, optimizer, scheduler and RNG state (`rng_state.pth`, or one `rng_state_<rank>.pth` per
    process of a distributed run: whichever the checkpoint has, checked against the marker's record)."""
    names = weight_file_names(folder) or [WEIGHTS]
    names.append(CONFIG)
    if purpose == "resume":
        names += [TRAINER_STATE, OPTIMIZER, SCHEDULER]
        names += sorted(p.name for p in folder.glob("rng_state*.pth")) or ["rng_state.pth"]
    elif purpose != "weights":
        raise ValueError(f"purpose must be 'resume' or 'weights', got {purpose!r}")
    return names


def structure_problem(path: Path) -> str | None:
    """Why `path` cannot be read, judged from its own structure; None if it reads."""
    name = path.name
    try:
        if name.endswith(".safetensors"):
            from safetensors import SafetensorError, safe_open

            try:
                with safe_open(path, framework="pt") as f:  # checks the header and that it covers the file exactly
                    list(f.keys())
            except SafetensorError as e:
                return f"not a readable safetensors file ({e})"
        elif name.endswith((".pt", ".pth", ".bin")):
            try:
                with zipfile.ZipFile(path) as archive:  # torch.save's format; testzip checks every member's CRC
                    bad = archive.testzip()
            except zipfile.BadZipFile as e:
                return f"not a readable torch file ({e})"
            if bad is not None:
                return f"damaged torch file (member {bad} fails its CRC check)"
        elif name.endswith(".json"):
            json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"not valid JSON ({e})"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return None


@dataclass
class Problems:
    """What is wrong with one checkpoint; empty when nothing is."""

    folder: Path
    no_marker: bool = False
    missing: list[str] = field(default_factory=list)
    damaged: dict[str, str] = field(default_factory=dict)  # file name -> why

    def __bool__(self) -> bool:
        return self.no_marker or bool(self.missing) or bool(self.damaged)

    @property
    def kind(self) -> str:
        return "incomplete" if self.no_marker else "damaged"

    def describe(self) -> str:
        parts = []
        if self.no_marker:
            parts.append(f"no {COMPLETE_MARKER} (its write was interrupted)")
        if self.missing:
            parts.append(f"missing {', '.join(self.missing)}")
        parts += [f"{name} {why}" for name, why in self.damaged.items()]
        return "; ".join(parts)


def checkpoint_problems(folder: str | os.PathLike, purpose: str = "resume") -> Problems:
    """Check a checkpoint for `purpose` ("resume": every file Trainer restores; "weights": weights and config)."""
    folder = Path(folder)
    problems = Problems(folder)
    marker = folder / COMPLETE_MARKER
    record: dict = {}
    if not marker.is_file():
        problems.no_marker = True
    else:
        try:
            content = json.loads(marker.read_text(encoding="utf-8"))
            record = content.get("files") or {}
            int(content["global_step"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            problems.damaged[COMPLETE_MARKER] = f"is unreadable ({e})"
    needed = required_files(folder, purpose)
    # with the record, every recorded file is checked as well (resume restores them all); averaging needs only some
    check = list(dict.fromkeys([*needed, *(record if purpose == "resume" else ())]))
    for name in check:
        path = folder / name
        if not path.is_file():
            problems.missing.append(name)
            continue
        expected = record.get(name)
        if not isinstance(expected, dict):
            why = structure_problem(path)
        elif path.stat().st_size != expected.get("bytes"):
            why = f"is truncated or changed ({path.stat().st_size:,} bytes; {expected.get('bytes'):,} when written)"
        elif sha256(path) != expected.get("sha256"):
            why = "is corrupted (its SHA-256 differs from the one recorded when it was written)"
        else:
            why = None
        if why:
            problems.damaged[name] = why
    return problems


def find_resumable(run_dir: str | os.PathLike) -> tuple[Path | None, list[Problems]]:
    """The newest checkpoint that can be resumed from, and the problems of every newer one (newest first)."""
    rejected: list[Problems] = []
    for folder in reversed(checkpoint_folders(run_dir)):
        problems = checkpoint_problems(folder, "resume")
        if not problems:
            return folder, rejected
        rejected.append(problems)
    return None, rejected


def move_aside(folder: Path, prefix: str) -> Path:
    """Rename `folder` to `<prefix>-<name>`, or `<prefix>-<name>.2`, `.3`, ...: never onto an existing path."""
    n = 1
    while True:
        aside = folder.with_name(f"{prefix}-{folder.name}" + (f".{n}" if n > 1 else ""))
        if not aside.exists():
            try:
                folder.rename(aside)  # (rename would replace an empty folder: checked above)
                return aside
            except OSError:
                if not folder.exists():  # really gone: someone else moved it
                    raise
        n += 1


def complete_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The run's `checkpoint-N` folders that have the completion marker, oldest first (not checked further: see
    `checkpoint_problems`). The one listing of complete checkpoints: `find_resumable` (train --resume) and averaging
    build on it."""
    return [p for p in checkpoint_folders(output_dir) if has_marker(p)]


def last_complete_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest `checkpoint-N` folder whose completion marker exists (not checked further; see find_resumable)."""
    done = complete_checkpoints(output_dir)
    return done[-1] if done else None


def incomplete_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """`checkpoint-N` folders without a completion marker: a run was killed while writing them."""
    return [p for p in checkpoint_folders(output_dir) if not has_marker(p)]


def describe_all(rejected: Iterable[Problems]) -> str:
    return "; ".join(f"{p.folder.name}: {p.describe()}" for p in rejected)
