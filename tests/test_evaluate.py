"""training/evaluate.py on a real (small) trained model: scores recomputed with sacrebleu itself, hypotheses equal
to `model.generate` sentence by sentence, repeat runs identical, every data source, every bad input."""

import json
from pathlib import Path

import pytest
import sacrebleu
import torch

from training.data.corpus import default_corpus
from training.evaluate import main as evaluate_main
from training.evaluation.scoring import evaluate_model
from training.inference.translation import EvaluationError, load_model, token_batches
from training.train import main as train_main

from tiny_runs import write_inputs

REPO = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def setup(tmp_path_factory, one_thread) -> dict[str, Path]:
    """A model trained 300 steps by training/train.py (d_model 32): it translates badly but not uniformly, so
    hypotheses differ in content and length. The test split as JSON lines and as line-aligned text files."""
    root = tmp_path_factory.mktemp("evaluate")
    files = write_inputs(root, train_size=600, test_size=30)
    rows = [json.loads(line)["translation"] for line in files["test"].read_text().splitlines()]
    files["src"], files["ref"] = root / "test.en", root / "test.de"
    files["src"].write_text("".join(r["en"] + "\n" for r in rows), encoding="utf-8")
    files["ref"].write_text("".join(r["de"] + "\n" for r in rows), encoding="utf-8")
    config = files.pop("model")
    files["model"] = root / "run"
    train_main([
        "--model_config", str(config), "--train_file", str(files["train"]), "--vocab_size", "300",
        "--max_tokens_per_step", "600", "--warmup_steps", "20", "--max_steps", "300", "--save_steps", "1000",
        "--logging_steps", "100", "--output_dir", str(files["model"]),
    ])  # fmt: skip
    files["root"] = root
    return files


@pytest.fixture(scope="module")
def first_eval(setup) -> Path:
    out = setup["root"] / "eval"
    evaluate_main(["--model", str(setup["model"]), "--test_file", str(setup["test"]), "--output_dir", str(out)])
    return out


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_scores_are_sacrebleu_on_the_written_hypotheses(setup, first_eval, capsys):
    hypotheses = lines(first_eval / "hypotheses.txt")
    references = lines(setup["ref"])
    assert len(hypotheses) == len(references) == 30
    assert len(set(hypotheses)) > 3, "the model translates everything alike: the test would prove little"
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    expected_bleu = bleu.corpus_score(hypotheses, [references])
    expected_chrf = chrf.corpus_score(hypotheses, [references])
    scores = json.loads((first_eval / "scores.json").read_text())
    assert scores["bleu"] == pytest.approx(expected_bleu.score, abs=1e-9)
    assert scores["chrf"] == pytest.approx(expected_chrf.score, abs=1e-9)
    assert scores["chrf"] > 0
    assert scores["signature"] == str(bleu.get_signature()) and scores["chrf_signature"] == str(chrf.get_signature())
    assert scores["n_sentences"] == 30 and scores["data"]["test_file"] == str(setup["test"])
    decoding = scores["decoding"]
    assert (decoding["num_beams"], decoding["length_penalty"], decoding["length_penalty_rule"]) == (4, 0.6, "gnmt")
    assert decoding["max_length_over_source"] == 50 and decoding["output_limit"] == "|source| + 50 tokens"
    assert scores["wall_seconds"] > 0 and scores["sentences_per_second"] > 0 and scores["tokens_per_second"] > 0
    assert scores["model"] == str(setup["model"])


def test_hypotheses_are_model_generate_per_sentence_in_the_original_order(setup, first_eval):
    """Batched by tokens and sorted by length inside, yet each line is what generate gives that sentence alone."""
    model, tokenizer = load_model(str(setup["model"]), "cpu")
    sources = lines(setup["src"])
    with torch.no_grad():
        expected = [
            tokenizer.decode(model.generate(**tokenizer([s], return_tensors="pt"))[0], skip_special_tokens=True)
            for s in sources
        ]
    assert lines(first_eval / "hypotheses.txt") == expected
    lengths = [len(tokenizer(s)["input_ids"]) for s in sources]
    assert len(set(lengths)) > 3 and len(token_batches(lengths, 4000)) == 1  # one batch of mixed lengths: padding


def test_a_repeat_run_gives_the_same_numbers_and_small_batches_the_same_hypotheses(setup, first_eval, tmp_path):
    evaluate_main(["--model", str(setup["model"]), "--test_file", str(setup["test"]), "--output_dir", str(tmp_path)])
    assert (tmp_path / "hypotheses.txt").read_bytes() == (first_eval / "hypotheses.txt").read_bytes()
    timing = ("wall_seconds", "sentences_per_second", "tokens_per_second")
    a, b = (json.loads((d / "scores.json").read_text()) for d in (first_eval, tmp_path))
    assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}
    # batches of at most 60 source tokens (several batches, other padding): the same translations
    evaluate_main(["--model", str(setup["model"]), "--test_file", str(setup["test"]), "--max_tokens", "60",
                   "--output_dir", str(tmp_path / "small"), "--quiet"])  # fmt: skip
    assert lines(tmp_path / "small" / "hypotheses.txt") == lines(first_eval / "hypotheses.txt")


def test_plain_text_files_give_the_same_result_as_the_jsonl_test_set(setup, first_eval, tmp_path):
    out = tmp_path / "files"
    evaluate_main(["--model", str(setup["model"]), "--source_file", str(setup["src"]),
                   "--reference_file", str(setup["ref"]), "--output_dir", str(out), "--quiet"])  # fmt: skip
    assert lines(out / "hypotheses.txt") == lines(first_eval / "hypotheses.txt")
    a, b = (json.loads((d / "scores.json").read_text()) for d in (first_eval, out))
    assert (a["bleu"], a["chrf"]) == (b["bleu"], b["chrf"])


def test_decoding_overrides_are_used_and_recorded(setup, tmp_path, capsys):
    """--num_beams 1 (greedy) and the transformers length-penalty rule, on the default corpus's test split."""
    out = tmp_path / "greedy"
    result = evaluate_main(["--model", str(setup["model"]), "--dataset_name", "default", "--max_samples", "8",
                            "--num_beams", "1", "--length_penalty_rule", "transformers", "--max_new_tokens", "12",
                            "--output_dir", str(out), "--quiet"])  # fmt: skip
    scores = json.loads((out / "scores.json").read_text())
    assert scores["decoding"]["num_beams"] == 1 and scores["decoding"]["length_penalty_rule"] == "transformers"
    assert scores["decoding"]["output_limit"] == "12 new tokens"
    assert scores["data"] == {"dataset_name": "default", "dataset_config": None, "split": "test", "max_samples": 8,
                              "source_lang": "en", "target_lang": "de"}  # fmt: skip
    model, tokenizer = load_model(str(setup["model"]), "cpu")
    sources = default_corpus()["test"]["translation"][:8]
    with torch.no_grad():
        expected = [
            tokenizer.decode(
                model.generate(**tokenizer([r["en"]], return_tensors="pt"), num_beams=1, max_new_tokens=12)[0],
                skip_special_tokens=True,
            )
            for r in sources
        ]
    assert result["hypotheses"] == expected == lines(out / "hypotheses.txt")
    table = capsys.readouterr().out
    assert "| BLEU |" in table and "| chrF |" in table and "beam 1" in table


def test_evaluate_model_checks_its_input(setup):
    model, tokenizer = load_model(str(setup["model"]), "cpu")
    with pytest.raises(EvaluationError, match="the test set is empty"):
        evaluate_model(model, tokenizer, [], [], max_tokens=100, generate_kwargs={})
    with pytest.raises(EvaluationError, match="3 sources but 2 references"):
        evaluate_model(model, tokenizer, ["a", "b", "c"], ["x", "y"], max_tokens=100, generate_kwargs={})
    result = evaluate_model(model, tokenizer, ["on Monday", "  "], ["am Montag", ""], max_tokens=100,
                            generate_kwargs={"num_beams": 1}, progress=False)  # fmt: skip
    assert result["hypotheses"][1] == "" and result["n_sentences"] == 2  # a blank source is not translated


def test_bad_input_is_refused_before_any_work(setup, tmp_path):
    model = str(setup["model"])
    out = tmp_path / "out"
    (tmp_path / "empty.en").write_text("")
    (tmp_path / "empty.de").write_text("")
    with pytest.raises(SystemExit, match="the test set is empty"):
        evaluate_main(["--model", model, "--source_file", str(tmp_path / "empty.en"),
                       "--reference_file", str(tmp_path / "empty.de"), "--output_dir", str(out)])  # fmt: skip
    (tmp_path / "three.en").write_text("one\ntwo\nthree\n")
    (tmp_path / "two.de").write_text("eins\nzwei\n")
    with pytest.raises(SystemExit, match=r"three.en has 3 lines but --reference_file .*two.de has 2"):
        evaluate_main(["--model", model, "--source_file", str(tmp_path / "three.en"),
                       "--reference_file", str(tmp_path / "two.de"), "--output_dir", str(out)])  # fmt: skip
    with pytest.raises(SystemExit, match="nowhere: no such model folder"):
        evaluate_main(["--model", str(tmp_path / "nowhere"), "--test_file", str(setup["test"]),
                       "--output_dir", str(out)])  # fmt: skip
    with pytest.raises(SystemExit, match="not a model folder"):
        evaluate_main(["--model", str(tmp_path), "--test_file", str(setup["test"]), "--output_dir", str(out)])
    with pytest.raises(SystemExit, match="give exactly one test set"):
        evaluate_main(["--model", model, "--output_dir", str(out)])
    with pytest.raises(SystemExit, match="give exactly one test set.*--dataset_name, --test_file"):
        evaluate_main(["--model", model, "--dataset_name", "default", "--test_file", str(setup["test"]),
                       "--output_dir", str(out)])  # fmt: skip
    with pytest.raises(SystemExit, match="--num_beams must be a positive integer"):
        evaluate_main(["--model", model, "--dataset_name", "default", "--num_beams", "0", "--output_dir", str(out)])
    with pytest.raises(SystemExit, match=r"missing.jsonl does not exist"):
        evaluate_main(["--model", model, "--test_file", str(tmp_path / "missing.jsonl"), "--output_dir", str(out)])
    (tmp_path / "bad.en").write_bytes(b"fine\n\xff\n")
    with pytest.raises(SystemExit, match=r"bad.en, line 2: not UTF-8"):
        evaluate_main(["--model", model, "--source_file", str(tmp_path / "bad.en"),
                       "--reference_file", str(tmp_path / "two.de"), "--output_dir", str(out)])  # fmt: skip
    assert not out.exists()


def test_an_existing_output_folder_needs_overwrite(setup, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    argv = ["--model", str(setup["model"]), "--test_file", str(setup["test"]), "--max_samples", "2",
            "--num_beams", "1", "--output_dir", str(tmp_path), "--quiet"]  # fmt: skip
    with pytest.raises(SystemExit, match="exists and is not empty: pass --overwrite"):
        evaluate_main(argv)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    evaluate_main([*argv, "--overwrite"])
    assert len(lines(tmp_path / "hypotheses.txt")) == 2 and (tmp_path / "notes.txt").read_text() == "mine"


def test_token_batches_respect_the_budget_and_cover_every_index():
    lengths = [5, 1, 9, 3, 3, 12, 7, 2]
    batches = token_batches(lengths, 12)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 12
    assert token_batches([30, 2], 10) == [[0], [1]]  # longer than the budget: a batch of its own
    with pytest.raises(EvaluationError, match="max_tokens must be a positive integer"):
        token_batches([1], 0)
