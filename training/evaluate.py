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

# no `from __future__ import annotations`: run as __main__, dataclasses must see ClassVar as a type, not a string
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from transformers import HfArgumentParser

from training.common.arguments import DecodingArguments, command_parser, minimum_problems, parse_command
from training.common.checks import language_problem
from training.common.errors import problems_message, run_command
from training.common.files import output_problem, read_lines
from training.common.runtime import keep_freed_memory_for_reuse
from training.evaluation.scoring import evaluate_model
from training.inference.translation import DEFAULT_MAX_TOKENS, EvaluationError, load_model

# torch and the metrics load inside the functions that use them: `--help` and a bad command line are answered
# without them (tests/test_cli_errors.py; HfArgumentParser loads transformers, not torch)


@dataclass
class EvaluateArguments:
    _argument_group_name = "model and output"

    model: str = field(metadata={"help": "model folder (train/average output) or Hub model id"})
    output_dir: Path = field(metadata={"help": "folder for hypotheses.txt and scores.json"})
    overwrite: bool = field(
        default=False, metadata={"help": "replace hypotheses.txt/scores.json in a non-empty folder"}
    )


@dataclass
class TestDataArguments:
    _argument_group_name = "test data (give one)"
    MINIMUMS: ClassVar[dict[str, int]] = {"max_samples": 1}

    dataset_name: str | None = field(
        default=None, metadata={"help": '"default" (the offline corpus), a Hub translation dataset or a folder'}
    )
    dataset_config: str | None = field(default=None, metadata={"help": "the Hub dataset's configuration, e.g. de-en"})
    split: str | None = field(default=None, metadata={"help": "split of --dataset_name (default: test)"})
    test_file: Path | None = field(default=None, metadata={"help": "local test data: .jsonl, .tsv or a Moses prefix"})
    source_file: Path | None = field(
        default=None, metadata={"help": "plain text, one source sentence a line (with --reference_file)"}
    )
    reference_file: Path | None = field(
        default=None, metadata={"help": "plain text, one reference a line, aligned with --source_file"}
    )
    source_lang: str = field(default="en", metadata={"help": "source language key (default en)"})
    target_lang: str = field(default="de", metadata={"help": "target language key (default de)"})
    max_samples: int | None = field(default=None, metadata={"help": "only the first N sentences"})


@dataclass
class RunningArguments:
    _argument_group_name = "running"
    MINIMUMS: ClassVar[dict[str, int]] = {"max_tokens": 1}

    max_tokens: int = field(default=DEFAULT_MAX_TOKENS, metadata={"help": "source tokens per batch, padding counted"})
    device: str | None = field(default=None, metadata={"help": "cpu, cuda, cuda:1, ... (default: cuda if available)"})
    quiet: bool = field(default=False, metadata={"help": "no progress bar"})


ARGUMENTS = (EvaluateArguments, TestDataArguments, DecodingArguments, RunningArguments)


def build_parser() -> HfArgumentParser:
    return command_parser("python -m training.evaluate", __doc__, ARGUMENTS)


def check_arguments(
    run: EvaluateArguments, data: TestDataArguments, decoding: DecodingArguments, running: RunningArguments
) -> None:
    """Every problem of the command line at once, before the model or the data is loaded."""
    problems = minimum_problems(data, decoding, running)
    given = [name for name in ("dataset_name", "test_file", "source_file") if getattr(data, name)]
    if data.reference_file and not data.source_file:
        given.append("reference_file")
    if len(given) != 1:
        problems.append(
            "give exactly one test set: --dataset_name NAME (e.g. default), --test_file PATH, or --source_file "
            "SRC.txt with --reference_file REF.txt" + (f" (got {', '.join('--' + g for g in given)})" if given else "")
        )
    if data.split and not data.dataset_name:
        problems.append("--split applies to --dataset_name only")
    if data.dataset_config and not data.dataset_name:
        problems.append("--dataset_config applies to --dataset_name only")
    problems += filter(None, [language_problem(data.source_lang, data.target_lang)])
    problems += filter(None, [output_problem(run.output_dir, "--output_dir", run.overwrite)])
    if problems:
        raise EvaluationError(problems_message("bad arguments", problems))


# --------------------------------------------------------------------------------------------------------------
# evaluation


def load_test_set(args: TestDataArguments) -> tuple[list[str], list[str], dict[str, Any]]:
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
    run, data_args, decoding, running, _ = parse_command(build_parser(), argv)
    try:
        check_arguments(run, data_args, decoding, running)
        keep_freed_memory_for_reuse()  # training/common/runtime.py: ~20% faster CPU beam search
        sources, references, data = load_test_set(data_args)
        model, tokenizer = load_model(run.model, running.device, decoding.cpu_kernel)
        result = evaluate_model(
            model,
            tokenizer,
            sources,
            references,
            max_tokens=running.max_tokens,
            generate_kwargs=decoding.generate_overrides(),
            progress=not running.quiet,
        )
    except EvaluationError as e:
        raise SystemExit(f"error: {e}") from None
    hypotheses = result.pop("hypotheses")
    scores = {
        **result,
        "model": run.model,
        "data": data,
        "device": str(next(model.parameters()).device),
        "cpu_kernel": decoding.cpu_kernel or "default",
        "max_tokens": running.max_tokens,
        "hypotheses_file": "hypotheses.txt",
    }
    out = run.output_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "hypotheses.txt").write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    (out / "scores.json").write_text(json.dumps(scores, indent=2, ensure_ascii=False) + "\n")
    print(markdown_table(result, run.model, data))
    print(f"\nwrote {out / 'hypotheses.txt'} and {out / 'scores.json'}")
    return {**scores, "hypotheses": hypotheses}


if __name__ == "__main__":
    run_command(main)
