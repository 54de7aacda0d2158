"""Translate a test set with a model folder (or Hub model) and score it: sacreBLEU with its signature, and chrF.

    # the paper's decoding (the model's generation config: beam 4, GNMT α = 0.6, at most |source| + 50 tokens)
    python -m training.evaluate --model runs/tiny-avg5 --dataset_name default --output_dir runs/tiny-avg5/eval
    # local test files: JSON lines / TSV / a Moses prefix (test_2016_flickr.en + .de), or plain line-aligned files
    python -m training.evaluate --model runs/multi30k-avg5 --test_file ../shared/data/multi30k/test_2016_flickr \\
        --source_lang en --target_lang de --output_dir runs/multi30k-avg5/eval-test2016
    python -m training.evaluate --model runs/tiny --source_file newstest.en --reference_file newstest.de \\
        --output_dir runs/tiny/eval-news
    # other decoding: greedy, transformers' length penalty |Y|^α, a fixed output limit
    python -m training.evaluate --model runs/tiny --dataset_name default --num_beams 1 --output_dir runs/tiny/greedy
    python -m training.evaluate --model runs/tiny --dataset_name default --length_penalty_rule transformers \\
        --length_penalty 1.0 --max_new_tokens 64 --output_dir runs/tiny/lp1
    # tiny, on CPU in seconds: 20 sentences of the default corpus's test split, greedy
    python -m training.evaluate --model runs/tiny --dataset_name default --max_samples 20 --num_beams 1 \\
        --output_dir /tmp/eval-demo

Writes `OUTPUT_DIR/hypotheses.txt` (one detokenized translation per source line, in the test set's order) and
`OUTPUT_DIR/scores.json` (BLEU and its sacreBLEU signature, chrF and its signature, the decoding settings used,
the model, the data, the number of sentences, wall time, sentences/s and tokens/s), and prints a small table.
Sources are sorted by length and cut into batches of at most `--max_tokens` source tokens (padding counted) so
that padding is small; the output is put back in the original order. Decoding is deterministic: a repeat run
gives the same hypotheses and scores.

From Python (the same code path, training/evaluation/scoring.py):

    from training.inference.translation import load_model
    from training.evaluation.scoring import evaluate_model
    model, tokenizer = load_model("runs/tiny")
    result = evaluate_model(model, tokenizer, sources, references, max_tokens=4000, generate_kwargs={})
    result["bleu"], result["signature"], result["hypotheses"]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.common.arguments import add_decoding_arguments, check_decoding_arguments, generate_overrides
from training.common.errors import add_debug_flag, problems_message, run_command
from training.common.files import read_lines
from training.common.runtime import keep_freed_memory_for_reuse
from training.evaluation.scoring import evaluate_model
from training.inference.translation import DEFAULT_MAX_TOKENS, EvaluationError, load_model

# torch, transformers and the metrics load inside the functions that use them: `--help` and a bad command line are
# answered without them (tests/test_cli_errors.py)


# --------------------------------------------------------------------------------------------------------------
# evaluation


def load_test_set(args: argparse.Namespace) -> tuple[list[str], list[str], dict[str, Any]]:
    """(sources, references, description of the data) from the command-line data options."""
    if args.source_file or args.reference_file:
        if not (args.source_file and args.reference_file):
            raise EvaluationError("--source_file and --reference_file go together: give both")
        try:
            sources = read_lines(args.source_file, "--source_file")
            references = read_lines(args.reference_file, "--reference_file")
        except ValueError as e:  # a missing file or a line that is not UTF-8, named
            raise EvaluationError(str(e)) from None
        if len(sources) != len(references):
            raise EvaluationError(
                f"--source_file {args.source_file} has {len(sources)} lines but --reference_file "
                f"{args.reference_file} has {len(references)}: they must be line-aligned"
            )
        data = {"source_file": str(args.source_file), "reference_file": str(args.reference_file)}
    else:
        from training.data.parallel import load_parallel

        split = args.split or "test"
        try:
            if args.test_file:
                ds = load_parallel(test_file=args.test_file, source_lang=args.source_lang, target_lang=args.target_lang)
                split = "test"
                data = {"test_file": str(args.test_file)}
            else:
                ds = load_parallel(
                    args.dataset_name,
                    args.dataset_config,
                    source_lang=args.source_lang,
                    target_lang=args.target_lang,
                    splits=[split],
                )
                data = {"dataset_name": args.dataset_name, "dataset_config": args.dataset_config, "split": split}
        except (ValueError, FileNotFoundError) as e:
            raise EvaluationError(str(e)) from e
        rows = ds[split]["translation"]
        sources = [row[args.source_lang] or "" for row in rows]
        references = [row[args.target_lang] or "" for row in rows]
    if args.max_samples is not None:
        sources, references = sources[: args.max_samples], references[: args.max_samples]
        data["max_samples"] = args.max_samples
    if not sources:
        raise EvaluationError(f"the test set is empty: {data}")
    data.update(source_lang=args.source_lang, target_lang=args.target_lang)
    return sources, references, data


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training.evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True, help="model folder (train/average output) or Hub model id")
    p.add_argument("--output_dir", type=Path, required=True, help="folder for hypotheses.txt and scores.json")
    p.add_argument("--overwrite", action="store_true", help="replace hypotheses.txt/scores.json in a non-empty folder")
    d = p.add_argument_group("test data (give one)")
    d.add_argument("--dataset_name", help='"default" (the offline corpus), a Hub translation dataset or a folder')
    d.add_argument("--dataset_config", help="the Hub dataset's configuration, e.g. de-en")
    d.add_argument("--split", help="split of --dataset_name (default: test)")
    d.add_argument("--test_file", type=Path, help="local test data: .jsonl, .tsv or a Moses prefix")
    d.add_argument("--source_file", type=Path, help="plain text, one source sentence a line (with --reference_file)")
    d.add_argument("--reference_file", type=Path, help="plain text, one reference a line, aligned with --source_file")
    d.add_argument("--source_lang", default="en", help="source language key (default en)")
    d.add_argument("--target_lang", default="de", help="target language key (default de)")
    d.add_argument("--max_samples", type=int, help="only the first N sentences")
    add_decoding_arguments(p)
    r = p.add_argument_group("running")
    r.add_argument(
        "--max_tokens", type=int, default=DEFAULT_MAX_TOKENS, help="source tokens per batch, padding counted"
    )
    r.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    add_debug_flag(p)
    return p


def check_arguments(args: argparse.Namespace) -> None:
    """Every problem of the command line at once, before the model or the data is loaded."""
    problems = check_decoding_arguments(args)
    given = [name for name in ("dataset_name", "test_file", "source_file") if getattr(args, name)]
    if args.reference_file and not args.source_file:
        given.append("reference_file")
    if len(given) != 1:
        problems.append(
            "give exactly one test set: --dataset_name NAME (e.g. default), --test_file PATH, or --source_file "
            "SRC.txt with --reference_file REF.txt" + (f" (got {', '.join('--' + g for g in given)})" if given else "")
        )
    if args.split and not args.dataset_name:
        problems.append("--split applies to --dataset_name only")
    if args.dataset_config and not args.dataset_name:
        problems.append("--dataset_config applies to --dataset_name only")
    if args.max_tokens < 1:
        problems.append(f"--max_tokens must be a positive integer, got {args.max_tokens}")
    if args.max_samples is not None and args.max_samples < 1:
        problems.append(f"--max_samples must be a positive integer, got {args.max_samples}")
    if args.source_lang == args.target_lang:
        problems.append(f"--source_lang and --target_lang are both {args.source_lang!r}")
    out = args.output_dir
    if out.exists() and not out.is_dir():
        problems.append(f"--output_dir {out} is a file")
    elif out.is_dir() and any(out.iterdir()) and not args.overwrite:
        problems.append(f"--output_dir {out} exists and is not empty: pass --overwrite to replace its results")
    if problems:
        raise EvaluationError(problems_message("bad arguments", problems))


def markdown_table(result: Mapping[str, Any], model: str, data: Mapping[str, Any]) -> str:
    decoding = result["decoding"]
    what = data.get("test_file") or data.get("source_file") or f"{data.get('dataset_name')} ({data.get('split')})"
    rows = [
        ("model", model),
        ("data", f"{what}, {data['source_lang']}→{data['target_lang']}"),
        ("sentences", f"{result['n_sentences']:,}"),
        ("BLEU", f"{result['bleu']:.2f}"),
        ("chrF", f"{result['chrf']:.2f}"),
        ("decoding", f"beam {decoding['num_beams']}, α {decoding['length_penalty']} ({decoding['length_penalty_rule']}),"
                     f" max {decoding.get('output_limit')}"),
        ("speed", f"{result['sentences_per_second']:.1f} sent/s, {result['tokens_per_second']:.0f} tok/s"),
        ("BLEU signature", f"`{result['signature']}`"),
        ("chrF signature", f"`{result['chrf_signature']}`"),
    ]  # fmt: skip
    return "\n".join(["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    try:
        check_arguments(args)
        keep_freed_memory_for_reuse()  # training/common/runtime.py: ~20% faster CPU beam search
        sources, references, data = load_test_set(args)
        model, tokenizer = load_model(args.model, args.device, args.cpu_kernel)
        generate_kwargs = generate_overrides(args)
        result = evaluate_model(
            model,
            tokenizer,
            sources,
            references,
            max_tokens=args.max_tokens,
            generate_kwargs=generate_kwargs,
            progress=not args.quiet,
        )
    except EvaluationError as e:
        raise SystemExit(f"error: {e}") from None
    hypotheses = result.pop("hypotheses")
    scores = {
        **result,
        "model": args.model,
        "data": data,
        "device": str(next(model.parameters()).device),
        "cpu_kernel": args.cpu_kernel or "default",
        "max_tokens": args.max_tokens,
        "hypotheses_file": "hypotheses.txt",
    }
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "hypotheses.txt").write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    (args.output_dir / "scores.json").write_text(json.dumps(scores, indent=2, ensure_ascii=False) + "\n")
    print(markdown_table(result, args.model, data))
    print(f"\nwrote {args.output_dir / 'hypotheses.txt'} and {args.output_dir / 'scores.json'}")
    return {**scores, "hypotheses": hypotheses}


if __name__ == "__main__":
    run_command(main)
