"""Command-line arguments shared by the commands that decode (`evaluate`, `translate`): defined once."""

from __future__ import annotations

import argparse
from typing import Any


def generate_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The decoding flags the user gave, as `generate` keyword arguments."""
    names = ("num_beams", "length_penalty", "length_penalty_rule", "max_new_tokens", "max_length_over_source")
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """--num_beams, --length_penalty, --length_penalty_rule, --max_new_tokens, --max_length_over_source."""
    g = parser.add_argument_group("decoding (default: the model's generation_config.json; the paper's is §6.1)")
    g.add_argument("--num_beams", type=int, help="beam size (paper: 4); 1 is greedy")
    g.add_argument("--length_penalty", type=float, help="α of the length penalty (paper: 0.6)")
    g.add_argument(
        "--length_penalty_rule",
        choices=("gnmt", "transformers"),
        help="gnmt: score / ((5 + |Y|) / 6)^α (the paper's); transformers: score / |Y|^α",
    )
    g.add_argument("--max_new_tokens", type=int, help="a fixed output limit instead of |source| + N")
    g.add_argument("--max_length_over_source", type=int, help="N of the |source| + N output limit (paper: 50)")
    g.add_argument(
        "--cpu_kernel",
        choices=("auto", "onednn", "int8", "aten"),
        help="linear layers on CPU: auto (default: per shape, the faster of onednn and aten on this CPU, timed at "
        "first use), onednn (exact fp32), int8 (dynamic quantization: faster, approximate), aten (torch's matmul)",
    )


def check_decoding_arguments(args: argparse.Namespace) -> list[str]:
    problems = []
    for name in ("num_beams", "max_new_tokens", "max_length_over_source"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            problems.append(f"--{name} must be a positive integer, got {value}")
    return problems
