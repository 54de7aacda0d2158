"""Corpus BLEU and chrF with sacrebleu, as an `evaluate` metric that loads from this file, offline.

`evaluate.load("sacrebleu")` fetches its script from the Hugging Face Hub; this module is this project's own
metric, loaded by path, so evaluation works without network:

    python -c "import evaluate; m = evaluate.load('training/evaluation/sacrebleu_metric.py'); \\
        print(m.compute(predictions=['Das ist ein Test.'], references=[['Das ist ein Test.']]))"

(or `training.evaluation.metrics.load_sacrebleu()`). Inputs: `predictions`, a list of detokenized strings; `references`, one
string or a list of strings per prediction (the same number for every prediction). Output: `score` (BLEU, 0–100),
`counts`, `totals`, `precisions`, `bp`, `sys_len`, `ref_len`, `signature` (sacrebleu's, e.g.
`nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`), and `chrf` with `chrf_signature`. Options go to
sacrebleu: `tokenize` (default "13a"), `lowercase`, `smooth_method`, `smooth_value`, `force`.
"""

from __future__ import annotations

import datasets
import evaluate
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

_DESCRIPTION = """Corpus-level BLEU (Papineni et al., 2002) and chrF (Popović, 2015) computed by sacrebleu (Post,
2018) on detokenized text, with sacrebleu's signature so that scores can be compared across papers."""

_CITATION = """@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    pages = "186--191",
}"""

_INPUTS = """
Args:
    predictions (list of str): the system's translations, detokenized.
    references (list of str, or list of list of str): the reference translation(s) of each prediction.
    tokenize (str): sacrebleu's tokenizer for BLEU, "13a" by default ("intl", "char", "none", ...).
    lowercase (bool): lowercase before scoring (BLEU and chrF).
    smooth_method (str), smooth_value (float): BLEU smoothing, "exp" by default.
    force (bool): score text that looks tokenized without a warning.
Returns:
    score, counts, totals, precisions, bp, sys_len, ref_len, signature: corpus BLEU and its parts;
    chrf, chrf_signature: corpus chrF.
Example:
    >>> metric = evaluate.load("training/evaluation/sacrebleu_metric.py")
    >>> round(metric.compute(predictions=["Das ist gut."], references=[["Das ist gut."]])["score"], 1)
    100.0
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _INPUTS)
class SacreBLEUMetric(evaluate.Metric):
    """BLEU and chrF through sacrebleu's `BLEU` and `CHRF` classes."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_INPUTS,
            homepage="https://github.com/mjpost/sacrebleu",
            features=[
                datasets.Features(
                    {
                        "predictions": datasets.Value("string"),
                        "references": datasets.Sequence(datasets.Value("string")),
                    }
                ),
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            ],
            reference_urls=["https://aclanthology.org/W18-6319/"],
        )

    def _compute(
        self,
        predictions: list[str],
        references: list[str] | list[list[str]],
        tokenize: str = BLEU.TOKENIZER_DEFAULT,
        lowercase: bool = False,
        smooth_method: str = "exp",
        smooth_value: float | None = None,
        force: bool = False,
    ) -> dict:
        refs = [[r] if isinstance(r, str) else list(r) for r in references]
        counts = {len(r) for r in refs}
        if len(counts) > 1:
            raise ValueError(f"every prediction needs the same number of references; got counts {sorted(counts)}")
        n_refs = counts.pop() if counts else 1
        if n_refs == 0:
            raise ValueError("a prediction has no reference")
        streams = [[r[i] for r in refs] for i in range(n_refs)]  # sacrebleu: one list per reference set
        bleu = BLEU(
            lowercase=lowercase,
            tokenize=tokenize,
            smooth_method=smooth_method,
            smooth_value=smooth_value,
            force=force,
            effective_order=False,
        )
        chrf = CHRF(lowercase=lowercase)
        bleu_score = bleu.corpus_score(predictions, streams)
        chrf_score = chrf.corpus_score(predictions, streams)
        return {
            "score": bleu_score.score,
            "counts": bleu_score.counts,
            "totals": bleu_score.totals,
            "precisions": bleu_score.precisions,
            "bp": bleu_score.bp,
            "sys_len": bleu_score.sys_len,
            "ref_len": bleu_score.ref_len,
            "signature": str(bleu.get_signature()),
            "chrf": chrf_score.score,
            "chrf_signature": str(chrf.get_signature()),
            "sacrebleu_version": sacrebleu.__version__,
        }
