"""One clear line for a bad input: how every command (`train`, `average`, `evaluate`, `translate`, `publish`) ends
when a file, a setting or the network is wrong.

Each command's `main()` raises exceptions whose message names the file and the problem (the commands wrap the
libraries' own: safetensors headers, config field types, empty or misaligned data files, an unreachable Hub).
`run_command` prints that message as `error: ...` on stderr and exits with status 2, without a traceback;
`--debug` shows the traceback instead. Only this module imports nothing heavy, so that `--help` stays fast:
every command parses its arguments before it imports torch or transformers (tests/test_cli_errors.py).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

EXIT_BAD_INPUT = 2  # argparse's status for a bad command line; ours for any bad input

# Exception type names (by module) that mean "a bad input", matched by name so that this module imports none of
# the libraries; see `is_bad_input`.
LIBRARY_INPUT_ERRORS = {
    "safetensors._safetensors_rust": ("SafetensorError",),
    "huggingface_hub.errors": (
        "StrictDataclassError",
        "HfHubHTTPError",
        "LocalEntryNotFoundError",
        "HFValidationError",
    ),
    "datasets.exceptions": ("DatasetGenerationError", "DatasetNotFoundError"),
}
# the HTTP libraries' names for "the server could not be reached" (huggingface_hub uses httpx2; datasets requests)
NETWORK_ERRORS = ("ConnectionError", "ConnectError", "ConnectTimeout", "TransportError", "TimeoutException", "Timeout")
HTTP_LIBRARIES = ("httpx", "httpx2", "requests", "urllib3", "aiohttp")


def problems_message(title: str, problems: Sequence[str]) -> str:
    """One problem as one line; several under `title`, one a line."""
    return problems[0] if len(problems) == 1 else "\n  ".join([f"{title}:", *problems])


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--debug", action="store_true", help="on an error, show the full traceback instead of one line (exit status 2)"
    )


def is_bad_input(error: BaseException) -> bool:
    """Whether `error` says that an input (file, setting, folder, network) is bad, rather than that our code is."""
    if isinstance(error, ValueError | OSError):  # ours (ValueError subclasses), and the standard library's for files
        return True
    for cls in type(error).__mro__:
        if cls.__name__ in LIBRARY_INPUT_ERRORS.get(cls.__module__, ()):
            return True
    return is_network_error(error)


def is_network_error(error: BaseException) -> bool:
    """Whether `error` (or what it wraps) says that a server could not be reached."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ConnectionError | TimeoutError):
            return True
        for cls in type(error).__mro__:
            if cls.__module__.split(".")[0] in HTTP_LIBRARIES and cls.__name__ in NETWORK_ERRORS:
                return True
        error = error.__cause__ or error.__context__
    return False


def one_line(error: BaseException | str) -> str:
    """`error: <message>`; an OSError's message gets its file name where it lacks it."""
    text = str(error).strip()
    if isinstance(error, OSError) and error.filename is not None and str(error.filename) not in text:
        text = f"{error.filename}: {text}"
    if not text and isinstance(error, BaseException):
        text = type(error).__name__
    return text if text.startswith("error:") else f"error: {text}"


def run_command(main: Callable[[list[str]], Any], argv: Sequence[str] | None = None) -> None:
    """Run a command's `main(argv)`; a bad input ends it with one line on stderr and exit status 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        main(argv)
    except SystemExit as error:
        if not isinstance(error.code, str):  # --help, argparse's usage errors (status 2), a plain exit
            raise
        if debug:  # our own `raise SystemExit("message")`
            traceback.print_exc()
        print(one_line(error.code), file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
    except Exception as error:
        if debug or not is_bad_input(error):
            raise
        print(one_line(error), file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
