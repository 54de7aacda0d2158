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

From Python (the same code path):

    from training.evaluate import evaluate_model, load_model
    model, tokenizer = load_model("runs/tiny")
    result = evaluate_model(model, tokenizer, sources, references, max_tokens=4000, generate_kwargs={})
    result["bleu"], result["signature"], result["hypotheses"]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from training.errors import add_debug_flag, problems_message, run_command
from training.runtime import keep_freed_memory_for_reuse

# torch, transformers and the metrics load inside the functions that use them: `--help` and a bad command line are
# answered without them (tests/test_cli_errors.py)

DEFAULT_MAX_TOKENS = 4000
DECODING_FIELDS = ("num_beams", "length_penalty", "length_penalty_rule", "max_length_over_source", "max_new_tokens",
                   "max_length", "early_stopping", "do_sample")  # fmt: skip


class EvaluationError(ValueError):
    """Bad input to evaluation or translation: reported before any decoding."""


# --------------------------------------------------------------------------------------------------------------
# model and batching


def load_model(name_or_path: str, device: str | None = None, cpu_kernel: str | None = None):
    """(model, tokenizer) of a model folder or Hub id, in eval mode on `device` (default: cuda if present).

    `cpu_kernel` picks the linear-layer kernel of CPU inference ("auto", the default; "onednn"; "int8"; "aten").

    Raises EvaluationError naming the problem and the file: a missing folder, a folder without config.json, a
    config.json with a bad field, unreadable weights, or a Hub id that cannot be loaded (offline, only cached
    models load).
    """
    import torch
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

    import modeling_vaswani  # noqa: F401  (registers model_type "vaswani" with the Auto classes)

    path = Path(name_or_path).expanduser()
    looks_local = path.exists() or name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
    if looks_local:
        if not path.is_dir():
            raise EvaluationError(f"--model {name_or_path}: no such model folder")
        if not (path / "config.json").is_file():
            raise EvaluationError(f"--model {name_or_path}: not a model folder (no config.json)")
        if not (path / "tokenizer_config.json").is_file() and not (path / "tokenizer.json").is_file():
            raise EvaluationError(f"--model {name_or_path}: the folder has no tokenizer (tokenizer_config.json)")
    where = "model folder" if looks_local else "model folder or Hub model"
    config_file = path / "config.json" if looks_local else f"{name_or_path} (config.json)"
    try:
        config = AutoConfig.from_pretrained(name_or_path)
    except ValueError as e:  # a bad field (type or value) of config.json
        raise EvaluationError(f"--model {config_file}: {e}") from e
    except OSError as e:
        raise EvaluationError(f"--model {name_or_path}: could not load it as a {where}: {e}") from e
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForSeq2SeqLM.from_pretrained(name_or_path, config=config)
    except SafetensorError as e:  # a truncated or overwritten weights file: say which
        files = sorted(str(p) for p in path.glob("*.safetensors")) if looks_local else [name_or_path]
        raise EvaluationError(f"--model {', '.join(files)}: unreadable safetensors weights ({e})") from e
    except (OSError, ValueError) as e:
        raise EvaluationError(f"--model {name_or_path}: could not load it as a {where}: {e}") from e
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if cpu_kernel is not None:
        if not hasattr(model, "set_cpu_kernel"):
            raise EvaluationError(f"--cpu_kernel: {type(model).__name__} has no choice of CPU kernels")
        try:
            model.set_cpu_kernel(cpu_kernel)
        except ValueError as e:
            raise EvaluationError(f"--cpu_kernel: {e}") from e
    return model.to(device).eval(), tokenizer


def token_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices cut into batches of similar length: sorted longest first (ties by index), each batch holding at most
    `max_tokens` tokens with padding counted (n · longest ≤ max_tokens); a longer sentence gets a batch of its own.
    Deterministic, so a repeat run decodes the same batches."""
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise EvaluationError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def one_line(text: str) -> str:
    """A translation on one line: any line break the tokenizer may decode (\\n, \\r, U+2028, ...) becomes a space."""
    return " ".join(text.splitlines())


def translate_batched(
    model,
    tokenizer,
    texts: Sequence[str],
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    generate_kwargs: Mapping[str, Any] | None = None,
    max_source_tokens: int | None = None,
    progress: bool = True,
    stats: dict[str, int] | None = None,
) -> list[str]:
    """Translate `texts` in token-budget batches; one output per text, in the order given.

    A blank (empty or whitespace-only) text gives "" and is not sent to the model. Texts are stripped; with
    `max_source_tokens` each is truncated to that many tokens (`</s>` included). The progress bar goes to stderr.
    `stats`, if given, receives `source_tokens` and `generated_tokens` (special tokens and padding excluded).
    """
    outputs = [""] * len(texts)
    keep = [i for i, text in enumerate(texts) if text.strip()]
    if not keep:
        return outputs
    import torch
    from tqdm.auto import tqdm

    truncate = {"truncation": True, "max_length": max_source_tokens} if max_source_tokens else {}
    encoded = tokenizer([texts[i].strip() for i in keep], **truncate)["input_ids"]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.config.pad_token_id
    special = torch.tensor(sorted({*tokenizer.all_special_ids, pad}))
    device = next(model.parameters()).device
    source_tokens = generated_tokens = 0
    batches = token_batches([len(ids) for ids in encoded], max_tokens)
    bar = tqdm(total=len(keep), desc="Translating", unit="sent", file=sys.stderr, disable=not progress)
    with torch.inference_mode():
        for batch in batches:
            longest = max(len(encoded[j]) for j in batch)
            input_ids = torch.full((len(batch), longest), pad, dtype=torch.long)
            attention_mask = torch.zeros((len(batch), longest), dtype=torch.long)
            for row, j in enumerate(batch):
                input_ids[row, : len(encoded[j])] = torch.tensor(encoded[j])
                attention_mask[row, : len(encoded[j])] = 1
            out = model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), **(generate_kwargs or {})
            ).cpu()
            for row, text in enumerate(tokenizer.batch_decode(out, skip_special_tokens=True)):
                outputs[keep[batch[row]]] = one_line(text)
            source_tokens += int(attention_mask.sum())
            generated_tokens += int((~torch.isin(out, special)).sum())
            bar.update(len(batch))
    bar.close()
    if stats is not None:
        stats.update(source_tokens=source_tokens, generated_tokens=generated_tokens)
    return outputs


def decoding_settings(model, generate_kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The decoding settings `model.generate(**generate_kwargs)` uses: the generation config with the overrides."""
    config = copy.deepcopy(model.generation_config)
    config.update(**dict(generate_kwargs or {}))
    settings = {field: getattr(config, field, None) for field in DECODING_FIELDS}
    if settings["max_new_tokens"] is not None:
        settings["output_limit"] = f"{settings['max_new_tokens']} new tokens"
    elif settings["max_length"] is not None:
        settings["output_limit"] = f"{settings['max_length']} tokens"
    elif settings["max_length_over_source"] is not None:
        settings["output_limit"] = f"|source| + {settings['max_length_over_source']} tokens"
    return settings


# --------------------------------------------------------------------------------------------------------------
# evaluation


def evaluate_model(
    model,
    tokenizer,
    sources: Sequence[str],
    references: Sequence[str],
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    generate_kwargs: Mapping[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Translate `sources` and score them against `references` with sacreBLEU (BLEU, chrF).

    Returns `hypotheses` (in the order of `sources`), `bleu`, `chrf`, `signature`, `chrf_signature`, BLEU's parts
    (`precisions`, `bp`, `sys_len`, `ref_len`, ...), `decoding` (the settings used), `n_sentences`, `wall_seconds`,
    `sentences_per_second`, `source_tokens`, `generated_tokens` and `tokens_per_second` (generated target tokens,
    special tokens and padding excluded). Raises EvaluationError for an empty test set or different lengths.
    """
    if len(sources) == 0:
        raise EvaluationError("the test set is empty: no sentences to translate")
    if len(sources) != len(references):
        raise EvaluationError(f"{len(sources)} sources but {len(references)} references: they must be line-aligned")
    stats: dict[str, int] = {}
    started = time.perf_counter()
    hypotheses = translate_batched(
        model,
        tokenizer,
        sources,
        max_tokens=max_tokens,
        generate_kwargs=generate_kwargs,
        progress=progress,
        stats=stats,
    )
    seconds = time.perf_counter() - started
    from training.metrics import compute_bleu_chrf

    scores = compute_bleu_chrf(hypotheses, list(references))
    return {
        "bleu": scores.pop("bleu"),
        "chrf": scores.pop("chrf"),
        "signature": scores.pop("signature"),
        "chrf_signature": scores.pop("chrf_signature"),
        **scores,
        "decoding": decoding_settings(model, generate_kwargs),
        "n_sentences": len(sources),
        "wall_seconds": round(seconds, 3),
        "sentences_per_second": round(len(sources) / max(seconds, 1e-9), 3),
        "source_tokens": stats.get("source_tokens", 0),
        "generated_tokens": stats.get("generated_tokens", 0),
        "tokens_per_second": round(stats.get("generated_tokens", 0) / max(seconds, 1e-9), 1),
        "hypotheses": hypotheses,
    }


def read_lines(path: Path, what: str) -> list[str]:
    """The lines of a UTF-8 text file (no line-end characters); EvaluationError naming the file and line if the
    file is missing or not UTF-8."""
    if not path.is_file():
        raise EvaluationError(f"{what} {path}: no such file")
    lines = []
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        try:
            lines.append(raw.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as e:
            raise EvaluationError(f"{what} {path}, line {number}: not UTF-8 ({e.reason} at byte {e.start})") from None
    if lines and lines[-1] == "":  # the newline that ends the last line
        lines.pop()
    if lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]
    return lines


def load_test_set(args: argparse.Namespace) -> tuple[list[str], list[str], dict[str, Any]]:
    """(sources, references, description of the data) from the command-line data options."""
    if args.source_file or args.reference_file:
        if not (args.source_file and args.reference_file):
            raise EvaluationError("--source_file and --reference_file go together: give both")
        sources = read_lines(args.source_file, "--source_file")
        references = read_lines(args.reference_file, "--reference_file")
        if len(sources) != len(references):
            raise EvaluationError(
                f"--source_file {args.source_file} has {len(sources)} lines but --reference_file "
                f"{args.reference_file} has {len(references)}: they must be line-aligned"
            )
        data = {"source_file": str(args.source_file), "reference_file": str(args.reference_file)}
    else:
        from training.data import load_parallel

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
        keep_freed_memory_for_reuse()  # training/runtime.py: ~20% faster CPU beam search
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
