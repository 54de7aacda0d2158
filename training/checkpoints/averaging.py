"""Checkpoint averaging (§6.1: "a single model obtained by averaging the last 5 checkpoints"): which checkpoints,
the checks that they can be averaged together, the element-wise mean, and the averaged model folder.
The method and the checks are described in `python -m training.average --help` (training/average.py).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.checkpoints.complete import CHECKPOINT_RE as _CHECKPOINT_RE
from training.checkpoints.complete import (
    COMPLETE_MARKER,
    checkpoint_problems,
    complete_checkpoints,
    incomplete_checkpoints,
)
from training.common.checks import positive_integer_problem
from training.common.files import TOKENIZER_FILES, WEIGHTS, WEIGHTS_INDEX, follow_umask_in, output_problem, weight_files

if TYPE_CHECKING:  # torch loads only once the arguments are parsed (a fast --help)
    import torch

# config.json fields that say nothing about the model: written by the library, or toggled by Trainer
BOOKKEEPING_FIELDS = frozenset(
    {"transformers_version", "dtype", "torch_dtype", "_name_or_path", "auto_map", "custom_pipelines", "use_cache"}
)
RUN_FILES = ("run_summary.json", "training_curves.png")  # publishing reads them
METHOD = (
    "uniform element-wise mean of every floating-point tensor over the checkpoints, accumulated in float64 and "
    "rounded once to the stored dtype; integer and bool tensors taken from the newest checkpoint; the shared "
    "embedding / pre-softmax matrix (stored once) averaged once"
)


class CheckpointError(ValueError):
    """A folder is not a usable checkpoint, or checkpoints cannot be averaged together."""


# --------------------------------------------------------------------------------------------------------------
# finding and checking checkpoints


def checkpoint_step(folder: Path) -> int:
    """The training step of a complete checkpoint: from its completion marker, else from its `checkpoint-N` name."""
    try:
        return int(json.loads((folder / COMPLETE_MARKER).read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        match = _CHECKPOINT_RE.match(folder.name)
        if match:
            return int(match.group(1))
        raise CheckpointError(
            f"{folder}: cannot tell its step (unreadable {COMPLETE_MARKER}, name not checkpoint-N)"
        ) from None


def checkpoint_weights(folder: Path) -> list[Path]:
    """The safetensors file(s) of a checkpoint (`weight_files`), every one present; CheckpointError naming what is
    missing otherwise."""
    files = weight_files(folder)
    missing = [p.name for p in files if not p.is_file()]
    if missing:
        raise CheckpointError(f"{folder}: {WEIGHTS_INDEX} names shard(s) that are missing: {missing}")
    if files:
        return files
    holds_checkpoints = folder.is_dir() and any(_CHECKPOINT_RE.match(p.name) for p in folder.iterdir())
    hint = " — it holds checkpoint-N folders: pass it as RUN" if holds_checkpoints else ""
    raise CheckpointError(f"{folder} is not a checkpoint: no {WEIGHTS} (nor {WEIGHTS_INDEX}){hint}")


def check_checkpoint(folder: Path) -> None:
    """Raise CheckpointError unless `folder` is a complete checkpoint: weights, config.json and the marker."""
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such folder")
    checkpoint_weights(folder)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} is not a checkpoint: no config.json")
    if not (folder / COMPLETE_MARKER).is_file():
        raise CheckpointError(
            f"{folder} is not a complete checkpoint: no {COMPLETE_MARKER} (training writes it last; without it the "
            "checkpoint may be half-written)"
        )
    problems = checkpoint_problems(folder, "weights")
    if problems:
        raise CheckpointError(f"{folder} is damaged: {problems.describe()}")


def select_checkpoints(run_dir: Path | None, last: int | None, checkpoints: Sequence[Path] | None) -> list[Path]:
    """The checkpoints to average, oldest first (the newest is last); raises CheckpointError naming the problem."""
    if checkpoints:
        folders = [Path(c) for c in checkpoints]
        seen: dict[Path, Path] = {}
        for folder in folders:
            check_checkpoint(folder)
            key = folder.resolve()
            if key in seen:
                raise CheckpointError(f"{folder} is listed twice (also as {seen[key]}): it would count double")
            seen[key] = folder
        return sorted(folders, key=checkpoint_step)  # stable: equal steps keep the given order
    assert run_dir is not None and last is not None
    if problem := positive_integer_problem("--last", last):
        raise CheckpointError(problem)
    if (run_dir / COMPLETE_MARKER).is_file():
        raise CheckpointError(f"{run_dir} is a checkpoint, not a run folder: pass it with --checkpoints")
    if not run_dir.is_dir():
        raise CheckpointError(f"run folder {run_dir}: no such folder")
    done = complete_checkpoints(run_dir)
    if len(done) < last:
        skipped = incomplete_checkpoints(run_dir)
        raise CheckpointError(
            f"--last {last}: {run_dir} has only {len(done)} complete checkpoint(s)"
            + (f" ({', '.join(p.name for p in done)})" if done else "")
            + (f"; incomplete (no {COMPLETE_MARKER}, not counted): {', '.join(p.name for p in skipped)}" if skipped
               else "")
        )  # fmt: skip
    chosen = done[-last:]
    for folder in chosen:
        check_checkpoint(folder)
    return chosen


def model_config_fields(folder: Path) -> dict[str, Any]:
    """config.json without the bookkeeping fields."""
    config = json.loads((folder / "config.json").read_text())
    return {k: v for k, v in config.items() if k not in BOOKKEEPING_FIELDS}


def check_same_model(folders: Sequence[Path]) -> None:
    """Raise CheckpointError naming the first config field in which a checkpoint differs from the newest one."""
    reference = folders[-1]
    wanted = model_config_fields(reference)
    for folder in folders[:-1]:
        got = model_config_fields(folder)
        for field in sorted(set(wanted) | set(got)):
            if got.get(field, "<absent>") != wanted.get(field, "<absent>"):
                raise CheckpointError(
                    f"checkpoints of different models: {folder} has {field}={got.get(field, '<absent>')!r} but "
                    f"{reference} has {field}={wanted.get(field, '<absent>')!r}"
                )


def tokenizer_folder(folder: Path) -> Path | None:
    """Where the tokenizer of a checkpoint is: in it (Trainer saves it there), or in its run folder."""
    for candidate in (folder, folder.parent, folder.parent / "tokenizer"):
        if (candidate / "tokenizer.json").is_file():
            return candidate
    return None


def token_of_id(folder: Path) -> dict[int, str]:
    """{id: token} of a tokenizer.json: the model's vocabulary and the added (special) tokens."""
    path = folder / "tokenizer.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        vocab = data["model"]["vocab"]
        if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: {token: id}
            tokens = {int(i): t for t, i in vocab.items()}
        else:  # Unigram: [[token, score], ...] in id order
            tokens = {i: entry[0] for i, entry in enumerate(vocab)}
        tokens.update({int(a["id"]): a["content"] for a in data.get("added_tokens") or ()})
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise CheckpointError(f"{path}: not a readable tokenizer.json ({e})") from None
    return tokens


def check_same_tokenizer(folders: Sequence[Path]) -> None:
    """Raise CheckpointError unless every checkpoint's tokenizer gives every id the same token as the newest's."""
    reference = folders[-1]
    ref_dir = tokenizer_folder(reference)
    for folder in folders[:-1]:
        here = tokenizer_folder(folder)
        if here is None and ref_dir is None:  # tensors only (no tokenizer to compare; writing a folder needs one)
            continue
        if here is None or ref_dir is None:
            lacking = folder if here is None else reference
            raise CheckpointError(
                f"{lacking}: no tokenizer.json in it or its run folder: cannot check that the checkpoints share "
                "one vocabulary"
            )
        if here == ref_dir or (here / "tokenizer.json").read_bytes() == (ref_dir / "tokenizer.json").read_bytes():
            continue
        a, b = token_of_id(here), token_of_id(ref_dir)
        differ = sorted(i for i in set(a) | set(b) if a.get(i) != b.get(i))
        if differ:
            i = differ[0]
            raise CheckpointError(
                f"checkpoints trained with different tokenizers: {len(differ):,} of {max(len(a), len(b)):,} token ids "
                f"stand for different tokens in {folder} and {reference} (first: id {i} is {a.get(i)!r} in one, "
                f"{b.get(i)!r} in the other); their embeddings cannot be averaged"
            )
        data = [json.loads((d / "tokenizer.json").read_text(encoding="utf-8")) for d in (here, ref_dir)]
        for part in ("normalizer", "pre_tokenizer", "model", "post_processor", "decoder"):
            if data[0].get(part) != data[1].get(part):
                raise CheckpointError(
                    f"checkpoints trained with different tokenizers: the same vocabulary, but the {part} of "
                    f"{here / 'tokenizer.json'} differs from {ref_dir / 'tokenizer.json'}"
                )


def tensor_headers(folder: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """{name: (shape, dtype)} of every tensor of a checkpoint, from the safetensors headers (no tensor is read)."""
    from safetensors import SafetensorError, safe_open

    headers = {}
    for path in checkpoint_weights(folder):
        try:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    piece = f.get_slice(name)
                    headers[name] = (tuple(piece.get_shape()), piece.get_dtype())
        except SafetensorError as e:
            raise CheckpointError(f"{path}: unreadable safetensors file ({e})") from None
    return headers


def check_same_tensors(headers: Sequence[Mapping[str, tuple]], names: Sequence[str]) -> None:
    """Raise CheckpointError at the first tensor name, shape or dtype in which a checkpoint differs from the newest."""
    reference, ref_name = headers[-1], names[-1]
    for header, name in zip(headers[:-1], names[:-1], strict=True):
        only_here = sorted(set(header) - set(reference))
        only_there = sorted(set(reference) - set(header))
        if only_here or only_there:
            first = min(only_here + only_there)
            holder, other = (name, ref_name) if first in only_here else (ref_name, name)
            raise CheckpointError(
                f"checkpoints with different tensors: {first!r} is in {holder} but not in {other} "
                f"({len(only_here) + len(only_there)} name(s) differ)"
            )
        for key in sorted(reference):
            if header[key] != reference[key]:
                (shape_a, dtype_a), (shape_b, dtype_b) = header[key], reference[key]
                what = "shape" if shape_a != shape_b else "dtype"
                a, b = (shape_a, shape_b) if what == "shape" else (dtype_a, dtype_b)
                raise CheckpointError(
                    f"checkpoints with different tensors: {key!r} has {what} {a} in {name} but {b} in {ref_name}"
                )


# --------------------------------------------------------------------------------------------------------------
# averaging


def load_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint, on the CPU, as stored."""
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    for path in checkpoint_weights(folder):
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118
                tensors[name] = f.get_tensor(name)
    return tensors


def average_state_dicts(
    state_dicts: Iterable[Mapping[str, torch.Tensor]], names: Sequence[str] | None = None
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The element-wise mean of floating-point tensors over `state_dicts` (consumed one at a time, so a generator
    keeps one checkpoint in memory), accumulated in float64 and rounded once to each tensor's dtype. Integer and
    bool tensors are taken from the last state dict; the names of those that differ between state dicts are
    returned as the second value (the caller warns). Raises CheckpointError on different names, shapes or dtypes.
    """
    import torch

    sums: dict[str, torch.Tensor] = {}
    kept: dict[str, torch.Tensor] = {}
    first_ints: dict[str, torch.Tensor] = {}
    differing: set[str] = set()
    dtypes: dict[str, torch.dtype] = {}
    shapes: dict[str, torch.Size] = {}
    count = 0
    for i, state in enumerate(state_dicts):
        label = names[i] if names is not None else f"state dict {i}"
        first_label = names[0] if names is not None else "state dict 0"
        if count == 0:
            dtypes = {k: t.dtype for k, t in state.items()}
            shapes = {k: t.shape for k, t in state.items()}
        else:
            extra, missing = sorted(set(state) - set(dtypes)), sorted(set(dtypes) - set(state))
            if extra or missing:
                first = min(extra + missing)
                holder, other = (label, first_label) if first in extra else (first_label, label)
                raise CheckpointError(f"different tensors: {first!r} is in {holder} but not in {other}")
        for key, tensor in state.items():
            if tensor.shape != shapes[key] or tensor.dtype != dtypes[key]:
                raise CheckpointError(
                    f"different tensors: {key!r} is {tuple(tensor.shape)} {tensor.dtype} in {label} but "
                    f"{tuple(shapes[key])} {dtypes[key]} in {first_label}"
                )
            if tensor.is_floating_point() or tensor.is_complex():
                wide = tensor.to(torch.complex128 if tensor.is_complex() else torch.float64)
                sums[key] = wide.clone() if count == 0 else sums[key].add_(wide)
            else:
                if count == 0:
                    first_ints[key] = tensor.clone()
                elif not torch.equal(tensor, first_ints[key]):
                    differing.add(key)
                kept[key] = tensor.clone()
        count += 1
    if count == 0:
        raise CheckpointError("nothing to average: no state dicts")
    averaged = {key: (total / count).to(dtypes[key]) for key, total in sums.items()}
    averaged.update(kept)
    return {key: averaged[key] for key in dtypes}, sorted(differing)


def average_checkpoints(folders: Sequence[Path], progress: bool = True) -> dict[str, torch.Tensor]:
    """Check `folders` (configs, tensor names, shapes, dtypes) and return their averaged tensors."""
    if not folders:
        raise CheckpointError("no checkpoints to average")
    for folder in folders:
        check_checkpoint(folder)
    check_same_model(folders)
    check_same_tokenizer(folders)
    check_same_tensors([tensor_headers(f) for f in folders], [str(f) for f in folders])
    from tqdm.auto import tqdm

    loaded = (load_weights(f) for f in tqdm(folders, desc="Averaging checkpoints", unit="ckpt", disable=not progress))
    averaged, differing = average_state_dicts(loaded, [str(f) for f in folders])
    if differing:
        warnings.warn(
            f"integer/bool tensors differ between the checkpoints; the newest checkpoint's are kept: {differing}",
            stacklevel=2,
        )
    return averaged


# --------------------------------------------------------------------------------------------------------------
# writing the averaged model folder


def _model_with(averaged: Mapping[str, torch.Tensor], newest: Path):
    """The newest checkpoint's model with the averaged tensors loaded into it; its ties intact."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    import modeling_vaswani  # noqa: F401  (registers the Auto classes; save_pretrained then ships the code files)

    model = AutoModelForSeq2SeqLM.from_pretrained(newest)
    missing, unexpected = model.load_state_dict(dict(averaged), strict=False)
    if unexpected:
        raise CheckpointError(f"{newest}: tensors the model does not have: {sorted(unexpected)[:5]}")
    state = model.state_dict()
    loaded_ptrs = {state[k].data_ptr() for k in averaged}
    untied = [k for k in missing if state[k].data_ptr() not in loaded_ptrs]
    if untied:  # a missing name is fine only as another name of a loaded (tied) tensor
        raise CheckpointError(f"{newest}: the checkpoint lacks tensors of the model: {sorted(untied)[:5]}")
    for key, tensor in averaged.items():
        if not torch.equal(state[key], tensor):
            raise RuntimeError(f"{key} did not load exactly (dtype {state[key].dtype} vs {tensor.dtype})")
    return model


def _tokenizer_source(newest: Path, run_dir: Path | None) -> Path:
    for folder in (newest, run_dir, run_dir / "tokenizer" if run_dir else None):
        if folder is not None and (folder / "tokenizer_config.json").is_file():
            return folder
    raise CheckpointError(f"no tokenizer: neither {newest} nor the run folder has tokenizer_config.json")


def prepare_output_dir(output_dir: Path, overwrite: bool, inputs: Sequence[Path]) -> None:
    """Refuse a non-empty output folder without `overwrite`, and any output folder that is or holds an input."""
    out = output_dir.resolve()
    for folder in inputs:
        source = folder.resolve()
        if out == source or out in source.parents:
            raise CheckpointError(f"--output_dir {output_dir} is or contains the input {folder}: choose another folder")
    if problem := output_problem(output_dir, "--output_dir", overwrite):
        raise CheckpointError(problem)


def write_averaged_model(
    folders: Sequence[Path],
    output_dir: Path,
    averaged: Mapping[str, torch.Tensor],
    run_dir: Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the averaged model folder (see the module docstring). It is built next to `output_dir` and moved into
    place at the end, so a failure leaves an existing `output_dir` as it was."""
    newest = folders[-1]
    tokenizer_dir = _tokenizer_source(newest, run_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    try:
        model = _model_with(averaged, newest)
        model.save_pretrained(staging)
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).is_file():
                shutil.copy2(tokenizer_dir / name, staging / name)
        if run_dir is not None:
            for name in RUN_FILES:
                if (run_dir / name).is_file():
                    shutil.copy2(run_dir / name, staging / name)
        steps = [checkpoint_step(f) for f in folders]
        record = {
            "method": METHOD,
            "accumulation_dtype": "float64",
            "stored_dtype": sorted({str(t.dtype).removeprefix("torch.") for t in averaged.values()}),
            "num_checkpoints": len(folders),
            "steps": steps,
            "checkpoints": [
                {"name": f.name, "path": str(f.resolve()), "step": s} for f, s in zip(folders, steps, strict=True)
            ],
            "run": str(run_dir.resolve()) if run_dir is not None else None,
            "tokenizer_from": str(tokenizer_dir.resolve()),
            "created_by": "python -m training.average",
        }
        (staging / "averaging.json").write_text(json.dumps(record, indent=2) + "\n")
        follow_umask_in(staging)  # mkdtemp makes the folder private, safetensors its file
        if output_dir.exists():
            if not overwrite and any(output_dir.iterdir()):
                raise CheckpointError(f"--output_dir {output_dir} appeared while averaging: not replaced")
            shutil.rmtree(output_dir)
        staging.rename(output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output_dir


def run_folder_of(folders: Sequence[Path]) -> Path | None:
    """The run folder the checkpoints share, if they share one."""
    parents = {f.resolve().parent for f in folders}
    return parents.pop() if len(parents) == 1 else None
