"""Translate a test set and score it: sacreBLEU (BLEU with its signature) and chrF, with the decoding settings and
the speed. The library side of `python -m training.evaluate`.

    from training.inference.translation import load_model
    from training.evaluation.scoring import evaluate_model
    model, tokenizer = load_model("runs/tiny")
    result = evaluate_model(model, tokenizer, sources, references, max_tokens=4000, generate_kwargs={})
    result["bleu"], result["signature"], result["hypotheses"]
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from training.inference.translation import (
    DEFAULT_MAX_TOKENS,
    EvaluationError,
    decoding_settings,
    translate_batched,
)


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
    from training.evaluation.metrics import compute_bleu_chrf  # loads `evaluate` and sacrebleu: only when scoring

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
