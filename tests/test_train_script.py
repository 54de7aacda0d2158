"""training/train.py as a user runs it: bad settings stop early, a short run, exact resume after SIGKILL, DDP."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training.checkpoints.complete import COMPLETE_MARKER, last_complete_checkpoint
from training.train import EXAMPLES, parse_settings, setting_types
from training.train import main as train_main
from training.trainer.build import TRAINING_ARGUMENTS

from tiny_runs import tiny_train_argv, write_inputs

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """Small JSONL splits of the default corpus, and a tiny model config with or without dropout."""
    root = tmp_path_factory.mktemp("data")
    files = write_inputs(root, train_size=600, validation_size=40, test_size=40, p_drop=0.1)
    files["model_nodrop"] = root / "model_nodrop.json"
    files["model_nodrop"].write_text(json.dumps({**json.loads(files["model"].read_text()), "p_drop": 0.0}))
    return files


def args(data: dict[str, Path], out: Path, *extra: str, model: str = "model") -> list[str]:
    return tiny_train_argv(data, out, "--logging_steps", "5", "--save_steps", "1000", *extra, model=model)


def run_script(argv: list[str], *launcher: str) -> subprocess.CompletedProcess:
    cmd = [*launcher, "-m", "training.train", *argv] if launcher else [sys.executable, "-m", "training.train", *argv]
    done = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--warmup_steps", "0"], "warmup_steps must be a positive integer"),
        (["--max_steps", "-3"], "max_steps must be a positive integer"),
        (["--label_smoothing_factor", "1.5"], r"label_smoothing_factor must be in \[0, 1\)"),
        (["--label_smoothing", "-0.1"], r"label_smoothing_factor must be in \[0, 1\)"),  # the earlier flag
        (["--save_total_limit", "0"], "save_total_limit must be a positive integer, got 0"),
        (["--streaming", "--num_workers", "2"], "--dataloader_num_workers must be 0"),
        (["--bf16", "--fp16"], "choose one of --bf16 and --fp16"),
        (["--target_lang", "en"], "source_lang and target_lang are both 'en'"),
        (["--resume"], "no complete checkpoint"),
    ],
)
def test_contradictory_settings_stop_before_any_work(data, tmp_path, extra, message):
    with pytest.raises(SystemExit, match=message):
        train_main(args(data, tmp_path / "run", "--max_steps", "5", *extra))
    assert not (tmp_path / "run" / "tokenizer").exists()


def recipe(tmp_path: Path, **changes: object) -> str:
    """configuration/recipe_tiny.json with `changes` (None removes a key), written to tmp_path."""
    settings = {**json.loads((REPO / "configuration" / "recipe_tiny.json").read_text()), **changes}
    path = tmp_path / f"recipe_{len(list(tmp_path.glob('recipe_*')))}.json"
    path.write_text(json.dumps({k: v for k, v in settings.items() if v is not None}))
    return str(path)


def test_a_switch_the_recipe_turns_on_is_turned_off_by_false(data, tmp_path):
    """Before: a flag counted only when not False, so `--bf16 false` could not undo a recipe's `"bf16": true`."""
    on = recipe(tmp_path, bf16=True)
    settings = [parse_settings(args(data, tmp_path / "run", "--recipe", on, *extra)) for extra in
                ([], ["--bf16", "false"], ["--bf16", "0"], ["--bf16"], ["--bf16", "false", "--fp16"])]  # fmt: skip
    assert [(s["bf16"], s["fp16"]) for s in settings] == [(True, False), (False, False), (False, False),
                                                         (True, False), (False, True)]  # fmt: skip
    with pytest.raises(SystemExit, match="choose one of --bf16 and --fp16"):  # the recipe's bf16 is still on
        parse_settings(args(data, tmp_path / "run", "--recipe", on, "--fp16"))
    assert parse_settings(args(data, tmp_path / "run", "--no_fused_loss"))["fused_loss"] is False
    assert parse_settings(args(data, tmp_path / "run", "--fused_loss", "false"))["fused_loss"] is False
    assert parse_settings(args(data, tmp_path / "run"))["fused_loss"] is True


def test_the_recipes_dataloader_workers_hold_unless_the_flag_is_given(data, tmp_path):
    """Before: --num_workers defaulted to 0 on the command line and so always replaced the recipe's value."""
    three = recipe(tmp_path, dataloader_num_workers=3)
    assert parse_settings(args(data, tmp_path / "run", "--recipe", three))["dataloader_num_workers"] == 3
    for flag in ("--dataloader_num_workers", "--num_workers"):  # today's name and the earlier one
        assert parse_settings(args(data, tmp_path / "run", "--recipe", three, flag, "1"))["dataloader_num_workers"] == 1
    assert parse_settings(args(data, tmp_path / "run"))["dataloader_num_workers"] == 0  # no recipe value: 0


def test_a_recipe_with_the_earlier_key_names_still_trains_the_same_settings(data, tmp_path):
    old = recipe(tmp_path, label_smoothing_factor=None, label_smoothing=0.2, num_workers=2, no_fused_loss=True)
    s = parse_settings(args(data, tmp_path / "run", "--recipe", old))
    assert (s["label_smoothing_factor"], s["dataloader_num_workers"], s["fused_loss"]) == (0.2, 2, False)
    assert "label_smoothing" not in s and "num_workers" not in s and "no_fused_loss" not in s
    both = recipe(tmp_path, label_smoothing=0.2)
    with pytest.raises(SystemExit, match="label_smoothing and label_smoothing_factor are the same setting"):
        parse_settings(args(data, tmp_path / "run", "--recipe", both))


def test_a_data_source_on_the_command_line_replaces_the_recipes_other_one(data, tmp_path):
    files = recipe(tmp_path, dataset_name=None, train_file=str(data["train"]), validation_file=str(data["validation"]))
    hub = parse_settings(["--recipe", files, "--output_dir", str(tmp_path / "run"), "--dataset_name", "default"])
    assert hub["dataset_name"] == "default" and "train_file" not in hub and "validation_file" not in hub
    local = parse_settings(args(data, tmp_path / "run"))  # recipe_tiny.json names the default corpus
    assert "dataset_name" not in local or local["dataset_name"] is None
    assert local["train_file"] == str(data["train"])


def test_the_settings_trainer_reads_have_seq2seq_training_arguments_names():
    """Every setting handed to Seq2SeqTrainingArguments by name (TRAINING_ARGUMENTS) is one of ours and one of its
    fields; and each of ours that it has is handed over, except those the run sets itself."""
    import dataclasses

    from transformers import Seq2SeqTrainingArguments

    theirs = {f.name for f in dataclasses.fields(Seq2SeqTrainingArguments)}
    ours = set(setting_types())
    assert set(TRAINING_ARGUMENTS) <= ours & theirs
    # output_dir: the run folder; use_cpu: after --device; warmup_steps: the §5.3 schedule's (VaswaniTrainer)
    assert ours & theirs - set(TRAINING_ARGUMENTS) == {"output_dir", "use_cpu", "warmup_steps"}
    for name in ("label_smoothing", "num_workers", "no_fused_loss"):  # earlier names: aliases only
        assert name not in ours


def test_a_budget_below_the_longest_allowed_sentence_is_refused_before_any_work(data, tmp_path):
    with pytest.raises(SystemExit, match="gives 8 tokens per micro-batch, less than max_length 64"):
        train_main(args(data, tmp_path / "run", "--max_steps", "5", "--max_tokens_per_step", "8"))
    assert not (tmp_path / "run").exists()


def test_missing_and_misaligned_files_are_named(data, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        train_main(args(data, tmp_path / "a", "--max_steps", "5", "--train_file", str(tmp_path / "nowhere.jsonl")))
    (tmp_path / "m.en").write_text("one\ntwo\n")
    (tmp_path / "m.de").write_text("eins\n")
    with pytest.raises(ValueError, match="m.en"):
        train_main(args(data, tmp_path / "b", "--max_steps", "5", "--train_file", str(tmp_path / "m")))


def test_an_existing_run_is_never_overwritten_without_a_flag(data, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="not empty"):
        train_main(args(data, out, "--max_steps", "5"))
    assert (out / "notes.txt").read_text() == "mine"


def test_short_run_saves_a_folder_that_loads_and_translates(data, tmp_path, capsys):
    """The whole path on a small scale: train, validate with BLEU, save, reload with the Auto classes, pipeline."""
    out = tmp_path / "run"
    summary = train_main(args(data, out, "--max_steps", "30", "--eval_steps", "15", "--test_file", str(data["test"])))
    printed = [line[2:].split("  →  ") for line in capsys.readouterr().out.splitlines() if "  →  " in line]
    assert summary["steps"] == 30 and summary["tokens_per_second"] > 0
    assert "eval_bleu" in summary["validation"] and "test_bleu" in summary["test"]
    assert summary["signatures"]["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= names
    assert {"training_curves.png", "run_summary.json", "tensorboard"} <= names
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pth", ".pkl"))]
    history = json.loads((out / "checkpoint-30" / "trainer_state.json").read_text())["log_history"]
    assert any("nll" in row and "loss" in row and "learning_rate" in row for row in history)
    assert sum("eval_bleu" in row for row in history) >= 2

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForSeq2SeqLM.from_pretrained(out)
    assert model.generation_config.num_beams == 4 and model.generation_config.max_length is None
    # transformers 5 removed its "translation" task; the model folder brings its own pipeline as remote code
    translator = pipeline("translation", model=str(out), trust_remote_code=True)
    texts = ["I bought 3 books.", "on Monday", "at 5:45 pm"]
    [one] = translator(texts[0])
    many = translator(texts)
    expected = [
        tokenizer.decode(model.generate(**tokenizer([t], return_tensors="pt"))[0], skip_special_tokens=True)
        for t in texts
    ]  # the model's own decoding: beam 4, GNMT α = 0.6
    assert one == {"translation_text": expected[0]}
    assert many == [{"translation_text": e} for e in expected]
    # the examples the run prints (training/inference/translation.py) are the model's own batched decoding
    sources = [source for source, _ in printed]
    assert sources == EXAMPLES["en"]
    batch = model.generate(**tokenizer(sources, return_tensors="pt", padding=True))
    assert [hyp for _, hyp in printed] == tokenizer.batch_decode(batch, skip_special_tokens=True)


def _params(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def test_resume_after_sigkill_gives_the_uninterrupted_parameters(data, tmp_path):
    """Kill a real run with SIGKILL after its step-8 checkpoint, resume it: same weights as a run never killed.

    Dropout is on, so this also checks that the RNG state and the batch position come back. Tolerance: 1e-6
    (absolute), though on one CPU process the two runs are expected to agree exactly.
    """
    steps = ["--max_steps", "40", "--save_steps", "8", "--save_total_limit", "10", "--seed", "3"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_script(args(data, straight, *steps))

    cmd = [sys.executable, "-m", "training.train", *args(data, killed, *steps)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (killed / "checkpoint-8" / COMPLETE_MARKER).exists():
        assert proc.poll() is None and time.time() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    newest = last_complete_checkpoint(killed)
    assert newest is not None and newest.name != "checkpoint-40", "killed too late to test anything"
    # a checkpoint whose write was interrupted: present but without its marker; resume must not pick it up
    half = killed / "checkpoint-39"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"truncated")
    assert last_complete_checkpoint(killed) == newest

    run_script(args(data, killed, *steps, "--resume"))
    assert (killed / "incomplete-checkpoint-39").is_dir()
    a, b = _params(straight), _params(killed)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=key)


def test_resume_refuses_a_checkpoint_of_another_model(data, tmp_path):
    out = tmp_path / "run"
    run_script(args(data, out, "--max_steps", "4", "--save_steps", "4"))
    other = json.loads(data["model"].read_text())
    (tmp_path / "other.json").write_text(json.dumps({**other, "d_ff": 128}))
    with pytest.raises(SystemExit, match="from another model.*d_ff=64"):
        train_main(args(data, out, "--max_steps", "8", "--resume", "--model_config", str(tmp_path / "other.json")))


def test_two_processes_match_one_process_over_the_same_global_batch(data, tmp_path):
    """DDP with 2 gloo processes (torchrun), one micro-batch each, against 1 process accumulating the same 2.

    Rank r takes batches r, r+2, ... of the sampler's order, which is what 1 process with 2 accumulation steps
    consumes per step; the loss is normalised by the global target-token count in both. Dropout is 0 (the ranks'
    dropout masks would differ). Tolerance 1e-5: only the order of floating-point reductions differs. Adam's ε is
    1e-3 here, not the paper's 1e-9: with 1e-9, a coordinate whose gradient is pure rounding noise (the key biases,
    whose gradient is zero in exact arithmetic since softmax ignores a shift shared by all keys) gets a full-size
    Adam step of random sign, so two correct runs would differ by up to the learning rate there.
    """
    common = ["--max_steps", "6", "--eval_steps", "1000", "--seed", "5", "--max_tokens_per_step", "1200"]
    common += ["--adam_epsilon", "1e-3"]
    one, two = tmp_path / "one", tmp_path / "two"
    run_script(args(data, one, *common, "--gradient_accumulation_steps", "2", model="model_nodrop"))
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    run_script(args(data, two, *common, model="model_nodrop"), *launcher)
    summary = json.loads((two / "run_summary.json").read_text())
    assert summary["devices"] == "2 x cpu"
    assert (
        summary["tokens_seen_src_plus_tgt"]
        == json.loads((one / "run_summary.json").read_text())["tokens_seen_src_plus_tgt"]
    )  # the same batches were seen
    a, b = _params(one), _params(two)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-5, msg=lambda m, key=key: f"{key}: {m}")
    from transformers import AutoModelForSeq2SeqLM

    import modeling_vaswani  # noqa: F401  (registers "vaswani" with the Auto classes when this test runs alone)

    batch = {"input_ids": torch.tensor([[5, 17, 42, 9, 2]]), "decoder_input_ids": torch.tensor([[0, 33, 8, 21]])}
    logits = [AutoModelForSeq2SeqLM.from_pretrained(run).eval()(**batch).logits for run in (one, two)]
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=1e-4)


def test_a_second_run_on_the_same_files_reuses_the_bpe_and_the_tokenized_data(data, tmp_path, monkeypatch):
    """Run 1 learns the BPE and tokenizes; run 2 (same files, vocabulary, filter; a new run folder) loads both from
    the cache without tokenizing a pair; run 3 with another vocabulary size learns a new BPE. All three record it."""
    import datasets

    import training.data.parallel

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    rows = [json.loads(line)["translation"] for line in data["train"].read_text().splitlines()]
    prefix = tmp_path / "train"
    for lang in ("en", "de"):
        Path(f"{prefix}.{lang}").write_text("".join(r[lang] + "\n" for r in rows), encoding="utf-8")
    steps = ["--max_steps", "2", "--train_file", str(prefix), "--num_proc", "1"]
    first = train_main(args(data, tmp_path / "one", *steps))["data_preparation"]
    assert first["bpe"]["cached"] is False and first["bpe"]["pairs_used"] == len(rows)

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized again although files, tokenizer and filter are the same")

    with monkeypatch.context() as m:
        m.setattr(training.data.parallel, "_encode_table", no_tokenizing)
        second = train_main(args(data, tmp_path / "two", *steps))
    assert second["data_preparation"]["bpe"]["cached"] is True
    assert second["seconds_to_first_step"] > 0
    tokenizers = [(tmp_path / run / "tokenizer.json").read_text() for run in ("one", "two")]
    assert tokenizers[0] == tokenizers[1]
    third = train_main(args(data, tmp_path / "three", *steps, "--vocab_size", "280"))["data_preparation"]
    assert third["bpe"]["cached"] is False and third["bpe"]["key"] != first["bpe"]["key"]
    with pytest.raises(SystemExit, match="num_proc must be a positive integer"):
        train_main(args(data, tmp_path / "four", *steps, "--num_proc", "0"))
