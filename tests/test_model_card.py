"""training/hub/model_card.py on a real (tiny) run: train → average → evaluate, then render the card.

The card must parse with huggingface_hub without warnings, carry the Hub metadata (model-index with BLEU and its
sacreBLEU signature), leave no template syntax, and hold no number that is not in the run's own files: every
number outside the template's fixed text is looked up in config.json, generation_config.json, run_summary.json,
averaging.json, scores.json and the parameter count of model.safetensors.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import warnings
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard
from safetensors.torch import load_file

from training.average import main as average_main
from training.evaluate import main as evaluate_main
from training.hub.model_card import TEMPLATE, CardError, render_card
from training.train import main as train_main

from tiny_runs import tiny_train_argv, write_inputs

REPO = Path(__file__).resolve().parent.parent
# a number as the card writes it: 297,472 / 0.98 / 1e-09; not the digits inside a word (vaswani2017 is a tag)
NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")
RUN_FILES = ("config.json", "generation_config.json", "run_summary.json", "averaging.json")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict[str, Path]:
    """A 4-step run with checkpoints at steps 2 and 4, their average, and its test scores (beam 2, not the
    generation config's 4, so the card must take the decoding of a score from its scores.json)."""
    root = tmp_path_factory.mktemp("card")
    files = write_inputs(root, train_size=300, validation_size=8, test_size=8)
    steps = ("--logging_steps", "2", "--max_steps", "4", "--save_steps", "2")
    train_main(tiny_train_argv(files, root / "run", *steps, splits=("validation", "test")))
    average_main([str(root / "run"), "--last", "2", "--output_dir", str(root / "avg"), "--quiet"])
    evaluate_main([
        "--model", str(root / "avg"),
        "--test_file", str(files["test"]),
        "--num_beams", "2",
        "--output_dir", str(root / "eval"),
        "--quiet",
    ])  # fmt: skip
    return {"run": root / "run", "avg": root / "avg", "scores": root / "eval" / "scores.json"}


@pytest.fixture(scope="module")
def scores(run) -> dict[str, dict]:
    return {"test": json.loads(run["scores"].read_text())}


@pytest.fixture(scope="module")
def card(run, scores) -> ModelCard:
    return render_card(run["avg"], scores=scores, repo_id="user/tiny-vaswani")


def front_matter(content: str) -> dict:
    assert content.startswith("---\n")
    return yaml.safe_load(content.split("---\n", 2)[1])


def parameter_count(folder: Path) -> int:
    """Counted here independently: every tensor stored in model.safetensors (save_pretrained stores the tied
    embedding once)."""
    return sum(t.numel() for t in load_file(folder / "model.safetensors").values())


def numbers_in_files(paths: list[Path]) -> list[float]:
    found = []
    for path in paths:
        if path.is_file():
            found += [float(n.replace(",", "")) for n in NUMBER.findall(path.read_text(encoding="utf-8"))]
    return found


def test_card_parses_without_warnings_and_carries_the_hub_metadata(card, scores, caplog):
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        reparsed = ModelCard(card.content)
    assert not caught, [str(w.message) for w in caught]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    data = reparsed.data.to_dict()
    assert data["license"] == "apache-2.0"
    assert data["language"] == ["en", "de"]
    assert data["library_name"] == "transformers"
    assert data["pipeline_tag"] == "translation"
    assert "translation" in data["tags"]
    assert "datasets" not in data  # trained on local files: no Hub dataset to name
    [index] = data["model-index"]
    assert index["name"] == "tiny-vaswani"
    [result] = index["results"]
    assert result["task"]["type"] == "translation"
    metrics = {m["type"]: m for m in result["metrics"]}
    assert metrics["bleu"]["value"] == round(scores["test"]["bleu"], 2)
    assert metrics["bleu"]["config"] == scores["test"]["signature"]
    assert metrics["bleu"]["config"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert metrics["chrf"]["value"] == round(scores["test"]["chrf"], 2)
    assert metrics["chrf"]["config"] == scores["test"]["chrf_signature"]
    assert front_matter(card.content)["model-index"] == data["model-index"]  # plain YAML, as the Hub reads it


def test_no_template_syntax_is_left(card):
    assert "{{" not in card.content and "{%" not in card.content and "{#" not in card.content
    assert "not recorded" not in card.content.split("## Training procedure")[0]  # a full run records all that


def test_every_number_in_the_card_comes_from_the_run_files(card, run, scores):
    """Numbers outside the template's own text (section numbers, formulas) must be in the run's files, at the
    precision the card shows them; and the main facts are where they belong."""
    avg = run["avg"]
    params = parameter_count(avg)
    summary = json.loads((avg / "run_summary.json").read_text())
    assert params == summary["parameters"]  # the model as trained: the count agrees with training's own
    known = numbers_in_files([avg / name for name in RUN_FILES] + [run["scores"]]) + [float(params)]
    fixed = set(NUMBER.findall(TEMPLATE.read_text(encoding="utf-8")))
    unexplained = []
    for token in NUMBER.findall(card.content):
        if token in fixed:
            continue
        value = float(token.replace(",", ""))
        decimals = len(token.split(".")[1]) if "." in token and "e" not in token.lower() else 0
        tolerance = 0.5 * 10**-decimals + 1e-9 if decimals else 1e-12
        if not any(abs(number - value) <= tolerance for number in known):
            unexplained.append(token)
    assert not unexplained, f"numbers in the card that no run file holds: {unexplained}"

    body = card.text
    assert f"| parameters | {params:,} " in body
    assert f"| optimizer steps | {summary['steps']:,} |" in body
    assert "steps 2, 4" in body and "`checkpoint-2`, `checkpoint-4`" in body  # from averaging.json
    assert f"| {scores['test']['bleu']:.2f} | {scores['test']['chrf']:.2f} | beam 2," in body  # scores' decoding
    assert "Beam size 4; length penalty α = 0.6" in body  # generation_config.json
    assert scores["test"]["signature"] in body
    assert "![Training curves" in body and "(training_curves.png)" in body
    assert "(step 4; before averaging, so not this model's weights)" in body
    assert card.content.endswith("NeurIPS.\n")


def test_the_card_follows_the_files(run, scores, tmp_path):
    """Change numbers in copies of the files: the card changes with them."""
    folder = tmp_path / "avg"
    shutil.copytree(run["avg"], folder)
    summary = json.loads((folder / "run_summary.json").read_text())
    summary["steps"] = 12345
    summary["data_sizes"]["train"] = 4321
    summary["settings"]["warmup_steps"] = 777
    (folder / "run_summary.json").write_text(json.dumps(summary))
    changed = {**scores["test"], "bleu": 12.3456, "chrf": 45.678, "n_sentences": 999}
    card = render_card(folder, scores={"newstest": changed, "test": scores["test"]}, repo_id="someone/other")
    body = card.text
    assert "| optimizer steps | 12,345 |" in body and "train: 4,321" in body and "warmup 777" in body
    assert "| newstest |" in body and "| 999 | 12.35 | 45.68 |" in body
    [index] = card.data.to_dict()["model-index"]
    assert index["name"] == "other"
    by_name = {r["dataset"]["name"]: r for r in index["results"]}
    assert set(by_name) == {"newstest", "test"}  # same test file: kept apart by the evaluation's name
    assert {m["type"]: m["value"] for m in by_name["newstest"]["metrics"]} == {"bleu": 12.35, "chrf": 45.68}


def test_the_card_reads_label_smoothing_under_its_name_and_the_earlier_one(run, tmp_path):
    """run_summary.json records ε_ls as `label_smoothing_factor`; summaries of earlier runs as `label_smoothing`."""
    folder = tmp_path / "avg"
    shutil.copytree(run["avg"], folder)
    summary = json.loads((folder / "run_summary.json").read_text())
    assert summary["settings"]["label_smoothing_factor"] == 0.1 and "label_smoothing" not in summary["settings"]
    assert "| label smoothing ε_ls (§5.4) | 0.1 |" in render_card(folder).text
    summary["settings"]["label_smoothing"] = 0.2  # as an earlier run wrote it
    del summary["settings"]["label_smoothing_factor"]
    (folder / "run_summary.json").write_text(json.dumps(summary))
    assert "| label smoothing ε_ls (§5.4) | 0.2 |" in render_card(folder).text


def test_missing_facts_are_not_recorded_never_made_up(run, tmp_path, caplog):
    folder = tmp_path / "bare"
    shutil.copytree(run["avg"], folder)
    for name in ("run_summary.json", "averaging.json", "training_curves.png", "generation_config.json"):
        (folder / name).unlink()
    card = render_card(folder)
    body = card.text
    rows = ("optimizer steps", "tokens seen (source + target)", "seed", "gradient accumulation", "devices")
    for row in (*rows, "label smoothing ε_ls (§5.4)"):  # config.json's ε_ls is the model loss's (0), not training's
        assert re.search(rf"\| {re.escape(row)} \| not recorded \|", body), row
    assert "| data | not recorded (no run_summary.json) |" in body
    assert "| checkpoints averaged (§6.1) | none recorded (no averaging.json in the model folder) |" in body
    assert "Beam size not recorded; length penalty α = not recorded" in body
    assert "Training curves: not recorded" in body
    assert "no score recorded" in body
    assert "{{" not in card.content
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        data = ModelCard(card.content).data.to_dict()
    assert not caught and not caplog.records
    assert "language" not in data and "model-index" not in data
    assert data["license"] == "apache-2.0" and data["pipeline_tag"] == "translation"


def test_a_template_value_without_a_source_is_refused(run, tmp_path):
    template = tmp_path / "template.md"
    template.write_text("---\n{{ card_data }}\n---\n\n# {{ model_name }}\n\n{{ bleu_on_wmt14 }}\n")
    with pytest.raises(CardError, match="names values the card has none for: bleu_on_wmt14"):
        render_card(run["avg"], template=template)


def test_scores_of_another_model_are_refused(run, scores):
    other = {**scores["test"], "model": str(run["run"])}  # the run's final weights, not the averaged ones
    with pytest.raises(CardError, match="whose weights are not those of"):
        render_card(run["avg"], scores={"test": other})
