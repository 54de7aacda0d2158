"""Resume after any damage (training/checkpoints/complete.py, train --resume): a kill twice in the same save, each file of
a checkpoint deleted or corrupted in turn; never a fresh optimizer or schedule, never a false warning."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training.checkpoints.complete import (
    COMPLETE_MARKER,
    checkpoint_problems,
    find_resumable,
    move_aside,
)
from training.train import main as train_main

from tiny_runs import TINY_TRAIN_ARGS, write_inputs

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

RESUME_FILES = ("model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state.pth")


def run_args(files: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        "--model_config", str(files["model"]), "--train_file", str(files["train"]), *TINY_TRAIN_ARGS,
        "--warmup_steps", "10", "--logging_steps", "4", "--save_steps", "4", "--save_total_limit", "10",
        "--output_dir", str(out), *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def straight(tmp_path_factory, one_thread) -> tuple[dict[str, Path], Path]:
    """A tiny run of 12 steps, never interrupted: checkpoints at 4, 8 and 12, dropout on."""
    root = tmp_path_factory.mktemp("checkpoints")
    files = write_inputs(root, train_size=400, p_drop=0.1)
    out = root / "straight"
    train_main(run_args(files, out, "--max_steps", "12"))
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-12", "checkpoint-4", "checkpoint-8"]
    return files, out


def interrupted_copy(straight_run: Path, dest: Path) -> Path:
    """The run as if killed after its step-8 checkpoint: checkpoint-12 and the final model folder files gone."""
    shutil.copytree(straight_run, dest, ignore=shutil.ignore_patterns("tensorboard"))
    shutil.rmtree(dest / "checkpoint-12")
    for p in dest.iterdir():
        if p.is_file():
            p.unlink()
    return dest


def same_weights(a: Path, b: Path) -> None:
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert x.keys() == y.keys()
    for key in x:
        torch.testing.assert_close(x[key], y[key], rtol=0, atol=1e-6, msg=key)


def test_the_marker_records_every_file_and_a_complete_checkpoint_has_no_problems(straight):
    _, run = straight
    marker = json.loads((run / "checkpoint-8" / COMPLETE_MARKER).read_text())
    assert marker["global_step"] == 8
    assert set(RESUME_FILES) | {"config.json", "tokenizer.json"} <= set(marker["files"])
    assert all(len(entry["sha256"]) == 64 and entry["bytes"] > 0 for entry in marker["files"].values())
    assert not checkpoint_problems(run / "checkpoint-8")
    assert find_resumable(run) == (run / "checkpoint-12", [])


@pytest.mark.parametrize("name", [*RESUME_FILES, "config.json"])
def test_each_deleted_file_is_named_and_the_previous_checkpoint_taken(straight, tmp_path, name):
    _, run = straight
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("tensorboard"))
    (copy / "checkpoint-12" / name).unlink()
    checkpoint, rejected = find_resumable(copy)
    assert checkpoint == copy / "checkpoint-8"
    assert [p.folder.name for p in rejected] == ["checkpoint-12"]
    assert rejected[0].missing == [name] and rejected[0].kind == "damaged"
    assert f"missing {name}" in rejected[0].describe()


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage", [_flip_a_byte, _truncate], ids=["flipped-byte", "truncated"])
@pytest.mark.parametrize("name", [*RESUME_FILES, "config.json"])
def test_each_corrupted_file_is_named(straight, tmp_path, name, damage):
    _, run = straight
    folder = tmp_path / "checkpoint-12"
    shutil.copytree(run / "checkpoint-12", folder)
    damage(folder / name)
    problems = checkpoint_problems(folder)
    assert list(problems.damaged) == [name] and not problems.missing
    expected = "is corrupted" if damage is _flip_a_byte else "is truncated or changed"
    assert problems.damaged[name].startswith(expected)


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "rng_state.pth", "trainer_state.json"])
def test_checkpoints_without_a_record_are_checked_by_their_structure(straight, tmp_path, name):
    """A marker of the earlier format holds only the step: truncation is found from each file's own structure."""
    _, run = straight
    folder = tmp_path / "checkpoint-12"
    shutil.copytree(run / "checkpoint-12", folder)
    (folder / COMPLETE_MARKER).write_text(json.dumps({"global_step": 12}))
    assert not checkpoint_problems(folder)
    _truncate(folder / name)
    problems = checkpoint_problems(folder)
    assert list(problems.damaged) == [name]
    assert problems.damaged[name].startswith(("not a readable", "not valid JSON"))


def test_moving_aside_never_collides(tmp_path):
    """The second and third kill in the same save: `incomplete-checkpoint-6` exists (not empty) already."""
    names = []
    for _ in range(3):
        folder = tmp_path / "checkpoint-6"
        folder.mkdir()
        (folder / "optimizer.pt").write_bytes(b"half")
        names.append(move_aside(folder, "incomplete").name)
    assert names == ["incomplete-checkpoint-6", "incomplete-checkpoint-6.2", "incomplete-checkpoint-6.3"]
    assert all((tmp_path / n / "optimizer.pt").read_bytes() == b"half" for n in names)


def test_killed_twice_in_the_same_save_still_resumes_to_the_uninterrupted_weights(straight, tmp_path):
    files, run = straight
    killed = interrupted_copy(run, tmp_path / "killed")
    # the first kill's leftover (moved aside by the first resume), and the second kill's, in the same save
    for copy in ("incomplete-checkpoint-12", "checkpoint-12"):
        half = killed / copy
        shutil.copytree(run / "checkpoint-12", half, ignore=shutil.ignore_patterns(COMPLETE_MARKER))
        (half / "optimizer.pt").write_bytes(b"truncated")
    train_main(run_args(files, killed, "--max_steps", "12", "--resume"))
    assert (killed / "incomplete-checkpoint-12.2" / "optimizer.pt").read_bytes() == b"truncated"
    same_weights(run, killed)


@pytest.mark.parametrize(
    "names",
    [("optimizer.pt", "scheduler.pt"), ("model.safetensors",), ("trainer_state.json",)],
    ids=["optimizer+scheduler", "weights", "trainer_state"],
)
def test_a_damaged_newest_checkpoint_is_moved_aside_and_the_run_resumes_exactly(straight, tmp_path, capfd, names):
    """Before: without optimizer.pt and scheduler.pt Trainer resumed silently with a fresh Adam and schedule (other
    weights); without the weights or the trainer state it failed with a traceback. Now checkpoint-8 is moved aside
    and the run resumes from checkpoint-4, to the same weights as the run never interrupted."""
    files, run = straight
    killed = interrupted_copy(run, tmp_path / "killed")
    for name in names:
        (killed / "checkpoint-8" / name).unlink()
    capfd.readouterr()
    train_main(run_args(files, killed, "--max_steps", "12", "--resume"))
    printed = capfd.readouterr()
    assert f"checkpoint-8: missing {', '.join(names)}; moved aside to damaged-checkpoint-8" in printed.out
    assert "resuming from " + str(killed / "checkpoint-4") in printed.out
    assert "There were missing keys" not in printed.err + printed.out  # the tied embeddings are not missing
    assert not (killed / "damaged-checkpoint-8" / names[0]).exists()
    same_weights(run, killed)


def test_without_any_usable_checkpoint_resume_says_why_and_changes_nothing(straight, tmp_path):
    files, run = straight
    killed = interrupted_copy(run, tmp_path / "killed")
    for step in (4, 8):
        _flip_a_byte(killed / f"checkpoint-{step}" / "optimizer.pt")
    before = sorted(p.name for p in killed.iterdir())
    with pytest.raises(SystemExit, match=r"no complete checkpoint in .*checkpoint-8: optimizer.pt is corrupted.*"
                                         r"checkpoint-4: optimizer.pt is corrupted"):  # fmt: skip
        train_main(run_args(files, killed, "--max_steps", "12", "--resume"))
    assert sorted(p.name for p in killed.iterdir()) == before
