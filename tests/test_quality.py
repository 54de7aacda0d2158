"""benchmarks/quality.py: the --smoke run (every system under one budget, every set decoded, the results files),
the Marian twin it trains (same initial weights, reloads as the same function), and bad input refused before any
training."""

import gzip
import json
from pathlib import Path

import pytest
import torch

from benchmarks import quality

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_moses(prefix: Path, pairs: list[tuple[str, str]], gz: bool) -> None:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for lang, column in (("en", 0), ("de", 1)):
        text = "".join(pair[column] + "\n" for pair in pairs).encode()
        path = prefix.with_name(f"{prefix.name}.{lang}" + (".gz" if gz else ""))
        path.write_bytes(gzip.compress(text) if gz else text)


def test_quality_smoke(tmp_path, one_thread):
    from training.data.corpus import default_corpus

    rows_in = default_corpus(seed=7, train_size=1, validation_size=1, test_size=6)["test"]["translation"]
    pairs = [(r["en"], r["de"]) for r in rows_in]
    write_moses(tmp_path / "sets/plain", pairs[:3], gz=False)
    write_moses(tmp_path / "sets/zipped", pairs[3:], gz=True)
    runs, out = tmp_path / "runs", tmp_path / "out"
    argv = ["--smoke", "--runs_dir", str(runs), "--out_dir", str(out), "--note", "test"]
    argv += ["--test", str(tmp_path / "sets/plain"), "--test", str(tmp_path / "sets/zipped")]
    argv += ["--average", "1@2", "--average", "2@2", "--average", "2@3"]  # 2@2 is the default; 2@3 lacks step 3
    argv += ["--compare_rules"]
    rows = quality.main(argv)

    sets = {"val", "plain", "zipped"}
    got = {(r["system"], r["checkpoint"], r["rule"], r["set"]) for r in rows}
    windows = ("last", "average of last 2 (every 2)", "average of last 1 (every 2)")  # smoke: save 2 apart, keep 2
    rule = {"ours": "gnmt", "ours-marian-lr": "gnmt", "marian": "transformers"}
    want = {(s, c, rule[s], n) for s in quality.SYSTEMS for c in windows for n in sets}
    # --compare_rules: our systems' default checkpoint under transformers' rule too
    want |= {(s, "average of last 2 (every 2)", "transformers", n) for s in ("ours", "ours-marian-lr") for n in sets}
    assert got == want
    assert len(rows) == len(got)
    for r in rows:  # the rule asked for is the one that ran
        assert r["decoding"].get("length_penalty_rule") == r["rule"] or r["system"] == "marian", (
            r["system"],
            r["checkpoint"],
            r["rule"],
            r["decoding"],
        )
    for row in rows:  # the paired bootstrap against the twin's default decoding (test_paired_bootstrap_...)
        assert row["ci95"] >= 0
        is_twin = row["system"] == "marian" and row["default"]
        assert ("p_vs_twin" in row) != is_twin and 0 < row.get("p_vs_twin", 1) <= 1
        hyps = runs / row["system"] / "hypotheses" / f"{quality.slug(row['checkpoint'])}.{row['set']}.txt"
        assert len(hyps.read_text(encoding="utf-8").splitlines()) == row["sentences"]
    records = {s: json.loads((runs / s / quality.RUN_RECORD).read_text()) for s in quality.SYSTEMS}
    settings = records["ours"]["settings"]
    for row in rows:
        assert 0 <= row["bleu"] <= 100 and 0 <= row["chrf"] <= 100
        assert row["signature"].startswith("nrefs:1|") and "tok:13a" in row["signature"]
        assert "chrF2" in row["chrf_signature"] or "nc:6" in row["chrf_signature"]
        # --max_test_samples cuts the validation set (longer), not the short test sets
        assert row["sentences"] == {"val": quality.SMOKE["max_test_samples"], "plain": 3, "zipped": 3}[row["set"]]
        assert row["steps"] == settings["max_steps"]  # every system ran the whole budget
        assert row["train_seconds"] > 0 and row["decode_seconds"] > 0 and row["note"] == "test"
        # padding counted the same way as the budget: at most max_tokens per side and step
        assert row["tokens_seen"] <= row["padded_tokens_seen"] <= 2 * row["max_tokens_per_step"] * row["steps"]
    # the same budget: the same steps, real tokens and padded tokens for every system
    assert len({(r["steps"], r["tokens_seen"], r["padded_tokens_seen"]) for r in rows}) == 1
    # each system's default decoding: one default row per system and set; ours averaged, Marian the last checkpoint
    defaults = {(r["system"], r["set"]): r["checkpoint"] for r in rows if r["default"]}
    assert len(defaults) == len(quality.SYSTEMS) * len(sets)
    assert defaults["ours", "val"] == "average of last 2 (every 2)" and defaults["marian", "val"] == "last"
    by = {
        (r["system"], r["checkpoint"].split()[0], r["set"]): r
        for r in rows
        if r["rule"] != "transformers" or r["system"] == "marian"
    }
    assert by["ours", "last", "val"]["decoding"]["num_beams"] == 4
    assert by["ours", "last", "val"]["decoding"]["max_length_over_source"] == 50
    assert by["marian", "last", "val"]["decoding"]["num_beams"] == 4
    assert by["marian", "last", "val"]["decoding"]["length_penalty"] == 0.6

    # Marian's learning-rate curve: the twin and ours-marian-lr log the same rates; ours its recipe's, higher
    curves = {s: dict(map(tuple, r["lr_curve"])) for s, r in records.items()}
    assert curves["marian"] and curves["marian"] == pytest.approx(curves["ours-marian-lr"])
    for step, lr in curves["ours"].items():
        assert lr != pytest.approx(curves["marian"][step])
    peak = {s: r["settings"]["peak_lr"] for s, r in records.items()}
    assert peak["marian"] == pytest.approx(1e-3) and peak["ours-marian-lr"] == pytest.approx(1e-3)
    assert peak["ours"] != pytest.approx(1e-3)
    for record in records.values():  # the validation curve for the plot: one point per eval_steps
        assert [step for step, _ in record["val_curve"]] == list(
            range(settings["eval_steps"], settings["max_steps"] + 1, settings["eval_steps"])
        )

    [jsonl] = sorted(out.glob("quality-*.jsonl"))
    [md] = sorted(out.glob("quality-*.md"))
    [png] = sorted(out.glob("quality-*.png"))
    assert jsonl.stem == md.stem == png.stem and png.read_bytes()[:8] == PNG_SIGNATURE
    saved = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(saved) == len(rows)
    for row in saved:
        env = row["env"]
        assert env["cpu"] and env["cpu_threads"] >= 1 and env["cpu_cores"] >= 1 and isinstance(env["cpu_isa"], list)
        assert env["isolation"] == "test" and env["torch"] == torch.__version__
    assert "| system | checkpoint | rule | default | set | bleu | ci95 | p_vs_twin |" in md.read_text()
    first = (jsonl.read_text(), md.read_text(), png.read_bytes())

    # again, one test set: complete runs are reused (not retrained), new files are written, the old ones kept
    again = quality.main([*argv[:7], "--systems", "marian,ours", "--test", str(tmp_path / "sets/plain")])
    assert {r["system"] for r in again} == {"ours", "marian"} and {r["set"] for r in again} == {"val", "plain"}
    assert {r["train_seconds"] for r in again if r["system"] == "marian"} == {records["marian"]["train_seconds"]}
    assert len(list(out.glob("quality-*.jsonl"))) == 2 and len(list(out.glob("quality-*.png"))) == 2
    assert (jsonl.read_text(), md.read_text(), png.read_bytes()) == first


def test_twin_starts_from_our_weights_and_reloads_as_the_same_function(tmp_path):
    from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration
    from training.data.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["a small house", "ein kleines Haus"] * 20, vocab_size=40, show_progress=False)
    config = VaswaniConfig(vocab_size=len(tokenizer), d_model=16, d_ff=32, h=2, encoder_layers=1, decoder_layers=1)
    torch.manual_seed(0)
    ours = VaswaniForConditionalGeneration(config)
    twin = quality.marian_twin_of(ours, tokenizer).eval()
    mine = ours.state_dict()
    assert torch.equal(twin.model.shared.weight, mine["model.shared.weight"])
    assert torch.equal(twin.model.encoder.layers[0].fc1.weight, mine["model.encoder.layers.0.ffn.w_1.weight"])

    twin.save_pretrained(tmp_path / "twin")
    tokenizer.save_pretrained(tmp_path / "twin")
    reloaded, reloaded_tokenizer = quality.load_for_decoding("marian", tmp_path / "twin", "cpu")
    assert reloaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    batch = {"input_ids": torch.tensor([[5, 6, 7, 2]]), "decoder_input_ids": torch.tensor([[0, 8, 9]])}
    with torch.no_grad():
        assert torch.allclose(twin(**batch).logits, reloaded(**batch).logits, atol=1e-6)
    # the reference's decoding: at most the batch's longest source + 50 new tokens unless told otherwise
    limit = batch["input_ids"].shape[1] + 50
    out = reloaded.generate(input_ids=batch["input_ids"], num_beams=1, min_new_tokens=limit)
    assert out.shape[1] - 1 == limit  # the start token, then exactly the limit (</s> is banned before it)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--test", "/nonexistent/set"], "--test /nonexistent/set: no /nonexistent/set.en[.gz] or"),
        (["--systems", "ours,fairseq"], "--systems 'ours,fairseq'"),
        (["--marian_peak_lr", "nan"], "--marian_peak_lr must be a positive number"),
        (["--max_steps", "0"], "--max_steps must be a positive integer"),
    ],
)
def test_bad_input_is_refused_before_training(argv, message, tmp_path):
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit) as info:
        quality.main(["--smoke", "--runs_dir", str(runs), "--out_dir", str(tmp_path / "out"), *argv])
    assert message in str(info.value.code)
    assert not (runs / "ours").exists() and not (tmp_path / "out").exists()


def test_an_unfinished_run_continues_from_its_checkpoint_on_the_same_budget(tmp_path, one_thread, monkeypatch):
    """A run killed after a checkpoint continues from it on the next call: the same steps, the same real and padded
    token counts and the same weights as an uninterrupted run (the batches, RNG and schedule carried on), for ours and
    for the Marian twin; a completed run is not trained again."""
    from safetensors.torch import load_file

    argv = ["--smoke", "--systems", "ours,marian", "--train_only"]
    quality.main([*argv, "--runs_dir", str(tmp_path / "whole")])

    class Killed(Exception):
        pass

    real = quality.progress_callback
    for victim in ("ours", "marian"):  # the first call dies in ours' run, the second (ours now done) in the twin's

        def dying(trainer, path, base, victim=victim):
            callback = real(trainer, path, base)
            if path.parent.name == victim:

                def on_step_end(args, state, control, **kwargs):
                    if state.global_step == 5:  # after checkpoint-4 (save_steps 2) and before the next one
                        raise Killed

                callback.on_step_end = on_step_end
            return callback

        monkeypatch.setattr(quality, "progress_callback", dying)
        with pytest.raises(Killed):
            quality.main([*argv, "--runs_dir", str(tmp_path / "cut")])
        assert not (tmp_path / "cut" / victim / quality.RUN_RECORD).exists()
    monkeypatch.undo()
    quality.main([*argv, "--runs_dir", str(tmp_path / "cut")])

    for system in ("ours", "marian"):
        whole, cut = (
            json.loads((tmp_path / run / system / quality.RUN_RECORD).read_text()) for run in ("whole", "cut")
        )
        assert (whole["sittings"], cut["sittings"]) == (1, 2)
        for key in ("steps", "tokens_seen", "padded_tokens_seen", "val_curve", "lr_curve", "train_loss_curve"):
            assert cut[key] == whole[key], (system, key)
        assert cut["train_seconds"] > 0 and cut["train_cpu_seconds"] > 0
        weights = [load_file(tmp_path / run / system / "model.safetensors") for run in ("whole", "cut")]
        assert weights[0].keys() == weights[1].keys()
        for name, tensor in weights[0].items():
            torch.testing.assert_close(weights[1][name], tensor, rtol=0, atol=1e-6, msg=f"{system} {name}")


def test_settings_naming_a_file_compare_by_its_content(tmp_path):
    """A run made from one checkout is the same run seen from another (the recipe and model config files differ in
    path only); a file whose content changed makes it another run."""
    here, there = tmp_path / "a", tmp_path / "b"
    for root in (here, there):
        root.mkdir()
        (root / "recipe.json").write_text(json.dumps({"max_steps": 10, "lr_scale": 0.7}))
        (root / "model.json").write_text(json.dumps({"d_model": 32}))

    def settings(root):
        return {"recipe": str(root / "recipe.json"), "model_config": str(root / "model.json"), "seed": 1}

    assert settings(here) != settings(there)
    assert quality.same_settings(settings(here), settings(there))
    assert not quality.same_settings(settings(here), {**settings(there), "seed": 2})
    (there / "model.json").write_text(json.dumps({"d_model": 64}))
    assert not quality.same_settings(settings(here), settings(there))


def test_averaging_windows():
    """--average N@S picks what a run saving every S steps and keeping N would hold at its end (the final step is
    saved too); a window whose checkpoints are not all on disk is refused, not silently narrowed."""
    every_25 = list(range(25, 1701, 25))
    assert quality.window_steps(every_25, 5, 200) == [1000, 1200, 1400, 1600, 1700]
    assert quality.window_steps(every_25, 5, 50) == [1500, 1550, 1600, 1650, 1700]
    assert quality.window_steps([1000, 1200, 1400, 1600, 1700], 5, 200) == [1000, 1200, 1400, 1600, 1700]
    assert quality.window_steps([1000, 1200, 1400, 1600, 1700], 5, 50) is None
    assert quality.window_steps([2, 4, 6], 2, 2) == [4, 6]  # the final step a multiple of S: not twice
    assert quality.window_steps([2, 4, 6], 5, 2) == [2, 4, 6]  # fewer saved than N: all of them, as Trainer keeps
    assert quality.window_steps([], 5, 2) is None
    assert quality.parse_window("5@200") == (5, 200)
    for bad in ("5", "5@", "a@b", "0@200", "5@0", "5@200@1"):
        with pytest.raises(SystemExit, match="--average"):
            quality.parse_window(bad)


def test_saving_settings_do_not_make_another_run(tmp_path):
    """A run that kept more checkpoints (--save_steps / --save_total_limit, or a recipe whose only change is those or
    its comment) trained the same weights: it is the same run; any other change to the recipe or settings is not."""
    fields = {"_comment": "a", "lr_scale": 0.7, "save_steps": 200, "save_total_limit": 5}
    old, new = tmp_path / "old.json", tmp_path / "new.json"  # the recipe a run was made with; the recipe now
    old.write_text(json.dumps(fields))
    run = {"recipe": str(old), "seed": 0, "save_steps": 25, "save_total_limit": 100}
    now = {**run, "recipe": str(new), "save_steps": 200, "save_total_limit": 5}
    new.write_text(json.dumps({**fields, "_comment": "b", "save_steps": 50, "save_total_limit": 3}))
    assert quality.same_settings(run, now)
    assert not quality.same_settings(run, {**now, "seed": 1})
    new.write_text(json.dumps({**fields, "lr_scale": 1.0}))
    assert not quality.same_settings(run, now)


def test_paired_bootstrap_against_the_twin():
    """Each row gets its BLEU's 95% half-interval and, unless it is the twin's default row, the paired-bootstrap
    p-value of its difference from it (sacrebleu's PairedTest): a far better system is significant, one as good on
    other sentences is not; a report without the twin gets intervals only."""
    words = "a man in a blue shirt is riding a bike down the street while two dogs run after him".split()
    refs = [" ".join(words[i % 7 : i % 7 + 6 + i % 5]) for i in range(300)]
    worse = [" ".join(r.split()[::2]) if i % 3 == 0 else r for i, r in enumerate(refs)]  # a third of them damaged
    alike = [" ".join(r.split()[::2]) if i % 3 == 1 else r for i, r in enumerate(refs)]  # another third, as badly

    def row(system, default, bleu):
        return {"system": system, "default": default, "set": "val", "bleu": bleu}

    import sacrebleu

    score = {
        n: round(sacrebleu.corpus_bleu(h, [refs]).score, 2)
        for n, h in (("worse", worse), ("alike", alike), ("refs", refs))
    }
    rows = [
        row("ours", True, score["refs"]),
        row("marian", True, score["worse"]),
        row("ours-marian-lr", True, score["alike"]),
    ]
    quality.paired_bootstrap(rows, [refs, worse, alike], {"val": refs})
    assert "p_vs_twin" not in rows[1] and rows[1]["ci95"] > 0
    assert rows[0]["p_vs_twin"] < 0.05 and rows[2]["p_vs_twin"] > 0.05
    alone = [row("ours", True, score["refs"]), row("ours", False, score["worse"])]
    quality.paired_bootstrap(alone, [refs, worse], {"val": refs})
    assert all("p_vs_twin" not in r and r["ci95"] >= 0 for r in alone)
    wrong = [row("marian", True, score["worse"]), row("ours", True, score["refs"] - 1)]  # a BLEU the test did not score
    with pytest.raises(RuntimeError, match="paired bootstrap scored"):
        quality.paired_bootstrap(wrong, [worse, refs], {"val": refs})
