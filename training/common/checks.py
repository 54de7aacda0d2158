"""Checks of settings shared by the commands and the library, each with one wording of its message. Imports
nothing, so that any module can use them without slowing `--help`."""

from __future__ import annotations

from typing import Any


def positive_integer_problem(name: str, value: Any, minimum: int = 1, why: str = "") -> str | None:
    """The message for an integer setting below `minimum` (or not an integer at all), else None: one wording for
    every command and library check ("NAME must be a positive integer, got V")."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        return None
    if minimum == 1:
        return f"{name} must be a positive integer, got {value!r}{why}"
    return f"{name} must be at least {minimum}{why}, got {value!r}"


def language_problem(source_lang: str, target_lang: str, prefix: str = "--") -> str | None:
    """The one check of a language pair: the two keys must differ (a corpus row maps each language to its text)."""
    if source_lang == target_lang:
        return f"{prefix}source_lang and {prefix}target_lang are both {source_lang!r}"
    return None
