"""BLEU and chrF for validation and test, through `evaluate` with this project's own sacrebleu metric (offline).

from training.evaluation.metrics import compute_bleu_chrf
compute_bleu_chrf(["Ich habe fünf Äpfel gekauft."], ["Ich habe fünf Äpfel gekauft."])
# {"bleu": 100.0, "chrf": 100.0, "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0", ...}
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import evaluate

METRIC_SCRIPT = Path(__file__).resolve().with_name("sacrebleu_metric.py")


def load_sacrebleu(**kwargs) -> evaluate.EvaluationModule:
    """`evaluate.load` of `training/evaluation/sacrebleu_metric.py`: needs no network. Kept in memory (no cache files)."""
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
