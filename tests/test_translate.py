"""training/translate.py as a user runs it (a subprocess fed bytes on stdin): one output line per input line,
empty lines kept, long lines truncated with a warning or refused with --strict, invalid UTF-8 named by line number,
translations equal to `model.generate` line by line, nothing but translations on stdout."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training.common.files import split_lines
from training.inference.translation import load_model
from training.train import main as train_main
from training.translate import main as translate_main

from tiny_runs import write_inputs

REPO = Path(__file__).resolve().parent.parent
# one OpenMP thread: the model is tiny, and spinning worker threads slow a busy machine down a lot
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false",
       "OMP_NUM_THREADS": "1"}  # fmt: skip


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def folder(tmp_path_factory, one_thread) -> Path:
    """A model trained 300 steps by training/train.py (d_model 32): poor translations, but varied ones."""
    root = tmp_path_factory.mktemp("translate")
    train = write_inputs(root, train_size=600)["train"]
    train_main([
        "--model_config", str(root / "model.json"), "--train_file", str(train), "--vocab_size", "300",
        "--max_tokens_per_step", "600", "--warmup_steps", "20", "--max_steps", "300", "--save_steps", "1000",
        "--logging_steps", "100", "--output_dir", str(root / "run"),
    ])  # fmt: skip
    return root / "run"


def run_cli(folder: Path, stdin: bytes, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "training.translate", "--model", str(folder), *args]
    return subprocess.run(cmd, input=stdin, cwd=REPO, env=ENV, capture_output=True, timeout=300)


def generate_one(folder: Path, texts: list[str], **tokenize) -> list[str]:
    """Each text alone through model.generate (the model's own decoding), decoded."""
    model, tokenizer = load_model(str(folder), "cpu")
    with torch.no_grad():
        return [
            tokenizer.decode(
                model.generate(**tokenizer([t], return_tensors="pt", **tokenize))[0], skip_special_tokens=True
            )
            for t in texts
        ]


SENTENCES = [
    "I bought forty-five books on Monday.",
    "on March 5, 2021",
    "three hundred forty-two apples",
    "at 5:45 pm",
    "She arrived on Friday at seven o'clock.",
    "the number nineteen",
]
LONG = " ".join(["I bought forty-five books on Monday and three hundred apples on March 5, 2021."] * 3)


def test_one_line_out_per_line_in_equal_to_generate_and_nothing_else_on_stdout(folder):
    # line 3 is empty, line 5 whitespace only, line 6 too long (truncated), line 7 ends in CRLF, the last has no
    # newline at the end
    lines = [SENTENCES[0], SENTENCES[1], "", SENTENCES[2], "  \t ", LONG, SENTENCES[3] + "\r", SENTENCES[4],
             SENTENCES[5]]  # fmt: skip
    stdin = "\n".join(lines).encode("utf-8")
    done = run_cli(folder, stdin, "--max_source_tokens", "24")
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    stderr = done.stderr.decode()
    assert "warning: line 6 has" in stderr and "more than --max_source_tokens 24: translated after truncation" in stderr
    assert stderr.count("warning: line") == 1
    assert "Translating" in stderr  # the progress bar is there, on stderr

    expected = generate_one(folder, [s.strip() for s in SENTENCES])
    [long_expected] = generate_one(folder, [LONG], truncation=True, max_length=24)
    want = [expected[0], expected[1], "", expected[2], "", long_expected, expected[3], expected[4], expected[5]]
    assert all(want[i] for i in (0, 1, 3, 5, 6, 7, 8)), "an empty translation would not show the order is kept"
    # stdout is exactly the translations, one line each: no progress bar, no log line, no carriage return
    assert done.stdout == "".join(w + "\n" for w in want).encode("utf-8")


def test_strict_refuses_a_long_line_before_translating_anything(folder):
    done = run_cli(folder, f"{SENTENCES[0]}\n{LONG}\n\n{LONG}\n".encode(), "--max_source_tokens", "24", "--strict")
    assert done.returncode != 0 and done.stdout == b""
    stderr = done.stderr.decode()
    assert "--strict: 2 line(s) longer than --max_source_tokens 24: line 2 (" in stderr and "line 4 (" in stderr
    assert "nothing translated" in stderr and "Translating" not in stderr


def test_invalid_utf8_is_reported_with_its_line_numbers(folder):
    stdin = b"on Monday\n\xff\xfe broken\nat 5:45 pm\ncaf\xc3\n"
    done = run_cli(folder, stdin)
    assert done.returncode != 0 and done.stdout == b""
    stderr = done.stderr.decode()
    assert "not valid UTF-8 on line(s) 2, 4" in stderr and "nothing translated" in stderr
    assert "Loading weights" not in stderr  # refused before the model is even loaded


def test_files_in_and_out_and_no_overwrite_without_the_flag(folder, tmp_path):
    source, target = tmp_path / "in.en", tmp_path / "out.de"
    source.write_text("\n".join(SENTENCES[:3]) + "\n\n", encoding="utf-8")
    translate_main(["--model", str(folder), "-i", str(source), "-o", str(target), "--num_beams", "1", "--quiet"])
    expected = generate_one(folder, SENTENCES[:3])
    model, tokenizer = load_model(str(folder), "cpu")
    with torch.no_grad():
        greedy = [
            tokenizer.decode(model.generate(**tokenizer([s], return_tensors="pt"), num_beams=1)[0],
                             skip_special_tokens=True)
            for s in SENTENCES[:3]
        ]  # fmt: skip
    assert target.read_text(encoding="utf-8").split("\n") == [*greedy, "", ""]  # 4 lines, each ended by \n
    target.write_text("mine")
    with pytest.raises(SystemExit, match="out.de exists and is not empty: pass --overwrite"):
        translate_main(["--model", str(folder), "-i", str(source), "-o", str(target)])
    assert target.read_text() == "mine"
    translate_main(["--model", str(folder), "-i", str(source), "-o", str(target), "--overwrite", "--quiet"])
    assert target.read_text(encoding="utf-8").split("\n") == [*expected, "", ""]
    with pytest.raises(SystemExit, match="no such model folder"):
        translate_main(["--model", str(tmp_path / "nowhere"), "-i", str(source)])
    with pytest.raises(SystemExit, match="--input .*missing.en: no such file"):
        translate_main(["--model", str(folder), "-i", str(tmp_path / "missing.en")])


def test_line_splitting():
    assert split_lines(b"") == []
    assert split_lines(b"\n") == [b""]
    assert split_lines(b"a\n\nb") == [b"a", b"", b"b"]
    assert split_lines(b"a\r\nb\n") == [b"a", b"b"]


def test_cpu_kernel_option_reaches_the_model(folder, tmp_path):
    """--cpu_kernel int8: every linear layer quantized, translations equal to generate with the same kernel (one
    sentence a batch: int8 activations are quantized per call, so batch-mates would shift each other's scale)."""
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("".join(s + "\n" for s in SENTENCES[:3]))
    translate_main(["--model", str(folder), "-i", str(source), "-o", str(output), "--cpu_kernel", "int8",
                    "--batch_tokens", "1", "--quiet", "--device", "cpu"])  # fmt: skip
    model, tokenizer = load_model(str(folder), "cpu", "int8")
    kernels = {m.cpu_kernel for m in model.modules() if hasattr(m, "cpu_kernel")}
    assert kernels == {"int8"}
    with torch.no_grad():
        expected = [
            tokenizer.decode(model.generate(**tokenizer([s], return_tensors="pt"))[0], skip_special_tokens=True)
            for s in SENTENCES[:3]
        ]
    assert output.read_text().splitlines() == expected


def test_the_models_pipeline_and_the_commands_share_one_translation_path(folder):
    """The folder's VaswaniTranslationPipeline (remote code) and training.translate/evaluate decode through
    pipeline_vaswani.translate_batched: the same outputs for the same texts (a blank gives "" in both, not a
    decoding of nothing), equal to each text decoded alone, and the same default token budget."""
    from transformers import pipeline

    from modeling_vaswani import pipeline_vaswani
    from training.inference import translation

    assert translation.DEFAULT_MAX_TOKENS == pipeline_vaswani.DEFAULT_MAX_TOKENS
    texts = [*SENTENCES[:4], "", "   "]
    translator = pipeline("translation", model=str(folder), trust_remote_code=True, device="cpu")
    assert type(translator).__module__.endswith("pipeline_vaswani")
    piped = [out["translation_text"] for out in translator(texts)]
    model, tokenizer = load_model(str(folder), "cpu")
    ours = translation.translate_batched(model, tokenizer, texts, progress=False)
    assert piped == ours == [*generate_one(folder, SENTENCES[:4]), "", ""]
    # a budget that puts every sentence in a batch of its own changes nothing
    assert [out["translation_text"] for out in translator(texts, max_tokens=1)] == piped


def test_a_tokenizer_without_a_pad_token_is_refused_before_translating(folder):
    """translate_batched pads each batch with the tokenizer: without a pad token it says so, naming the model's pad
    id, before generating anything."""
    from modeling_vaswani import pipeline_vaswani

    model, tokenizer = load_model(str(folder), "cpu")
    tokenizer.pad_token = None
    calls = []
    model.generate = lambda *a, **k: calls.append(1)  # would record any decoding
    with pytest.raises(ValueError, match=r"has no pad token: batches cannot be padded.*pads with id 1"):
        pipeline_vaswani.translate_batched(model, tokenizer, ["a house", "a tree"])
    assert calls == []
