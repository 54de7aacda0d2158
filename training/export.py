"""Export a model folder for serving: through transformers' own exporters (ONNX, ExecuTorch, OpenVINO,
torch.export) or to CTranslate2, from one command.

    python -m training.export runs/tiny --format onnx --output_dir runs/tiny-onnx
    python -m training.export runs/tiny --format onnx --quantization int8 --output_dir runs/tiny-onnx-int8
    python -m training.export runs/tiny --format ctranslate2 --quantization int8 --output_dir runs/tiny-ct2
    python -m training.export runs/tiny --format dynamo|executorch|openvino --output_dir DIR
    python -m training.export runs/tiny --format onnx --cache_implementation static --max_cache_len 128 --output_dir DIR

transformers' exporters (`transformers.exporters`) write three programs: `encoder` (source → encoder states),
`prefill` (the first decoder step: fills the cross-attention cache) and `decode` (one step on an
`EncoderDecoderCache`), each with the pre-softmax linear inside, dynamic in batch, source and cache length;
`export.json` names them. `--cache_implementation static --max_cache_len N` traces the decoder programs on a
static self-attention cache of N positions instead (transformers' `StaticCache`; the export's generation config
says so, and its `generate()` refuses a call that could outgrow N before the first decoder step). Next to them:
config.json with the code files (so the folder loads as remote code), generation_config.json (the paper's
decoding) and the tokenizer. `ExportedForGeneration` runs `generate()` on
those programs, greedy and beam search. CTranslate2 gets its own model directory
(model.bin, shared_vocabulary.json, its config.json), the tokenizer and generation_config.json;
`ctranslate2_options` maps the generation config to `translate_batch` arguments as far as CTranslate2 can.
"""

# no `from __future__ import annotations`: run as __main__, the dataclass's annotations must be types (HfArgumentParser)

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from training.common.arguments import command_parser, parse_command
from training.common.errors import run_command
from training.serving.formats import CACHE_IMPLEMENTATIONS, CT2_QUANTIZATIONS, FORMATS, ExportError, check_cache

# torch and the exporters load in `main`, once the arguments are parsed (tests/test_cli_errors.py)


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _human(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"


@dataclass
class ExportArguments:
    format: str = field(metadata={"choices": FORMATS, "help": "the serving format"})
    output_dir: Path = field(metadata={"help": "the folder to write"})
    quantization: str | None = field(
        default=None,
        metadata={
            "help": f"ctranslate2: {' | '.join(CT2_QUANTIZATIONS)}; onnx: int8 (onnxruntime dynamic quantization)"
        },
    )
    cache_implementation: str = field(
        default="dynamic",
        metadata={
            "choices": CACHE_IMPLEMENTATIONS,
            "help": "the decoder programs' self-attention cache: dynamic (grows) or static (fixed --max_cache_len)",
        },
    )
    max_cache_len: int | None = field(
        default=None,
        metadata={"help": "static cache: its length, at least 1 + the longest output (|source| + 50, paper's rule)"},
    )
    overwrite: bool = field(default=False, metadata={"help": "write into a non-empty --output_dir"})


def build_parser() -> HfArgumentParser:
    parser = command_parser("python -m training.export", __doc__, [ExportArguments])
    # MODEL is positional, as documented (`export MODEL --format onnx`): a dataclass field can only be a --flag
    parser.add_argument("model", help="a model folder (training.train's output) or a Hub id")
    return parser


def main(argv: list[str] | None = None) -> list[Path]:
    args, positional = parse_command(build_parser(), argv)
    log = lambda message: print(message, file=sys.stderr)  # noqa: E731
    try:
        check_cache(args.format, args.cache_implementation, args.max_cache_len)  # before torch loads
        from training.serving.programs import export_folder

        with contextlib.redirect_stdout(sys.stderr):  # exporters print progress; stdout carries the summary
            files = export_folder(
                positional.model,
                args.format,
                args.output_dir,
                args.quantization,
                args.overwrite,
                log,
                max_cache_len=args.max_cache_len if args.cache_implementation == "static" else None,
            )
    except ExportError as e:
        raise SystemExit(f"error: {e}") from None
    root = Path(args.output_dir)
    for path in files:
        print(f"{_human(_size(path)):>10}  {path.relative_to(root)}")
    print(f"{_human(sum(_size(p) for p in files)):>10}  in all, {len(files)} files in {root}")
    return files


if __name__ == "__main__":
    run_command(main)
