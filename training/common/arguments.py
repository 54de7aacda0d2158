"""Command-line arguments: every command parses them with transformers' `HfArgumentParser` over dataclasses, and
the flags several commands share are defined here once (`DecodingArguments`: `evaluate`, `translate`).

HfArgumentParser imports transformers but not torch, so `--help` and a bad command line are still answered before
torch loads (tests/test_cli_errors.py). A `bool` field is a flag that also takes a value (`--overwrite`,
`--overwrite false`). Limits that argparse cannot state (a positive integer) are listed in each dataclass's
`MINIMUMS` and checked, all at once, by `minimum_problems` before any work.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from transformers import HfArgumentParser

from training.common.checks import positive_integer_problem
from training.common.errors import add_debug_flag

# the names of modeling_vaswani's CPU_KERNELS, spelled here because importing the model loads torch (which --help
# must not); tests/test_evaluate.py asserts that they are the same names in the same order
CPU_KERNEL_NAMES = ("auto", "onednn", "int8", "aten")


def command_parser(prog: str, doc: str | None, dataclass_types: Sequence[type]) -> HfArgumentParser:
    """The parser of one command: its dataclasses' flags, `--debug`, and the module docstring (with its runnable
    examples) shown as written by `--help`."""
    parser = HfArgumentParser(
        dataclass_types, prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_debug_flag(parser)
    return parser


def parse_command(parser: HfArgumentParser, argv: Sequence[str] | None) -> tuple[Any, ...]:
    """The dataclasses of `parser`, in its order, then a namespace of the flags added by hand (`--debug`, and any
    positional argument). An unknown flag is argparse's usage error (exit status 2), as before; no `.args` file is
    read."""
    *parsed, remaining = parser.parse_args_into_dataclasses(
        args=None if argv is None else list(argv), return_remaining_strings=True, look_for_args_file=False
    )
    if remaining:
        parser.error(f"unrecognized arguments: {' '.join(remaining)}")
    return tuple(parsed)


def minimum_problems(*arguments: Any) -> list[str]:
    """Every field named in a dataclass's `MINIMUMS` ({name: minimum or (minimum, why)}) that is given and below
    its minimum, as `--name ...` messages."""
    problems = []
    for args in arguments:
        for name, limit in getattr(args, "MINIMUMS", {}).items():
            minimum, why = limit if isinstance(limit, tuple) else (limit, "")
            value = getattr(args, name)
            if value is not None:
                problem = positive_integer_problem(f"--{name}", value, minimum, why)
                if problem:
                    problems.append(problem)
    return problems


@dataclass
class DecodingArguments:
    """The decoding flags of `evaluate` and `translate`: unset ones leave the model's generation_config.json."""

    _argument_group_name = "decoding (default: the model's generation_config.json; the paper's is §6.1)"
    MINIMUMS: ClassVar[dict[str, int]] = {"num_beams": 1, "max_new_tokens": 1, "max_length_over_source": 1}
    GENERATE_FIELDS: ClassVar[tuple[str, ...]] = (
        "num_beams",
        "length_penalty",
        "length_penalty_rule",
        "max_new_tokens",
        "max_length_over_source",
    )

    num_beams: int | None = field(default=None, metadata={"help": "beam size (paper: 4); 1 is greedy"})
    length_penalty: float | None = field(default=None, metadata={"help": "α of the length penalty (paper: 0.6)"})
    length_penalty_rule: Literal["gnmt", "transformers"] | None = field(
        default=None,
        metadata={"help": "gnmt: score / ((5 + |Y|) / 6)^α (the paper's); transformers: score / |Y|^α"},
    )
    max_new_tokens: int | None = field(default=None, metadata={"help": "a fixed output limit instead of |source| + N"})
    max_length_over_source: int | None = field(
        default=None, metadata={"help": "N of the |source| + N output limit (paper: 50)"}
    )
    cpu_kernel: Literal[CPU_KERNEL_NAMES] | None = field(  # type: ignore[valid-type]
        default=None,
        metadata={
            "help": "linear layers on CPU: auto (default: per shape, the faster of onednn and aten on this CPU, "
            "timed at first use), onednn (exact fp32), int8 (dynamic quantization: faster, approximate), aten "
            "(torch's matmul)"
        },
    )

    def problems(self) -> list[str]:
        return minimum_problems(self)

    def generate_overrides(self) -> dict[str, Any]:
        """The decoding flags the user gave, as `generate` keyword arguments (`cpu_kernel` is not one: it is set on
        the model when it loads)."""
        return {name: getattr(self, name) for name in self.GENERATE_FIELDS if getattr(self, name) is not None}
