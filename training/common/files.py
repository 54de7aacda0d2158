"""Files: the ones we write get the permissions the user's umask gives, as any other program's would; the text files
we read are UTF-8, and a line that is not is named (`read_lines`); the project's own files (`configuration/*.json`,
`model_card.md`) are found in a checkout or an install (`project_file`).

safetensors creates its files with mode 0600 whatever the umask, so a model folder saved by one user could not be
read by the group that shares it; `follow_umask` puts such files back to 0666 & ~umask (folders 0777 & ~umask).
tests/test_cli_errors.py checks the saved folders of train, average and publish.
"""

from __future__ import annotations

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


def read_lines(path: Path, what: str) -> list[str]:
    """The lines of a UTF-8 text file (no line-end characters); ValueError naming the file and line if the
    file is missing or not UTF-8."""
    if not path.is_file():
        raise ValueError(f"{what} {path}: no such file")
    lines = []
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        try:
            lines.append(raw.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as e:
            raise ValueError(f"{what} {path}, line {number}: not UTF-8 ({e.reason} at byte {e.start})") from None
    if lines and lines[-1] == "":  # the newline that ends the last line
        lines.pop()
    if lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]
    return lines


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
