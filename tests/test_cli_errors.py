"""Every command as a new user meets it: `--help` before torch loads, one clear line and exit status 2 for each bad
input (a truncated safetensors file, a config field of the wrong type, empty or misaligned data, no network), the
traceback only with --debug, files with the user's umask, metrics printed rounded."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from training import average, evaluate, export, publish, train, translate
from training.common.errors import EXIT_BAD_INPUT, run_command
from training.data.corpus import default_corpus
from training.data.tokenizer import train_tokenizer

from tiny_runs import TINY_TRAIN_ARGS, write_inputs

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
COMMANDS = {
    "train": train,
    "average": average,
    "evaluate": evaluate,
    "translate": translate,
    "publish": publish,
    "export": export,
}


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """A small model folder (weights, config, generation config, tokenizer) as train or average leave one."""
    folder = tmp_path_factory.mktemp("cli") / "model"
    corpus = default_corpus(seed=2, train_size=200, validation_size=0, test_size=0)
    tokenizer = train_tokenizer([t for row in corpus["train"]["translation"] for t in row.values()], vocab_size=150)
    config = VaswaniConfig(vocab_size=len(tokenizer), d_model=16, d_ff=32, h=2, encoder_layers=1, decoder_layers=1)
    torch.manual_seed(0)
    VaswaniForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def broken_copy(folder: Path, dest: Path, how: str) -> Path:
    shutil.copytree(folder, dest)
    if how == "truncated weights":
        weights = dest / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "config type":
        config = json.loads((dest / "config.json").read_text())
        (dest / "config.json").write_text(json.dumps({**config, "vocab_size": str(config["vocab_size"])}))
    return dest


def one_line_error(capsys, call) -> str:
    """Run a command through `run_command` (what `python -m training.X` does): exit 2, one line, no traceback."""
    with pytest.raises(SystemExit) as exit_info:
        call()
    assert exit_info.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: "), err
    return last


# ---- --help before any heavy import ----


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_is_answered_before_torch_loads(command):
    """--help took 10-12 s: torch and transformers loaded before the arguments were parsed. Checked by what is
    imported, not by a timing (tests must not depend on the machine's speed)."""
    script = (
        "import runpy, sys\n"
        f"sys.argv = ['{command}', '--help']\n"
        "try:\n"
        f"    runpy.run_module('training.{command}', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        # HfArgumentParser: transformers may load (it does not import torch), torch and the data libraries not
        "heavy = sorted(m for m in ('torch', 'datasets', 'accelerate') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout and "--debug" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "HEAVY []"


def test_train_help_shows_the_recipe_defaults():
    text = train.build_parser().format_help()
    squashed = " ".join(text.split())
    assert "optimizer steps (paper: 100,000) [default: 2,000, from recipe_tiny.json]" in squashed
    assert "ε_ls (paper: 0.1) [default: 0.1, from recipe_tiny.json]" in squashed  # label_smoothing_factor
    assert "--label_smoothing LABEL_SMOOTHING_FACTOR" in squashed  # the earlier flag, still accepted
    assert "seed for weights, dropout and batch order [default: 0]" in squashed  # not in the recipe: our default
    base = " ".join(train.build_parser("configuration/recipe_base.json").format_help().split())
    assert "optimizer steps (paper: 100,000) [default: 100,000, from recipe_base.json]" in base


@pytest.mark.parametrize(
    "command, argv, named",
    [
        ("translate", ["--model", "x", "-i", "/nonexistent/in.txt"], "--input /nonexistent/in.txt: no such file"),
        ("evaluate", ["--model", "x", "--output_dir", "/nonexistent/x", "--max_tokens", "0", "--dataset_name",
                      "default"], "--max_tokens must be a positive integer"),
        ("average", ["/nonexistent/run", "--output_dir", "/nonexistent/x"], "run folder /nonexistent/run: no such"),
        ("train", ["--recipe", "/nonexistent/recipe.json", "--output_dir", "/nonexistent/x"],
         "--recipe /nonexistent/recipe.json: no such file"),
    ],
)  # fmt: skip
def test_a_bad_input_ends_with_one_line_and_status_2_and_debug_shows_the_traceback(command, argv, named):
    done = subprocess.run([sys.executable, "-m", f"training.{command}", *argv], cwd=REPO, env=ENV,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == EXIT_BAD_INPUT and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ") and named in done.stderr, done.stderr
    debug = subprocess.run([sys.executable, "-m", f"training.{command}", *argv, "--debug"], cwd=REPO, env=ENV,
                           capture_output=True, text=True)  # fmt: skip
    assert debug.returncode == EXIT_BAD_INPUT and "Traceback" in debug.stderr


# ---- a truncated safetensors file, a config field of the wrong type ----


@pytest.mark.parametrize("how", ["truncated weights", "config type"])
def test_translate_and_evaluate_name_the_bad_file(model_folder, tmp_path, capsys, how):
    """Before: SafetensorError "incomplete metadata, file not fully covered" (no file name), or huggingface_hub's
    StrictDataclassFieldValidationError, each after a long traceback."""
    bad = broken_copy(model_folder, tmp_path / "bad", how)
    (tmp_path / "in.txt").write_text("five books\n")
    expected = (
        f"{bad / 'model.safetensors'}: unreadable safetensors weights"
        if how == "truncated weights"
        else f"{bad / 'config.json'}: VaswaniConfig.vocab_size must be of type int, got str '"
    )
    line = one_line_error(
        capsys, lambda: run_command(translate.main, ["--model", str(bad), "-i", str(tmp_path / "in.txt")])
    )
    assert expected in line
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("five books\n")
    ref.write_text("fünf Bücher\n")
    argv = ["--model", str(bad), "--source_file", str(src), "--reference_file", str(ref), "--output_dir",
            str(tmp_path / "eval")]  # fmt: skip
    assert expected in one_line_error(capsys, lambda: run_command(evaluate.main, argv))
    assert not (tmp_path / "eval").exists()


@pytest.mark.parametrize("how", ["truncated weights", "config type"])
def test_publish_names_the_bad_file(model_folder, tmp_path, capsys, how):
    bad = broken_copy(model_folder, tmp_path / "bad", how)
    argv = [str(bad), "--repo_id", "user/x", "--dry_run", "--output_dir", str(tmp_path / "upload")]
    line = one_line_error(capsys, lambda: run_command(publish.main, argv))
    name = "model.safetensors" if how == "truncated weights" else "config.json"
    assert str(bad / name) in line
    assert not (tmp_path / "upload").exists()


def test_a_config_field_of_the_wrong_type_is_a_named_value_error(tmp_path):
    config = json.loads((REPO / "configuration" / "tiny.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "vocab_size": "1000"}))
    with pytest.raises(ValueError, match=r"VaswaniConfig.vocab_size must be of type int, got str '1000'"):
        VaswaniConfig.from_json_file(path)
    with pytest.raises(ValueError, match=r"VaswaniConfig.p_drop must be of type float \| int, got str"):
        VaswaniConfig(p_drop="0.1")


# ---- data files: empty, missing, misaligned ----


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    return write_inputs(tmp_path_factory.mktemp("inputs"), train_size=200)


def train_argv(inputs: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["--model_config", str(inputs["model"]), "--train_file", str(inputs["train"]), *TINY_TRAIN_ARGS,
            "--max_steps", "2", "--warmup_steps", "2", "--output_dir", str(out), *extra]  # fmt: skip


@pytest.mark.parametrize("kind", ["moses", "tsv", "jsonl"])
def test_an_empty_training_file_is_named(inputs, tmp_path, capsys, kind):
    """Before: datasets' `Instruction "train" corresponds to no data!`, without the file's name."""
    if kind == "moses":
        (tmp_path / "empty.en").write_text("")
        (tmp_path / "empty.de").write_text("")
        given, named = tmp_path / "empty", tmp_path / "empty.en"
    else:
        given = named = tmp_path / f"empty.{kind}"
        named.write_text("" if kind == "jsonl" else "\n\n")
    out = tmp_path / "run"
    line = one_line_error(capsys, lambda: run_command(train.main, train_argv(inputs, out, "--train_file", str(given))))
    assert str(named) in line and "empty" in line
    assert not out.exists()


def test_missing_and_misaligned_files_give_one_line(inputs, tmp_path, capsys):
    """Before: a clear last line, but after a 20-36-line traceback."""
    out = tmp_path / "run"
    argv = train_argv(inputs, out, "--train_file", str(tmp_path / "nowhere.jsonl"))
    assert "nowhere.jsonl does not exist" in one_line_error(capsys, lambda: run_command(train.main, argv))
    (tmp_path / "m.en").write_text("one\ntwo\n")
    (tmp_path / "m.de").write_text("eins\n")
    argv = train_argv(inputs, out, "--train_file", str(tmp_path / "m"))
    line = one_line_error(capsys, lambda: run_command(train.main, argv))
    assert "misaligned" in line and "m.en has 2 lines" in line
    assert not out.exists()


# ---- validate before work; a failed run leaves the output folder as it found it ----


def test_a_bad_model_config_is_refused_before_the_tokenizer_is_trained(inputs, tmp_path):
    """Before: d_model not divisible by h was found after the BPE was trained, leaving tokenizer/ behind, so the
    corrected command was then refused until --overwrite_output_dir."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(inputs["model"].read_text()), "d_model": 30, "h": 4}))
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match=r"model_config .*bad.json: VaswaniConfig.d_model \(30\) must be divisible"):
        train.main(train_argv(inputs, out, "--model_config", str(bad)))
    assert not out.exists()


def test_a_run_that_fails_after_the_tokenizer_leaves_the_folder_as_it_was(inputs, tmp_path):
    """Every target empty: found only after the BPE is trained and the data tokenized."""
    sources_only = tmp_path / "sources_only.tsv"
    sources_only.write_text("".join(f"sentence number {i}\t\n" for i in range(50)))
    out = tmp_path / "run"
    argv = train_argv(inputs, out, "--train_file", str(sources_only))
    with pytest.raises(SystemExit, match="no training pair left: all 50 are empty or longer than max_length 64"):
        train.main(argv)
    assert not out.exists()
    out.mkdir()
    (out / "notes.txt").write_text("an earlier run")
    with pytest.raises(SystemExit, match="no training pair left"):
        train.main([*argv, "--overwrite_output_dir"])
    assert [p.name for p in out.iterdir()] == ["notes.txt"]  # --overwrite_output_dir replaces only a started run
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".replaced")]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--device", "tpu"], "device must be cpu, cuda or cuda:N, got 'tpu'"),
        (["--device", "cuda", "--use_cpu"], "--use_cpu contradicts --device cuda"),
        (["--max_tokens_per_step", "40"], "gives 40 tokens per micro-batch, less than max_length 64"),
    ],
)
def test_bad_device_and_budget_are_refused_before_any_work(inputs, tmp_path, extra, message):
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match=message):
        train.main(train_argv(inputs, out, *extra))
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_device_cuda_without_a_gpu_is_refused(inputs, tmp_path):
    with pytest.raises(SystemExit, match="--device cuda: no CUDA GPU is visible"):
        train.main(train_argv(inputs, tmp_path / "run", "--device", "cuda"))
    assert not (tmp_path / "run").exists()


def test_a_recipe_with_an_unknown_or_mistyped_setting_is_refused(inputs, tmp_path):
    recipe = json.loads((REPO / "configuration" / "recipe_tiny.json").read_text())
    (tmp_path / "typo.json").write_text(json.dumps({**recipe, "max_step": 10}))
    with pytest.raises(SystemExit, match=r"unknown setting\(s\) \['max_step'\]"):
        train.main(train_argv(inputs, tmp_path / "run", "--recipe", str(tmp_path / "typo.json")))
    (tmp_path / "types.json").write_text(json.dumps({**recipe, "lr_scale": "0.5", "warmup_steps": 40.5}))
    with pytest.raises(SystemExit, match=r"warmup_steps must be a positive integer, got 40.5\n.*lr_scale must be a "
                                         r"number, got '0.5'"):  # fmt: skip
        train.main(["--recipe", str(tmp_path / "types.json"), "--output_dir", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


# ---- the network ----


def test_publish_without_network_names_the_problem_in_one_line(model_folder, tmp_path, capsys, monkeypatch):
    """Before: a 72-line ConnectError traceback. Here the Hub endpoint is a closed local port (nothing leaves the
    machine)."""
    from huggingface_hub import constants

    monkeypatch.setattr(publish, "hub_offline", lambda: False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    argv = [str(model_folder), "--repo_id", "user/x", "--token", "hf_fake", "--output_dir", str(tmp_path / "up")]
    line = one_line_error(capsys, lambda: run_command(publish.main, argv))
    assert "cannot reach the Hub at http://127.0.0.1:9" in line and "nothing was uploaded" in line


# ---- what is written and printed ----


def test_saved_weights_follow_the_umask(inputs, model_folder, tmp_path):
    """safetensors (and mkstemp) write 0600; a folder shared with a group must be readable by it (umask 022: 0644)."""
    before = os.umask(0o022)
    try:
        out = tmp_path / "run"
        train.main(train_argv(inputs, out, "--save_steps", "2"))
        upload = tmp_path / "upload"
        publish.main([str(model_folder), "--repo_id", "user/x", "--dry_run", "--output_dir", str(upload)])
        avg = tmp_path / "avg"
        average.main([str(out), "--last", "1", "--output_dir", str(avg), "--quiet"])
        (tmp_path / "in.txt").write_text("five books\n")
        translated = tmp_path / "out.txt"
        translate.main(["--model", str(model_folder), "-i", str(tmp_path / "in.txt"), "-o", str(translated), "--quiet"])
    finally:
        os.umask(before)
    for path in (out / "model.safetensors", out / "checkpoint-2" / "model.safetensors", upload / "model.safetensors",
                 avg / "model.safetensors", avg / "config.json", translated):  # fmt: skip
        assert oct(path.stat().st_mode & 0o777) == oct(0o644), path
    assert oct(avg.stat().st_mode & 0o777) == oct(0o755)


def test_evaluation_results_are_printed_rounded_and_kept_whole(capsys):
    from transformers import TrainerControl, TrainerState

    from training.trainer.build import rounded_progress_callback

    callback = rounded_progress_callback()()
    callback.training_bar = type("Bar", (), {"write": lambda self, text: print(text)})()
    logs = {"eval_loss": 3.4567891234567, "eval_bleu": 12.345678901234, "epoch": 2.0}
    callback.on_log(None, TrainerState(), TrainerControl(), logs=logs)
    printed = capsys.readouterr().out
    assert "'eval_loss': 3.457" in printed and "'eval_bleu': 12.35" in printed and "3.4567" not in printed
    assert logs["eval_loss"] == 3.4567891234567  # what Trainer keeps (trainer_state.json) is untouched
