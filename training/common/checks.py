"""Checks of settings shared by the commands and the library, each with one wording of its message. Imports
nothing, so that any module can use them without slowing `--help`."""

from __future__ import annotations

from numbers import Integral
from typing import Any


def positive_integer_problem(name: str, value: Any, minimum: int = 1, why: str = "") -> str | None:
    """The message for an integer setting below `minimum` (or not an integer at all: a bool, a float), else None:
    one wording for every command and library check ("NAME must be a positive integer, got V"). numpy integers
    count as integers."""
    if isinstance(value, Integral) and not isinstance(value, bool) and value >= minimum:
        return None
    if minimum == 1:
        return f"{name} must be a positive integer, got {value!r}{why}"
    return f"{name} must be at least {minimum}{why}, got {value!r}"


def require_positive_integer(name: str, value: Any, why: str = "") -> int:
    """`value` as an int; ValueError with `positive_integer_problem`'s message unless it is a positive integer."""
    if problem := positive_integer_problem(name, value, why=why):
        raise ValueError(problem)
    return int(value)


def language_problem(source_lang: str, target_lang: str, prefix: str = "--") -> str | None:
    """The one check of a language pair: the two keys must differ (a corpus row maps each language to its text)."""
    if source_lang == target_lang:
        return f"{prefix}source_lang and {prefix}target_lang are both {source_lang!r}"
    return None
