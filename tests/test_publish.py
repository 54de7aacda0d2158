"""training/publish.py: the upload folder (what it holds, that it loads as remote code where this package is not
installed, that it translates as we do), bad input refused before any work, and the push through a mocked HfApi.

Everything offline: the push test mocks `HfApi.create_repo` and `HfApi.upload_folder`; nothing reaches the Hub.
"""

from __future__ import annotations

import contextlib
import filecmp
import io
import json
import re
import shutil
from pathlib import Path
from unittest import mock

import pytest
import torch
from huggingface_hub import HfApi
from safetensors.torch import load_file

import modeling_vaswani
from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from training import publish
from training.data.corpus import default_corpus
from training.data.tokenizer import train_tokenizer
from training.hub import upload

from isolated import run_isolated

PACKAGE_DIR = Path(modeling_vaswani.__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"}
UPLOAD_FILES = {
    "README.md",
    "config.json",
    *modeling_vaswani.code_files(),
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "training_curves.png",
}
TEXTS = ["I bought forty-five books on Monday.", "on March 5, 2021", "three hundred forty-two apples", ""]

# A fresh interpreter that cannot import this package (a meta-path finder refuses it, and no sys.path entry holds
# it) loads FOLDER with the Auto classes and the translation pipeline, as a Hub user would, and translates TEXTS.
CHILD = """
    import json, sys

    folder, texts = sys.argv[1], json.loads(sys.argv[2])

    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    # Without trust_remote_code, transformers 5.24's AutoTokenizer reads config.json through AutoConfig, which
    # asks on stdin whether to run the remote code; with no terminal (stdin is /dev/null) that is a "no" and
    # AutoTokenizer falls back to the plain config: it still loads. The model card passes trust_remote_code=True.
    plain = AutoTokenizer.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokens = []
    with torch.no_grad():
        for text in texts:
            tokens.append(model.generate(**tokenizer([text], return_tensors="pt"))[0].tolist())
    translator = pipeline("translation", model=folder, trust_remote_code=True)
    print("\\nRESULT " + json.dumps({
        "plain_tokenizer_same": plain.get_vocab() == tokenizer.get_vocab() and type(plain) is type(tokenizer),
        "model_class": type(model).__name__,
        "model_module": type(model).__module__,
        "config_module": type(model.config).__module__,
        "pipeline_class": type(translator).__name__,
        "pipeline_module": type(translator).__module__,
        "tokens": tokens,
        "texts": [tokenizer.decode(t, skip_special_tokens=True) for t in tokens],
        "pipeline": [out["translation_text"] for out in translator(texts)],
        "our_modules": sorted(n for n in sys.modules if n.rpartition(".")[2].endswith("_vaswani")),
        "training_imported": any(n == "training" or n.startswith("training.") for n in sys.modules),
    }))
    """


def load_in_fresh_process(folder: Path, texts: list[str], tmp_path: Path) -> dict:
    """Run CHILD on `folder`: HF_HUB_OFFLINE, a private modules cache, and neither the checkout nor PYTHONPATH."""
    child = run_isolated(CHILD, [str(folder), json.dumps(texts)], tmp_path)
    for module in (child["model_module"], child["config_module"], child["pipeline_module"], *child["our_modules"]):
        assert module.startswith("transformers_modules."), module  # the folder's copy, not this checkout
    assert child["model_class"] == "VaswaniForConditionalGeneration"
    assert child["pipeline_class"] == "VaswaniTranslationPipeline"
    assert not child["training_imported"]
    assert child["plain_tokenizer_same"]
    return child


def own_tokens(folder: Path, texts: list[str]) -> list[list[int]]:
    """This checkout's model on `folder`, decoding each text alone with the saved generation config."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = VaswaniForConditionalGeneration.from_pretrained(folder).eval()
    with torch.no_grad():
        return [model.generate(**tokenizer([t], return_tensors="pt"))[0].tolist() for t in texts]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """A small model folder as a run leaves it, with what must never travel: a pickle, checkpoints, logs.

    No run_summary.json: the card then says "not recorded" (tests/test_model_card.py covers a real run)."""
    folder = tmp_path_factory.mktemp("run") / "model"
    corpus = default_corpus(seed=2, train_size=300, validation_size=5, test_size=5)
    texts = [text for row in corpus["train"]["translation"] for text in row.values()]
    tokenizer = train_tokenizer(texts, vocab_size=150, show_progress=False)
    config = VaswaniConfig(
        vocab_size=len(tokenizer), d_model=16, d_ff=32, h=2, encoder_layers=2, decoder_layers=2, p_drop=0.0
    )
    torch.manual_seed(0)
    VaswaniForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "training_curves.png").write_bytes(b"\x89PNG\r\n\x1a\n not a real plot")
    (folder / "training_args.bin").write_bytes(b"\x80\x04 a pickle")
    (folder / "checkpoint-4").mkdir()
    (folder / "checkpoint-4" / "optimizer.pt").write_bytes(b"\x80\x04 a pickle")
    (folder / "tensorboard").mkdir()
    (folder / "tensorboard" / "events.out.tfevents.1").write_bytes(b"log")
    return folder


@pytest.fixture(scope="module")
def dry_run(model_folder, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("publish") / "upload"
    argv = [str(model_folder), "--repo_id", "user/tiny-vaswani", "--dry_run", "--output_dir", str(out)]
    with contextlib.redirect_stdout(io.StringIO()) as stdout:
        result = publish.main(argv)
    assert result["folder"] == out and result["url"] is None
    return out, stdout.getvalue()


def test_dry_run_writes_exactly_the_upload_folder(model_folder, dry_run):
    out, printed = dry_run
    files = {p.relative_to(out).as_posix() for p in out.rglob("*")}
    assert files == UPLOAD_FILES
    assert not [f for f in files if Path(f).suffix in PICKLE_SUFFIXES]
    for name in UPLOAD_FILES:  # the listing names every file with its size
        assert f"{name} " in printed and f"{(out / name).stat().st_size:,} bytes" in printed
    for name in modeling_vaswani.code_files():
        assert filecmp.cmp(out / name, PACKAGE_DIR / name, shallow=False), f"{name} is not this checkout's"
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "vaswani"
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == "modeling_vaswani.VaswaniForConditionalGeneration"
    assert config["auto_map"]["AutoConfig"] == "configuration_vaswani.VaswaniConfig"
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_vaswani.VaswaniTranslationPipeline"
    assert (out / "generation_config.json").read_bytes() == (model_folder / "generation_config.json").read_bytes()
    assert (out / "training_curves.png").read_bytes() == (model_folder / "training_curves.png").read_bytes()
    staged, original = load_file(out / "model.safetensors"), load_file(model_folder / "model.safetensors")
    assert staged.keys() == original.keys()
    for key, tensor in original.items():
        assert torch.equal(staged[key], tensor), key
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and "user/tiny-vaswani" in card and "{{" not in card
    assert "not recorded" in card  # this folder has no run_summary.json: the card does not make one up


def test_dry_run_folder_loads_without_our_package_and_translates_as_we_do(model_folder, dry_run, tmp_path):
    """A process without this package: Auto classes + AutoTokenizer + pipeline from the folder alone."""
    out, _ = dry_run
    child = load_in_fresh_process(out, TEXTS, tmp_path)
    assert child["tokens"] == own_tokens(model_folder, TEXTS)
    # the pipeline is the commands' translation path (pipeline_vaswani.translate_batched): a blank text gives ""
    assert child["pipeline"] == [
        text if source.strip() else "" for source, text in zip(TEXTS, child["texts"], strict=True)
    ]
    assert any(child["texts"]), "every output is empty: the comparison says nothing"


def test_a_config_naming_the_pipeline_by_its_old_module_still_finds_it(dry_run, tmp_path):
    """Folders saved before `pipeline_vaswani.py` existed name the pipeline `modeling_vaswani.VaswaniTranslationPipeline`
    in `custom_pipelines`; with today's code files beside that config, the pipeline still loads and translates alike."""
    from transformers import pipeline

    out, _ = dry_run
    old = tmp_path / "old-config"
    shutil.copytree(out, old)
    config = json.loads((old / "config.json").read_text())
    config["custom_pipelines"]["translation"]["impl"] = "modeling_vaswani.VaswaniTranslationPipeline"
    (old / "config.json").write_text(json.dumps(config))
    old_translator = pipeline("translation", model=str(old), trust_remote_code=True)
    translator = pipeline("translation", model=str(out), trust_remote_code=True)
    assert type(old_translator).__name__ == "VaswaniTranslationPipeline"
    assert type(old_translator).__module__.startswith("transformers_modules.")  # the folder's copy
    texts = [text for text in TEXTS if text]
    translations = [row["translation_text"] for row in old_translator(texts)]
    assert translations == [row["translation_text"] for row in translator(texts)]
    assert any(translations), "every output is empty: the comparison says nothing"


@pytest.mark.parametrize("repo_id", ["a/b/c", "bad name!", "-x", "user/x--y", "user/name.git", ""])
def test_invalid_repo_ids_are_refused_before_any_work(model_folder, tmp_path, capsys, repo_id):
    out = tmp_path / "upload"
    with pytest.raises(SystemExit) as exit_info:
        publish.main([str(model_folder), f"--repo_id={repo_id}", "--dry_run", "--output_dir", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--repo_id {repo_id!r} is not a valid Hub repository id" in err
    assert not out.exists()


def _broken(folder: Path, tmp_path: Path, how: str) -> Path:
    copy = tmp_path / "broken"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("checkpoint-*", "tensorboard"))
    if how == "no_config":
        (copy / "config.json").unlink()
    elif how == "pickle_weights_only":
        (copy / "model.safetensors").rename(copy / "pytorch_model.bin")
    elif how == "no_weights":
        (copy / "model.safetensors").unlink()
        (copy / "training_args.bin").unlink()
    elif how == "no_tokenizer":
        (copy / "tokenizer.json").unlink()
        (copy / "tokenizer_config.json").unlink()
    elif how == "other_model_type":
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**config, "model_type": "bart"}))
    elif how == "config_not_json":
        (copy / "config.json").write_text("{not json")
    return copy


@pytest.mark.parametrize(
    "how, message",
    [
        ("no_config", "is not a model folder: no config.json"),
        ("pickle_weights_only", r"no model.safetensors \(only pickle files: pytorch_model.bin, training_args.bin"),
        ("no_weights", "is not a model folder: no model.safetensors$"),
        ("no_tokenizer", "is not a model folder: no tokenizer"),
        ("other_model_type", "model_type is 'bart', not 'vaswani'"),
        ("config_not_json", "config.json is not valid JSON"),
    ],
)
def test_a_folder_that_is_not_a_model_folder_is_refused(model_folder, tmp_path, capsys, how, message):
    folder = _broken(model_folder, tmp_path, how)
    out = tmp_path / "upload"
    with pytest.raises(SystemExit):
        publish.main([str(folder), "--repo_id", "user/x", "--dry_run", "--output_dir", str(out)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(message, err), err
    assert not out.exists()


def test_missing_folder_and_bad_scores_are_refused(model_folder, tmp_path, capsys):
    cases = [
        ([str(tmp_path / "nowhere"), "--repo_id", "user/x"], "no such folder"),
        ([str(model_folder), "--repo_id", "user/x", "--scores", "test"], "expected NAME=PATH"),
        ([str(model_folder), "--repo_id", "user/x", "--scores", f"test={tmp_path / 'none.json'}"], "no such file"),
    ]
    (tmp_path / "no_bleu.json").write_text(json.dumps({"chrf": 3.0}))
    cases.append(([str(model_folder), "--repo_id", "user/x", "--scores", f"t={tmp_path / 'no_bleu.json'}"], "bleu"))
    (tmp_path / "scores.json").write_text(json.dumps({"bleu": 3.0}))
    twice = ["--scores", f"t={tmp_path / 'scores.json'}"] * 2
    cases.append(([str(model_folder), "--repo_id", "user/x", *twice], "given twice"))
    other = tmp_path / "other"  # scores of another model (other weights) must not go into this model's card
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"other weights")
    (tmp_path / "other.json").write_text(json.dumps({"bleu": 3.0, "model": str(other)}))
    cases.append(([str(model_folder), "--repo_id", "user/x", "--scores", f"t={tmp_path / 'other.json'}"], "not those"))
    for argv, message in cases:
        with pytest.raises(SystemExit):
            publish.main([*argv, "--dry_run", "--output_dir", str(tmp_path / "upload")])
        assert message in capsys.readouterr().err, argv
        assert not (tmp_path / "upload").exists()


def test_an_existing_output_folder_is_kept_without_overwrite(model_folder, tmp_path, capsys):
    out = tmp_path / "upload"
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    argv = [str(model_folder), "--repo_id", "user/x", "--dry_run", "--output_dir", str(out)]
    with pytest.raises(SystemExit):
        publish.main(argv)
    assert "exists and is not empty: pass --overwrite" in capsys.readouterr().err
    assert (out / "mine.txt").read_text() == "mine"
    publish.main([*argv, "--overwrite"])
    assert {p.name for p in out.iterdir()} == UPLOAD_FILES  # replaced, not merged
    for inside in (model_folder, model_folder.parent):  # never the model folder or a folder holding it
        with pytest.raises(SystemExit):
            publish.main([str(model_folder), "--repo_id", "user/x", "--dry_run", "--output_dir", str(inside)])
        assert "is the model folder or holds it" in capsys.readouterr().err
    assert (model_folder / "model.safetensors").is_file()


def test_default_dry_run_folder_is_inside_the_model_folder(model_folder, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(model_folder, folder)
    result = publish.main([str(folder), "--repo_id", "user/x", "--dry_run"])
    assert result["folder"] == folder / "hub-upload"
    assert {p.name for p in (folder / "hub-upload").iterdir()} == UPLOAD_FILES


def test_push_creates_the_repo_and_uploads_the_staged_folder(model_folder, tmp_path, monkeypatch):
    """Without --dry_run: HfApi.create_repo(repo_id, private=..., exist_ok=True), then upload_folder of the staging
    folder, whose files at that moment are exactly the upload set. Both are mocked: nothing leaves the machine."""
    monkeypatch.setattr(publish, "hub_offline", lambda: False)
    seen = {}

    def fake_upload(self, *, folder_path, repo_id, **kwargs):
        seen["folder"] = Path(folder_path)
        seen["files"] = {p.name for p in Path(folder_path).iterdir()}
        seen["kwargs"] = {"repo_id": repo_id, **kwargs}
        return mock.Mock(commit_url="https://huggingface.co/user/tiny-vaswani/commit/abc")

    for private in (True, False):
        with (
            mock.patch.object(HfApi, "create_repo", autospec=True) as create_repo,
            mock.patch.object(HfApi, "upload_folder", autospec=True, side_effect=fake_upload) as upload_folder,
        ):
            argv = [str(model_folder), "--repo_id", "user/tiny-vaswani", "--token", "hf_fake"]
            result = publish.main(argv + (["--private"] if private else []))
        create_repo.assert_called_once()
        _, kwargs = create_repo.call_args
        assert kwargs == {"repo_id": "user/tiny-vaswani", "repo_type": "model", "private": private, "exist_ok": True}
        assert create_repo.call_args.args[0].token == "hf_fake"
        upload_folder.assert_called_once()
        assert seen["folder"] == result["folder"]
        assert seen["files"] == UPLOAD_FILES
        assert seen["kwargs"]["repo_id"] == "user/tiny-vaswani" and seen["kwargs"]["repo_type"] == "model"
        assert result["url"] == "https://huggingface.co/user/tiny-vaswani/commit/abc"
        assert not seen["folder"].exists()  # a temporary staging folder is removed after the upload

    out = tmp_path / "kept"  # with --output_dir the staged folder stays
    with (
        mock.patch.object(HfApi, "create_repo", autospec=True),
        mock.patch.object(HfApi, "upload_folder", autospec=True, side_effect=fake_upload),
    ):
        publish.main([str(model_folder), "--repo_id", "user/tiny-vaswani", "--output_dir", str(out)])
    assert seen["folder"] == out and {p.name for p in out.iterdir()} == UPLOAD_FILES


def test_offline_push_is_refused_before_any_work(model_folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(publish, "hub_offline", lambda: True)
    with (
        mock.patch.object(HfApi, "create_repo") as create_repo,
        mock.patch.object(HfApi, "upload_folder") as upload_folder,
        pytest.raises(SystemExit),
    ):
        publish.main([str(model_folder), "--repo_id", "user/x", "--output_dir", str(tmp_path / "upload")])
    assert "HF_HUB_OFFLINE is set" in capsys.readouterr().err
    create_repo.assert_not_called()
    upload_folder.assert_not_called()
    assert not (tmp_path / "upload").exists()


def test_an_upload_folder_with_a_pickle_or_without_code_fails_its_check(model_folder, dry_run, tmp_path):
    out, _ = dry_run
    for damage, message in (
        (lambda d: (d / "extra.pkl").write_bytes(b"\x80\x04"), "pickle files"),
        (lambda d: (d / "sub").mkdir() or (d / "sub" / "weights.pt").write_bytes(b"\x80"), "pickle files"),
        (lambda d: (d / "modeling_vaswani.py").unlink(), "lacks modeling_vaswani.py"),
        (lambda d: (d / "kernels_vaswani.py").unlink(), "lacks kernels_vaswani.py"),  # a sibling modeling imports
        (lambda d: (d / "configuration_vaswani.py").write_text("# another version\n"), "is not this checkout's"),
        (lambda d: (d / "tokenizer.json").unlink(), "lacks tokenizer.json"),
    ):
        staged = tmp_path / "staged"
        shutil.rmtree(staged, ignore_errors=True)
        shutil.copytree(out, staged)
        damage(staged)
        with pytest.raises(publish.PublishError, match=message):
            upload.check_upload_folder(model_folder, staged)
