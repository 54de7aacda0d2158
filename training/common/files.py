"""Files: the ones we write get the permissions the user's umask gives, as any other program's would; the text files
we read are UTF-8, and a line that is not is named (`decode_lines`); an output that exists is replaced only with
--overwrite (`output_problem`); the project's own files (`configuration/*.json`, `model_card.md`) are found in a
checkout or an install (`project_file`).

safetensors creates its files with mode 0600 whatever the umask, so a model folder saved by one user could not be
read by the group that shares it; `follow_umask` puts such files back to 0666 & ~umask (folders 0777 & ~umask).
tests/test_cli_errors.py checks the saved folders of train, average and publish.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(paths: Iterable[str | os.PathLike]) -> None:
    """chmod each file to 0666 & ~umask and each folder to 0777 & ~umask; folders are not recursed into."""
    mask = current_umask()
    for path in paths:
        path = Path(path)
        if path.is_symlink() or not path.exists():
            continue
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def follow_umask_in(folder: str | os.PathLike) -> None:
    """`follow_umask` for a folder and everything in it."""
    folder = Path(folder)
    follow_umask([folder, *folder.rglob("*")])


MAX_LISTED = 10  # bad lines named in one message


def split_lines(data: bytes) -> list[bytes]:
    """The lines of `data` without their line ends (\n or \r\n); a final newline does not start another line."""
    lines = data.split(b"\n")
    if lines[-1] == b"":  # the newline that ends the last line (or no data at all)
        lines.pop()
    return [line.removesuffix(b"\r") for line in lines]


def decode_lines(data: bytes, name: str) -> list[str]:
    """The lines of UTF-8 `data` (`split_lines`), a leading byte-order mark dropped; ValueError naming `name` and
    every line that is not UTF-8 (1-based; the first MAX_LISTED with the offending byte), so that nothing is
    processed from a half-readable file. Tests: tests/test_translate.py, tests/test_evaluate.py."""
    texts, bad = [], []
    for number, raw in enumerate(split_lines(data), start=1):
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            bad.append((number, e))
    if len(bad) == 1:
        number, e = bad[0]
        raise ValueError(
            f"{name}, line {number}: not UTF-8 ({e.reason} at byte {e.start}, {e.object[e.start : e.start + 1]!r})"
        )
    if bad:
        numbers = ", ".join(str(n) for n, _ in bad[:MAX_LISTED])
        more = f" and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
        first = "; ".join(
            f"line {n} at byte {e.start} ({e.object[e.start : e.start + 1]!r})" for n, e in bad[:MAX_LISTED]
        )
        raise ValueError(f"{name} is not valid UTF-8 on line(s) {numbers}{more} ({first})")
    if texts and texts[0].startswith("\ufeff"):  # a byte-order mark is not text
        texts[0] = texts[0][1:]
    return texts


def read_lines(path: Path, what: str) -> list[str]:
    """The lines of a UTF-8 text file (`decode_lines`); ValueError naming `what` and the file if it is missing or
    not UTF-8."""
    if not path.is_file():
        raise ValueError(f"{what} {path}: no such file")
    return decode_lines(path.read_bytes(), f"{what} {path}")


def output_problem(path: Path, flag: str, overwrite: bool, kind: str = "folder") -> str | None:
    """Why `path` cannot take a command's output (`kind` "folder" or "file"), or None: the other kind stands there,
    or it exists and is not empty and `overwrite` is off. The one wording of every command's check (the message
    is asserted by tests/test_cli_errors.py)."""
    if path.exists() and path.is_dir() != (kind == "folder"):
        return f"{flag} {path} is a {'file' if kind == 'folder' else 'folder'}"
    empty = not any(path.iterdir()) if path.is_dir() else not path.exists() or path.stat().st_size == 0
    if not empty and not overwrite:
        return f"{flag} {path} exists and is not empty: pass --overwrite to replace it"
    return None


WEIGHTS, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"
# every file a tokenizer's save_pretrained may write: averaging copies those present into the averaged folder. This
# project's tokenizer (a PreTrainedTokenizerFast) writes and loads from the first two: a model folder has one of
# them, an upload folder both (training/hub/upload.py)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "sentencepiece.bpe.model",
    "spiece.model",
    "chat_template.jinja",
)
FAST_TOKENIZER_FILES = TOKENIZER_FILES[:2]


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files a model folder names: `model.safetensors`, else the shards its index lists (whether
    present or not); [] when it has neither. The callers say what is missing in their own terms (averaging:
    `checkpoint_weights`; publishing: `check_model_folder`)."""
    if (folder / WEIGHTS).is_file():
        return [folder / WEIGHTS]
    if (folder / WEIGHTS_INDEX).is_file():
        try:
            index = json.loads((folder / WEIGHTS_INDEX).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{folder / WEIGHTS_INDEX} is not valid JSON: {error}") from None
        return [folder / name for name in sorted(set(index.get("weight_map", {}).values()))]
    return []


DATA_DIR = "share/vaswani-transformer"  # where setup.cfg's data_files put configuration/ and model_card.md


def project_file(path: str | os.PathLike, *, given_first: bool = True) -> Path:
    """`path` as given when it exists (relative to the working folder, as every command line means it; skipped with
    `given_first=False`, for a default); else, for a relative path such as `configuration/recipe_small.json` or
    `model_card.md`, the checkout's copy, then the copy `pip install` put under `DATA_DIR` (tests/test_install.py).
    A path found nowhere comes back unchanged, so the caller's "no such file" message names what the user gave."""
    given = Path(path)
    if given.is_absolute() or (given_first and given.exists()):
        return given
    checkout = Path(__file__).resolve().parents[2] / given
    if checkout.exists():
        return checkout
    import site
    import sys
    from importlib import metadata

    try:
        dist = metadata.distribution("vaswani-transformer")
    except metadata.PackageNotFoundError:
        return given
    wanted = f"{DATA_DIR}/{given.as_posix()}"
    # where the wheel's record says (a venv or system install: the prefix's share/), then the other places pip puts
    # data files: beside the packages (--target), the interpreter's prefix, the user base (--user)
    recorded = [Path(f.locate()) for f in dist.files or [] if f.as_posix().endswith(wanted)]
    roots = [Path(str(dist.locate_file(""))), Path(sys.prefix), Path(site.getuserbase())]
    for candidate in [*recorded, *(root / wanted for root in roots)]:
        if candidate.is_file():
            return candidate.resolve()
    return given
