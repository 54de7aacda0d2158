"""Our own evaluate metric (training/evaluation/sacrebleu_metric.py) loads offline and agrees with sacrebleu itself."""

import evaluate
import pytest
import sacrebleu

from training.evaluation.metrics import METRIC_SCRIPT, compute_bleu_chrf, load_sacrebleu

PREDICTIONS = [
    "Ich habe am Montag fünf Bücher gekauft.",
    "Der Zug fährt um halb acht ab.",
    "Sie wurde 1971 in Wien geboren.",
    "zweihundert rote Äpfel",
]
REFERENCES = [
    "Ich habe am Montag fünfundvierzig Bücher gekauft.",
    "Der Zug fährt um halb acht ab.",
    "Sie wurde am 5. März 1971 in Wien geboren.",
    "dreihundertzweiundvierzig rote Äpfel",
]
SECOND_REFERENCES = [
    "Am Montag habe ich fünf Bücher gekauft.",
    "Um halb acht fährt der Zug ab.",
    "Sie ist 1971 in Wien geboren.",
    "zweihundert Äpfel",
]


@pytest.fixture(scope="module")
def metric():
    return load_sacrebleu()


def test_loads_from_the_file_without_network(metric):
    assert isinstance(metric, evaluate.EvaluationModule)
    again = evaluate.load(str(METRIC_SCRIPT))
    assert again.compute(predictions=["a b c d"], references=[["a b c d"]])["score"] == pytest.approx(100.0)


def test_bleu_and_chrf_equal_sacrebleu(metric):
    ours = metric.compute(predictions=PREDICTIONS, references=[[r] for r in REFERENCES])
    bleu = sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES])
    chrf = sacrebleu.corpus_chrf(PREDICTIONS, [REFERENCES])
    assert 0 < ours["score"] < 100
    assert ours["score"] == pytest.approx(bleu.score, abs=1e-9)
    assert ours["precisions"] == pytest.approx(bleu.precisions)
    assert (ours["counts"], ours["totals"]) == (bleu.counts, bleu.totals)
    assert ours["bp"] == pytest.approx(bleu.bp)
    assert (ours["sys_len"], ours["ref_len"]) == (bleu.sys_len, bleu.ref_len)
    assert ours["chrf"] == pytest.approx(chrf.score, abs=1e-9)
    assert f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}" == ours["signature"]
    assert ours["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:")


def test_plain_string_references_and_several_references(metric):
    plain = metric.compute(predictions=PREDICTIONS, references=REFERENCES)
    assert plain["score"] == pytest.approx(sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES]).score)
    both = [list(refs) for refs in zip(REFERENCES, SECOND_REFERENCES, strict=True)]
    two = metric.compute(predictions=PREDICTIONS, references=both)
    expected = sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES, SECOND_REFERENCES])
    assert two["score"] == pytest.approx(expected.score) and two["score"] > plain["score"]
    assert two["signature"].startswith("nrefs:2|")


def test_options_reach_sacrebleu(metric):
    result = metric.compute(predictions=["Das ist GUT."], references=["das ist gut."], lowercase=True, tokenize="intl")
    assert result["score"] == pytest.approx(100.0)
    assert "case:lc" in result["signature"] and "tok:intl" in result["signature"]


def test_batches_add_up(metric):
    for prediction, reference in zip(PREDICTIONS, REFERENCES, strict=True):
        metric.add_batch(predictions=[prediction], references=[[reference]])
    assert metric.compute()["score"] == pytest.approx(sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES]).score)


def test_compute_bleu_chrf_helper():
    result = compute_bleu_chrf(PREDICTIONS, REFERENCES)
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES]).score)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(PREDICTIONS, [REFERENCES]).score)
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in result["signature"]
    assert compute_bleu_chrf(["Der Zug fährt ab."], [["Der Zug fährt ab."]])["bleu"] == pytest.approx(100.0)


def test_bad_input_raises(metric):
    with pytest.raises(ValueError, match="2 predictions but 1 references"):
        compute_bleu_chrf(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="no predictions"):
        compute_bleu_chrf([], [])
    with pytest.raises(ValueError, match=r"same number of references; got counts \[1, 2\]"):
        metric.compute(predictions=["a", "b"], references=[["a"], ["b", "c"]])
