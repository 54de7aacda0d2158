"""The whole path on CPU, small: train → average the last 2 checkpoints → evaluate → translate → dry-run publish →
reload the published folder with the Auto classes in a process without this package → identical translations.

Each step runs as a user runs it: train, average, evaluate and publish through their `main(argv)` (the code
behind `python -m training.<name>`), translate as a real `python -m training.translate` process reading stdin.
The model is trained for 6 steps only: the point is the plumbing, not the scores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from huggingface_hub import ModelCard
from transformers import AutoTokenizer

from training.average import main as average_main
from training.evaluate import main as evaluate_main
from training.publish import main as publish_main
from training.train import main as train_main

from test_publish import UPLOAD_FILES, load_in_fresh_process
from tiny_runs import tiny_train_argv, write_inputs

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}


def similar_length_lines(tokenizer, texts: list[str], most: int = 5) -> tuple[list[str], int]:
    """Up to `most` texts whose token counts (</s> included) lie within a factor of two (2·shortest > longest), and
    the longest count. `translate --batch_tokens 1 --max_source_tokens LONGEST` then decodes each line in a batch of
    its own without truncating it: no padding, so the comparison with one-by-one decoding can ask for identity."""
    lengths = sorted((len(tokenizer(t)["input_ids"]), t) for t in texts)
    best: list[tuple[int, str]] = []
    for i, (shortest, _) in enumerate(lengths):
        window = [pair for pair in lengths[i:] if pair[0] < 2 * shortest][:most]
        if len(window) > len(best):
            best = window
    assert len(best) >= 3, f"too few test sentences of similar length: {lengths}"
    return [t for _, t in best], max(n for n, _ in best)


def test_train_average_evaluate_translate_publish_reload(tmp_path, capsys):
    started = time.perf_counter()
    times: dict[str, float] = {}

    def lap(name: str, since: list[float] = [started]) -> None:  # noqa: B006 (a running clock)
        now = time.perf_counter()
        times[name] = now - since[0]
        since[0] = now

    # the default corpus, small: 600 training pairs as JSON lines
    files = write_inputs(tmp_path, train_size=600, validation_size=8, test_size=16)
    run, avg, evaluation, upload = (tmp_path / name for name in ("run", "avg", "eval", "upload"))

    # 1. train 6 steps, a complete checkpoint every 3 (a small learning rate keeps the outputs non-empty)
    summary = train_main(
        tiny_train_argv(
            files, run, "--lr_scale", "0.05", "--logging_steps", "3", "--max_steps", "6", "--save_steps", "3"
        )
    )
    assert summary["steps"] == 6
    assert (run / "checkpoint-3" / "checkpoint_complete.json").is_file()
    lap("train")

    # 2. average the last 2 checkpoints
    average_main([str(run), "--last", "2", "--output_dir", str(avg), "--quiet"])
    assert json.loads((avg / "averaging.json").read_text())["steps"] == [3, 6]
    lap("average")

    # 3. evaluate on the test split (the model's generation config: beam 4, α 0.6, |source| + 50)
    scores = evaluate_main(["--model", str(avg), "--test_file", str(files["test"]), "--output_dir", str(evaluation)])
    assert (evaluation / "scores.json").is_file() and scores["n_sentences"] == 16
    lap("evaluate")

    # 4. translate: the command line, stdin to stdout; an empty line stays empty
    tokenizer = AutoTokenizer.from_pretrained(avg)
    lines, longest = similar_length_lines(
        tokenizer, [json.loads(line)["translation"]["en"] for line in files["test"].read_text().splitlines()]
    )
    stdin = "\n".join([lines[0], "", *lines[1:]]) + "\n"
    cli = [sys.executable, "-m", "training.translate", "--model", str(avg), "--quiet"]
    cli += ["--batch_tokens", "1", "--max_source_tokens", str(longest)]
    done = subprocess.run(cli, input=stdin, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    translated = done.stdout.split("\n")
    assert translated[-1] == "" and len(translated) == len(lines) + 2  # one line out per line in
    translated = translated[:-1]
    assert translated[1] == ""
    cli_translations = [translated[0], *translated[2:]]
    assert any(cli_translations), "every translation is empty: the comparison below would say nothing"
    lap("translate")

    # 5. dry-run publish with the test scores
    result = publish_main([
        str(avg), "--repo_id", "user/tiny-vaswani", "--dry_run",
        "--scores", f"test={evaluation / 'scores.json'}",
        "--output_dir", str(upload),
    ])  # fmt: skip
    assert {p.as_posix() for p in result["files"]} == UPLOAD_FILES
    card = ModelCard.load(upload / "README.md")
    [index] = card.data.to_dict()["model-index"]
    bleu = {m["type"]: m for m in index["results"][0]["metrics"]}["bleu"]
    assert bleu["value"] == round(scores["bleu"], 2) and bleu["config"] == scores["signature"]
    assert "steps 3, 6" in card.text
    lap("publish")

    # 6. reload the published folder where this package cannot be imported: Auto classes, AutoTokenizer, pipeline
    child = load_in_fresh_process(upload, lines, tmp_path)
    assert child["texts"] == cli_translations
    assert child["pipeline"] == cli_translations
    lap("reload")

    total = time.perf_counter() - started
    with capsys.disabled():
        steps = ", ".join(f"{name} {seconds:.1f}" for name, seconds in times.items())
        print(f"\nend-to-end wall time: {total:.1f} s ({steps})")
