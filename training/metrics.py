"""BLEU and chrF for validation and test, through `evaluate` with this project's own sacrebleu metric (offline).

from training.metrics import compute_bleu_chrf
compute_bleu_chrf(["Ich habe fünf Äpfel gekauft."], ["Ich habe fünf Äpfel gekauft."])
# {"bleu": 100.0, "chrf": 100.0, "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0", ...}

python -m training.metrics hypotheses.txt references.txt      # one sentence a line, detokenized
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence
from pathlib import Path

import evaluate

METRIC_SCRIPT = Path(__file__).resolve().with_name("sacrebleu_metric.py")


def load_sacrebleu(**kwargs) -> evaluate.EvaluationModule:
    """`evaluate.load` of `training/sacrebleu_metric.py`: needs no network. Kept in memory (no cache files)."""
    kwargs.setdefault("keep_in_memory", True)
    return evaluate.load(str(METRIC_SCRIPT), **kwargs)


@functools.cache
def _metric() -> evaluate.EvaluationModule:
    return load_sacrebleu()


def compute_bleu_chrf(predictions: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]]) -> dict:
    """Corpus BLEU and chrF of detokenized `predictions` against one reference (a string) or several (a list)
    each. Returns `bleu`, `chrf`, `signature`, `chrf_signature` and BLEU's parts (`precisions`, `bp`, ...)."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise ValueError("no predictions to score")
    refs = [[r] if isinstance(r, str) else list(r) for r in references]
    result = _metric().compute(predictions=list(predictions), references=refs)
    result["bleu"] = result.pop("score")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("hypotheses", type=Path, help="one detokenized translation per line")
    parser.add_argument("references", type=Path, nargs="+", help="one or more reference files, line-aligned")
    args = parser.parse_args(argv)
    hyps = args.hypotheses.read_text(encoding="utf-8").splitlines()
    ref_sets = [p.read_text(encoding="utf-8").splitlines() for p in args.references]
    for path, refs in zip(args.references, ref_sets, strict=True):
        if len(refs) != len(hyps):
            parser.error(f"{path} has {len(refs)} lines but {args.hypotheses} has {len(hyps)}")
    result = compute_bleu_chrf(hyps, [list(r) for r in zip(*ref_sets, strict=True)])
    print(f"BLEU = {result['bleu']:.2f}  {result['signature']}")
    print(f"chrF = {result['chrf']:.2f}  {result['chrf_signature']}")


if __name__ == "__main__":
    main()
