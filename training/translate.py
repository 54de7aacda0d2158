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

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

from training.common.arguments import add_decoding_arguments, check_decoding_arguments, generate_overrides
from training.common.errors import add_debug_flag, problems_message, run_command
from training.common.files import follow_umask
from training.common.runtime import keep_freed_memory_for_reuse
from training.inference.translation import (
    DEFAULT_MAX_TOKENS,
    EvaluationError,
    load_model,
    translate_batched,
)

DEFAULT_MAX_SOURCE_TOKENS = 256
MAX_LISTED = 10  # line numbers named in one message


def split_lines(data: bytes) -> list[bytes]:
    """The lines of `data` without their line ends; a final newline does not start another line."""
    if not data:
        return []
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line.removesuffix(b"\r") for line in lines]


def _listed(numbers: list[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:MAX_LISTED])
    return shown + (f" and {len(numbers) - MAX_LISTED} more" if len(numbers) > MAX_LISTED else "")


def decode_lines(lines: list[bytes], source: str) -> list[str]:
    """Decode every line as UTF-8; EvaluationError naming every bad line (1-based) and its first bad byte."""
    texts, bad = [], []
    for number, raw in enumerate(lines, start=1):
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            bad.append((number, e.start, raw[e.start : e.start + 1]))
    if bad:
        first = "; ".join(f"line {n} at byte {pos} ({byte!r})" for n, pos, byte in bad[:MAX_LISTED])
        raise EvaluationError(
            f"{source} is not valid UTF-8 on line(s) {_listed([n for n, _, _ in bad])} ({first}); nothing translated"
        )
    if texts and texts[0].startswith("\ufeff"):  # a byte-order mark is not text
        texts[0] = texts[0][1:]
    return texts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training.translate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True, help="model folder (train/average output) or Hub model id")
    p.add_argument("-i", "--input", type=Path, help="input file (default: stdin)")
    p.add_argument("-o", "--output", type=Path, help="output file (default: stdout)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty --output file")
    p.add_argument(
        "--max_source_tokens",
        type=int,
        help=f"longest input in tokens, </s> included (default: {DEFAULT_MAX_SOURCE_TOKENS} or the tokenizer's "
        "model_max_length, whichever is smaller); longer lines are truncated with a warning",
    )
    p.add_argument("--strict", action="store_true", help="refuse (exit 2) instead of truncating a long line")
    add_decoding_arguments(p)
    p.add_argument("--batch_tokens", type=int, default=DEFAULT_MAX_TOKENS, help="source tokens per batch, padded")
    p.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no loading messages")
    add_debug_flag(p)
    return p


def check_arguments(args: argparse.Namespace) -> None:
    problems = check_decoding_arguments(args)
    if args.batch_tokens < 1:
        problems.append(f"--batch_tokens must be a positive integer, got {args.batch_tokens}")
    if args.max_source_tokens is not None and args.max_source_tokens < 2:
        problems.append(f"--max_source_tokens must be at least 2 (a token and </s>), got {args.max_source_tokens}")
    if args.input is not None and not args.input.is_file():
        problems.append(f"--input {args.input}: no such file")
    if args.output is not None:
        if args.output.is_dir():
            problems.append(f"--output {args.output} is a folder")
        elif args.input is not None and args.output.exists() and args.output.resolve() == args.input.resolve():
            problems.append(f"--output {args.output} is the input file")
        elif args.output.exists() and args.output.stat().st_size > 0 and not args.overwrite:
            problems.append(f"--output {args.output} exists and is not empty: pass --overwrite to replace it")
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


def translate_lines(args: argparse.Namespace) -> str:
    """Read, check, translate; returns the output text (one line per input line). Messages go to stderr."""
    source = str(args.input) if args.input is not None else "stdin"
    raw = args.input.read_bytes() if args.input is not None else sys.stdin.buffer.read()
    texts = decode_lines(split_lines(raw), source)
    if args.quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    model, tokenizer = load_model(args.model, args.device, args.cpu_kernel)
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
        generate_kwargs=generate_overrides(args),
        max_source_tokens=limit,
        progress=not args.quiet,
    )
    return "".join(h + "\n" for h in hypotheses)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        check_arguments(args)
        keep_freed_memory_for_reuse()  # training/common/runtime.py: ~20% faster CPU beam search
        with contextlib.redirect_stdout(sys.stderr):  # whatever a library prints must not mix with translations
            text = translate_lines(args)
    except EvaluationError as e:
        raise SystemExit(f"error: {e}") from None
    write_output(text, args.output)


if __name__ == "__main__":
    run_command(main)
