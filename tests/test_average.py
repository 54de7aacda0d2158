"""training/average.py on a real (small) run: the exact mean, one checkpoint bit-equal, the tie, every bad input."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from training.average import main as average_main
from training.checkpoints.averaging import average_state_dicts
from training.checkpoints.complete import COMPLETE_MARKER
from training.train import main as train_main

from tiny_runs import write_inputs

REPO = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def run(tmp_path_factory, one_thread) -> Path:
    """A real training run (training/train.py): d_model 32, 600 pairs, 12 steps, checkpoints at 4, 8 and 12."""
    root = tmp_path_factory.mktemp("average")
    files = write_inputs(root, train_size=600)
    train = files["train"]
    out = root / "run"
    train_main([
        "--model_config", str(root / "model.json"), "--train_file", str(train), "--vocab_size", "300",
        "--max_tokens_per_step", "600", "--warmup_steps", "10", "--max_steps", "12", "--save_steps", "4",
        "--save_total_limit", "10", "--logging_steps", "4", "--output_dir", str(out),
    ])  # fmt: skip
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-12", "checkpoint-4", "checkpoint-8"]
    return out


@pytest.fixture(scope="module")
def averaged(run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("averaged") / "avg2"
    average_main([str(run), "--last", "2", "--output_dir", str(out), "--quiet"])
    return out


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def test_two_checkpoints_average_to_their_exact_mean(run, averaged):
    """Expected: (a + b) / 2 computed here in float64 from the two files. Both checkpoints are float32, and the sum
    of two float32 numbers is exact in float64, so the only error is the one rounding to float32: at most half an
    ulp, i.e. a relative 2^-24. The stored result must equal that once-rounded value bit for bit."""
    a, b, avg = weights(run / "checkpoint-8"), weights(run / "checkpoint-12"), weights(averaged)
    assert avg.keys() == a.keys() == b.keys()
    differing = 0
    for key in a:
        expected = (a[key].double() + b[key].double()) / 2
        assert avg[key].dtype == torch.float32
        torch.testing.assert_close(avg[key].double(), expected, rtol=2**-24, atol=1e-30, msg=key)
        assert torch.equal(avg[key], expected.float()), key
        differing += not torch.equal(a[key], b[key])
    assert differing > len(a) // 2, "the two checkpoints hardly differ: the test would prove little"
    record = json.loads((averaged / "averaging.json").read_text())
    assert record["steps"] == [8, 12] and record["num_checkpoints"] == 2
    assert [c["name"] for c in record["checkpoints"]] == ["checkpoint-8", "checkpoint-12"]
    assert record["accumulation_dtype"] == "float64"


def test_one_checkpoint_gives_it_back_bit_equal(run, tmp_path):
    out = tmp_path / "one"
    average_main(["--checkpoints", str(run / "checkpoint-4"), "--output_dir", str(out), "--quiet"])
    original, copy = weights(run / "checkpoint-4"), weights(out)
    assert original.keys() == copy.keys()
    for key in original:
        assert copy[key].dtype == original[key].dtype and torch.equal(copy[key], original[key]), key


def test_averaged_folder_loads_with_the_tie_intact_and_everything_copied(run, averaged):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    stored = weights(averaged)
    assert "model.shared.weight" in stored and "lm_head.weight" not in stored  # the shared matrix is stored once
    model = AutoModelForSeq2SeqLM.from_pretrained(averaged)
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared
    assert model.model.encoder.embed_tokens.weight is shared and model.model.decoder.embed_tokens.weight is shared
    assert torch.equal(shared, stored["model.shared.weight"])
    assert model.generation_config.num_beams == 4 and model.generation_config.length_penalty_rule == "gnmt"
    assert AutoTokenizer.from_pretrained(averaged).get_vocab() == AutoTokenizer.from_pretrained(run).get_vocab()
    names = {p.name for p in averaged.iterdir()}
    assert {"config.json", "generation_config.json", "modeling_vaswani.py", "configuration_vaswani.py"} <= names
    assert {"tokenizer.json", "tokenizer_config.json", "averaging.json", "run_summary.json"} <= names
    assert (averaged / "training_curves.png").read_bytes() == (run / "training_curves.png").read_bytes()
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pth", ".pkl"))]
    config = json.loads((averaged / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == "modeling_vaswani.VaswaniForConditionalGeneration"


def test_translation_pipeline_works_on_the_averaged_folder(averaged):
    """transformers 5 has no "translation" task of its own: the folder brings VaswaniTranslationPipeline."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    translator = pipeline("translation", model=str(averaged), trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(averaged)
    model = AutoModelForSeq2SeqLM.from_pretrained(averaged)
    texts = ["I bought 3 books.", "on Monday"]
    expected = [
        tokenizer.decode(model.generate(**tokenizer([t], return_tensors="pt"))[0], skip_special_tokens=True)
        for t in texts
    ]
    assert translator(texts) == [{"translation_text": e} for e in expected]


def test_integer_and_bool_tensors_are_not_averaged():
    float_a, float_b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 2.0, 0.5])
    steps = torch.tensor([7, 9], dtype=torch.int64)
    mask = torch.tensor([True, False])
    same = [{"w": float_a, "steps": steps, "mask": mask}, {"w": float_b, "steps": steps.clone(), "mask": mask.clone()}]
    out, differing = average_state_dicts(same)
    assert torch.equal(out["w"], torch.tensor([1.5, 2.0, 1.75]))
    assert out["steps"].dtype == torch.int64 and torch.equal(out["steps"], steps) and differing == []
    assert out["mask"].dtype == torch.bool and torch.equal(out["mask"], mask)
    # differing integer tensors: the last one's is kept, untouched, and reported; averaging would give [8, 9]
    other = [{"w": float_a, "steps": torch.tensor([7, 9])}, {"w": float_b, "steps": torch.tensor([9, 9])}]
    out, differing = average_state_dicts(other)
    assert torch.equal(out["steps"], torch.tensor([9, 9])) and differing == ["steps"]
    # bfloat16 storage: accumulated wide, rounded once. The mean of 1, 1 + 2^-7, 1 + 2^-7 is 1.0052, whose nearest
    # bfloat16 is 1 + 2^-7; summing in bfloat16 (ulp 2^-6 above 2) would round 2.0078 down to 2 and give 1.0.
    values = [1.0, 1.0078125, 1.0078125]
    out, _ = average_state_dicts([{"x": torch.tensor([v], dtype=torch.bfloat16)} for v in values])
    assert out["x"].dtype == torch.bfloat16 and out["x"].item() == 1.0078125


def test_the_cli_warns_about_integer_tensors_that_differ(run, tmp_path):
    """Through the files: two checkpoints of a model with an integer tensor that differs between them."""
    from training.checkpoints.averaging import average_checkpoints

    folders = []
    for name, value in (("checkpoint-1", 1), ("checkpoint-2", 2)):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(run / "checkpoint-4" / "config.json", folder / "config.json")
        (folder / COMPLETE_MARKER).write_text(json.dumps({"global_step": value}))
        save_file({"w": torch.full((3,), float(value)), "count": torch.tensor([value])}, folder / "model.safetensors")
        folders.append(folder)
    with pytest.warns(UserWarning, match=r"integer/bool tensors differ.*\['count'\]"):
        out = average_checkpoints(folders, progress=False)
    assert torch.equal(out["w"], torch.full((3,), 1.5)) and torch.equal(out["count"], torch.tensor([2]))


def test_the_newest_complete_checkpoints_are_chosen_and_incomplete_ones_skipped(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("tensorboard", "optimizer.pt"))
    half = copy / "checkpoint-16"  # killed while writing: no marker
    shutil.copytree(copy / "checkpoint-12", half)
    (half / COMPLETE_MARKER).unlink()
    out = tmp_path / "avg"
    average_main([str(copy), "--last", "2", "--output_dir", str(out), "--quiet"])
    assert json.loads((out / "averaging.json").read_text())["steps"] == [8, 12]
    with pytest.raises(
        SystemExit, match=r"--last 4: .* has only 3 complete checkpoint\(s\).*incomplete.*checkpoint-16"
    ):
        average_main([str(copy), "--last", "4", "--output_dir", str(tmp_path / "avg4")])
    assert not (tmp_path / "avg4").exists()


def _checkpoint_copy(run: Path, dest: Path, step: int) -> Path:
    shutil.copytree(run / "checkpoint-12", dest, ignore=shutil.ignore_patterns("optimizer.pt"))
    (dest / COMPLETE_MARKER).write_text(json.dumps({"global_step": step}))
    return dest


def test_bad_inputs_are_refused_before_any_work(run, tmp_path):
    out = tmp_path / "out"
    ckpt = str(run / "checkpoint-8")

    not_a_checkpoint = tmp_path / "empty"
    not_a_checkpoint.mkdir()
    with pytest.raises(SystemExit, match="empty is not a checkpoint: no model.safetensors"):
        average_main(["--checkpoints", ckpt, str(not_a_checkpoint), "--output_dir", str(out)])

    unmarked = _checkpoint_copy(run, tmp_path / "unmarked", 20)
    (unmarked / COMPLETE_MARKER).unlink()
    with pytest.raises(SystemExit, match="unmarked is not a complete checkpoint: no checkpoint_complete.json"):
        average_main(["--checkpoints", ckpt, str(unmarked), "--output_dir", str(out)])

    other_model = _checkpoint_copy(run, tmp_path / "other", 30)
    config = json.loads((other_model / "config.json").read_text())
    (other_model / "config.json").write_text(json.dumps({**config, "p_drop": 0.3}))
    with pytest.raises(
        SystemExit, match=r"checkpoints of different models: .*checkpoint-8 has p_drop=0\.1 but .*other"
    ):
        average_main(["--checkpoints", ckpt, str(other_model), "--output_dir", str(out)])

    reshaped = _checkpoint_copy(run, tmp_path / "reshaped", 40)
    tensors = weights(reshaped)
    tensors["model.encoder.layers.0.ffn.w_1.bias"] = torch.zeros(65)
    save_file(tensors, reshaped / "model.safetensors")
    with pytest.raises(SystemExit, match=r"'model.encoder.layers.0.ffn.w_1.bias' has shape \(64,\) in .*checkpoint-8 "
                                         r"but \(65,\) in .*reshaped"):  # fmt: skip
        average_main(["--checkpoints", ckpt, str(reshaped), "--output_dir", str(out)])

    renamed = _checkpoint_copy(run, tmp_path / "renamed", 50)
    tensors = weights(renamed)
    tensors["model.extra.weight"] = tensors.pop("model.decoder.layers.1.norm3.bias")
    save_file(tensors, renamed / "model.safetensors")
    with pytest.raises(
        SystemExit, match=r"different tensors: 'model.decoder.layers.1.norm3.bias' is in .*checkpoint-8"
    ):
        average_main(["--checkpoints", ckpt, str(renamed), "--output_dir", str(out)])

    with pytest.raises(SystemExit, match="listed twice"):
        average_main(["--checkpoints", ckpt, ckpt, "--output_dir", str(out)])
    with pytest.raises(SystemExit, match="only 3 complete checkpoint"):
        average_main([str(run), "--last", "5", "--output_dir", str(out)])
    with pytest.raises(SystemExit, match="is a checkpoint, not a run folder: pass it with --checkpoints"):
        average_main([ckpt, "--output_dir", str(out)])
    with pytest.raises(SystemExit, match="no such folder"):
        average_main([str(tmp_path / "nowhere"), "--output_dir", str(out)])
    with pytest.raises(SystemExit, match="is or contains the input"):
        average_main([str(run), "--last", "1", "--output_dir", str(run), "--overwrite"])
    assert not out.exists()


def test_an_existing_output_folder_is_replaced_only_with_overwrite(run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="exists and is not empty: pass --overwrite"):
        average_main([str(run), "--last", "1", "--output_dir", str(out)])
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    average_main([str(run), "--last", "1", "--output_dir", str(out), "--overwrite", "--quiet"])
    assert not (out / "notes.txt").exists()
    assert json.loads((out / "averaging.json").read_text())["steps"] == [12]


def test_checkpoints_of_different_tokenizers_are_refused(run, tmp_path):
    """Before: averaged without a word although most token ids meant different tokens in the two checkpoints."""
    from training.data.corpus import default_corpus
    from training.data.tokenizer import train_tokenizer

    other = _checkpoint_copy(run, tmp_path / "other-tokenizer", 60)
    corpus = default_corpus(seed=9, train_size=300, validation_size=0, test_size=0)
    texts = [text for row in corpus["train"]["translation"] for text in reversed(list(row.values()))]
    train_tokenizer(texts[::-1], vocab_size=300, show_progress=False).save_pretrained(other)
    with pytest.raises(SystemExit, match=r"different tokenizers: [\d,]+ of [\d,]+ token ids stand for different tokens "
                                         r"in .*checkpoint-8 and .*other-tokenizer"):  # fmt: skip
        average_main(["--checkpoints", str(run / "checkpoint-8"), str(other), "--output_dir", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_a_checkpoint_with_damaged_weights_is_refused(run, tmp_path):
    copy = tmp_path / "checkpoint-12"
    shutil.copytree(run / "checkpoint-12", copy)  # its marker records the size and hash of every file
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(SystemExit, match=r"checkpoint-12 is damaged: model.safetensors is corrupted"):
        average_main(["--checkpoints", str(run / "checkpoint-8"), str(copy), "--output_dir", str(tmp_path / "o")])
    (copy / "optimizer.pt").unlink()  # averaging needs the weights only: a checkpoint without its optimizer is fine
    shutil.copy2(run / "checkpoint-12" / "model.safetensors", copy / "model.safetensors")
    average_main(
        ["--checkpoints", str(run / "checkpoint-8"), str(copy), "--output_dir", str(tmp_path / "o"), "--quiet"]
    )
    assert json.loads((tmp_path / "o" / "averaging.json").read_text())["steps"] == [8, 12]
