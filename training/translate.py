"""Translate text line by line: exactly one output line per input line, always.

    python -m training.translate --model runs/tiny-avg5 < input.en > output.de
    python -m training.translate --model runs/tiny-avg5 -i input.en -o output.de --num_beams 1
    python -m training.translate --model runs/tiny-avg5 -i input.en -o output.de --cpu_kernel int8  # faster CPU
    python -m training.translate --model USER/vaswani-tiny-en-de < input.en > output.de     # from the Hub
    # tiny, on CPU in seconds
    printf 'I bought five books.\\n\\non Monday\\n' | python -m training.translate --model runs/tiny

Input is UTF-8 text, one sentence a line; output is UTF-8, one translation a line, in the input's order.
- An empty or whitespace-only line gives an empty line (it is not sent to the model).
- A line longer than `--max_source_tokens` tokens (`</s>` included; default: 256 or the tokenizer's
  `model_max_length`, whichever is smaller) is translated after truncation to that many tokens, with a warning
  on stderr naming the line; with `--strict` the command refuses instead and translates nothing (exit 2).
- Invalid UTF-8 is reported with its line number(s) and nothing is translated (exit 2).
- Any bad input (a model folder that does not load, unreadable weights, a bad config.json) ends with one line
  `error: ...` on stderr and exit status 2; `--debug` shows the traceback.
- The decoding is the model's generation config (the paper's: beam 4, GNMT α = 0.6, |source| + 50) unless
  `--num_beams`, `--length_penalty`, `--length_penalty_rule`, `--max_new_tokens` or `--max_length_over_source`
  say otherwise. Lines are sorted by length into batches of at most `--batch_tokens` source tokens.
- stdout carries the translations only: the progress bar, warnings and loading messages go to stderr.
"""

# no `from __future__ import annotations`: run as __main__, dataclasses must see ClassVar as a type, not a string
import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from transformers import HfArgumentParser

from training.common.arguments import DecodingArguments, command_parser, minimum_problems, parse_command
from training.common.errors import problems_message, run_command
from training.common.files import MAX_LISTED, decode_lines, follow_umask, output_problem
from training.common.runtime import keep_freed_memory_for_reuse
from training.inference.translation import (
    DEFAULT_MAX_TOKENS,
    EvaluationError,
    load_model,
    translate_batched,
)

DEFAULT_MAX_SOURCE_TOKENS = 256


@dataclass
class TranslateArguments:
    MINIMUMS: ClassVar[dict[str, Any]] = {"max_source_tokens": (2, " (a token and </s>)"), "batch_tokens": 1}

    model: str = field(metadata={"help": "model folder (train/average output) or Hub model id"})
    input: Path | None = field(default=None, metadata={"aliases": ["-i"], "help": "input file (default: stdin)"})
    output: Path | None = field(default=None, metadata={"aliases": ["-o"], "help": "output file (default: stdout)"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing, non-empty --output file"})
    max_source_tokens: int | None = field(
        default=None,
        metadata={
            "help": f"longest input in tokens, </s> included (default: {DEFAULT_MAX_SOURCE_TOKENS} or the "
            "tokenizer's model_max_length, whichever is smaller); longer lines are truncated with a warning"
        },
    )
    strict: bool = field(default=False, metadata={"help": "refuse (exit 2) instead of truncating a long line"})
    batch_tokens: int = field(default=DEFAULT_MAX_TOKENS, metadata={"help": "source tokens per batch, padded"})
    device: str | None = field(default=None, metadata={"help": "cpu, cuda, cuda:1, ... (default: cuda if available)"})
    quiet: bool = field(default=False, metadata={"help": "no progress bar, no loading messages"})


def build_parser() -> HfArgumentParser:
    return command_parser("python -m training.translate", __doc__, (TranslateArguments, DecodingArguments))


def check_arguments(args: TranslateArguments, decoding: DecodingArguments) -> None:
    problems = minimum_problems(args, decoding)
    if args.input is not None and not args.input.is_file():
        problems.append(f"--input {args.input}: no such file")
    if args.output is not None:
        if args.input is not None and args.output.is_file() and args.output.resolve() == args.input.resolve():
            problems.append(f"--output {args.output} is the input file")
        else:
            problems += filter(None, [output_problem(args.output, "--output", args.overwrite, kind="file")])
    if problems:
        raise EvaluationError(problems_message("bad arguments", problems))


def write_output(text: str, output: Path | None) -> None:
    data = text.encode("utf-8")
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        follow_umask([tmp])  # mkstemp makes it 0600
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def translate_lines(args: TranslateArguments, decoding: DecodingArguments) -> str:
    """Read, check, translate; returns the output text (one line per input line). Messages go to stderr."""
    source = str(args.input) if args.input is not None else "stdin"
    raw = args.input.read_bytes() if args.input is not None else sys.stdin.buffer.read()
    try:
        texts = decode_lines(raw, source)
    except ValueError as e:  # every line that is not UTF-8, named
        raise EvaluationError(f"{e}; nothing translated") from None
    if args.quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    model, tokenizer = load_model(args.model, args.device, decoding.cpu_kernel)
    limit = args.max_source_tokens
    if limit is None:
        limit = min(DEFAULT_MAX_SOURCE_TOKENS, tokenizer.model_max_length or DEFAULT_MAX_SOURCE_TOKENS)
    nonblank = [i for i, text in enumerate(texts) if text.strip()]
    lengths = [len(ids) for ids in tokenizer([texts[i].strip() for i in nonblank])["input_ids"]] if nonblank else []
    too_long = [(i + 1, n) for i, n in zip(nonblank, lengths, strict=True) if n > limit]
    if too_long and args.strict:
        named = ", ".join(f"line {line} ({n} tokens)" for line, n in too_long[:MAX_LISTED])
        raise EvaluationError(
            f"--strict: {len(too_long)} line(s) longer than --max_source_tokens {limit}: {named}"
            + (f" and {len(too_long) - MAX_LISTED} more" if len(too_long) > MAX_LISTED else "")
            + "; nothing translated"
        )
    for line, n in too_long:
        print(
            f"warning: line {line} has {n} tokens, more than --max_source_tokens {limit}: "
            f"translated after truncation to its first {limit} tokens",
            file=sys.stderr,
        )
    hypotheses = translate_batched(
        model,
        tokenizer,
        texts,
        max_tokens=args.batch_tokens,
        generate_kwargs=decoding.generate_overrides(),
        max_source_tokens=limit,
        progress=not args.quiet,
    )
    return "".join(h + "\n" for h in hypotheses)


def main(argv: list[str] | None = None) -> None:
    args, decoding, _ = parse_command(build_parser(), argv)
    try:
        check_arguments(args, decoding)
        keep_freed_memory_for_reuse()  # training/common/runtime.py: ~20% faster CPU beam search
        with contextlib.redirect_stdout(sys.stderr):  # whatever a library prints must not mix with translations
            text = translate_lines(args, decoding)
    except EvaluationError as e:
        raise SystemExit(f"error: {e}") from None
    write_output(text, args.output)


if __name__ == "__main__":
    run_command(main)
