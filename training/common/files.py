"""Files: the ones we write get the permissions the user's umask gives, as any other program's would; the text files
we read are UTF-8, and a line that is not is named (`read_lines`).

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
