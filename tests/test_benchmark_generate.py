"""benchmarks/generate.py in its CPU smoke form, and the twins it compares against.

The Marian twin must compute the same function as this model (else the speed comparison compares different work),
and CTranslate2 converted from it must decode the same tokens.
"""

import json

import pytest
import torch

from benchmarks.generate import main as generate_main
from benchmarks.twins import ctranslate2_translator, id_tokens, marian_twin, token_ids
from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration

pytestmark = pytest.mark.usefixtures("one_thread")


def small_model(seed: int = 0) -> VaswaniForConditionalGeneration:
    torch.manual_seed(seed)
    config = VaswaniConfig(vocab_size=60, d_model=32, d_ff=64, h=4, encoder_layers=2, decoder_layers=2)
    return VaswaniForConditionalGeneration(config).eval()


def test_marian_twin_computes_the_same_logits():
    model = small_model()
    for module in model.modules():  # non-trivial LayerNorms and biases: a swapped norm would show
        if isinstance(module, torch.nn.LayerNorm | torch.nn.Linear) and module.bias is not None:
            torch.nn.init.normal_(module.bias, std=0.5)
        if isinstance(module, torch.nn.LayerNorm):
            torch.nn.init.normal_(module.weight, mean=1.0, std=0.5)
    twin = marian_twin(model).eval()
    ids = torch.randint(4, 60, (3, 7))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    decoder = torch.randint(4, 60, (3, 5))
    with torch.no_grad():
        ours = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder).logits
        theirs = twin(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_ctranslate2_decodes_what_the_model_decodes():
    pytest.importorskip("ctranslate2")
    model = small_model(seed=1)
    ids = torch.randint(4, 60, (4, 6), generator=torch.Generator().manual_seed(3))
    if torch.backends.mkldnn.is_available():  # decode under oneDNN first: its packed weights must not stop the copy
        model.set_cpu_kernel("onednn")
        for module in model.modules():
            if hasattr(module, "onednn_min_macs"):
                module.onednn_min_macs = 0
        model.generate(ids, num_beams=1, max_new_tokens=2)
        assert any(m.__dict__.get("_packed") is not None for m in model.modules())
    translator = ctranslate2_translator(marian_twin(model), "float32", threads=1)
    model.set_cpu_kernel("aten")
    ours = model.generate(ids, num_beams=1, max_new_tokens=6, min_new_tokens=6)[:, 1:]  # drop <s>
    results = translator.translate_batch([id_tokens(r.tolist()) for r in ids], beam_size=1, max_decoding_length=6,
                                         min_decoding_length=6)  # fmt: skip
    assert [token_ids(r.hypotheses[0]) for r in results] == ours.tolist()


def test_smoke_run_writes_rows_tables_and_ratios(tmp_path):
    rows = generate_main(["--smoke", "--device", "cpu", "--repeats", "1", "--warmup", "0", "--out_dir", str(tmp_path)])
    systems = ["ours", "ours-int8", "ours-aten", "marian"]
    try:
        import ctranslate2  # noqa: F401

        systems += ["ct2-float32", "ct2-int8"]
    except ImportError:
        pass
    assert sorted((r["mode"], r["system"]) for r in rows) == sorted(
        (m, s) for m in ("beam4", "greedy") for s in systems
    )
    for row in rows:
        assert row["new_tokens_per_s"] > 0 and row["median_s"] > 0
        marian = next(r for r in rows if r["mode"] == row["mode"] and r["system"] == "marian")
        assert row["vs_marian"] == pytest.approx(row["new_tokens_per_s"] / marian["new_tokens_per_s"])
    [jsonl] = tmp_path.glob("generate-cpu*.jsonl")
    [md] = tmp_path.glob("generate-cpu*.md")
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(records) == len(rows) and {"date", "torch", "transformers", "cpu"} <= records[0]["env"].keys()
    assert "| beam4 | ours |" in md.read_text()
    generate_main(["--smoke", "--device", "cpu", "--repeats", "1", "--warmup", "0", "--modes", "greedy",
                   "--systems", "ours", "--out_dir", str(tmp_path)])  # fmt: skip
    assert len(list(tmp_path.glob("generate-cpu*.jsonl"))) == 2  # the first results are kept


def real_data_argv(tmp_path, paper_decoding: bool = False) -> list[str]:
    """A random tiny model folder (its generation config transformers' greedy default, or the paper's beam 4) and a
    12-line Moses-style test set: the real-data mode's arguments."""
    from training.data.corpus import default_corpus
    from training.data.tokenizer import train_tokenizer

    pairs = default_corpus(seed=1, train_size=200, validation_size=0, test_size=12)
    tokenizer = train_tokenizer(
        [t for r in pairs["train"]["translation"] for t in r.values()], vocab_size=120, show_progress=False
    )
    model = VaswaniForConditionalGeneration(
        VaswaniConfig(vocab_size=len(tokenizer), d_model=32, d_ff=64, h=4, encoder_layers=2, decoder_layers=2)
    )
    if paper_decoding:
        model.use_paper_decoding()
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    for lang in ("en", "de"):
        (tmp_path / f"test.{lang}").write_text("".join(r[lang] + "\n" for r in pairs["test"]["translation"]))
    return ["--device", "cpu", "--model", str(folder), "--test_file", str(tmp_path / "test"), "--repeats", "1"]


def test_real_data_smoke_run_decodes_every_sentence_with_every_system(tmp_path):
    """The real-data mode on a random tiny model folder and a 12-line Moses-style test set: one row per system with
    wall time, tokens/s, decoder calls and rows, BLEU; ours computes fewer rows than Marian's loop."""
    argv = real_data_argv(tmp_path)
    rows = generate_main([*argv, "--batch_tokens", "60", "--out_dir", str(tmp_path)])
    systems = {r["system"]: r for r in rows}
    expected = {"ours", "ours-int8", "marian"} | ({"ct2-float32", "ct2-int8"} if "ct2-int8" in systems else set())
    assert set(systems) == expected
    for row in rows:
        assert row["sentences"] == 12 and row["wall_s"] > 0 and row["batches"] > 1 and "bleu" in row
    assert 0 < systems["ours"]["rows_per_sentence"] < systems["marian"]["rows_per_sentence"]
    [jsonl] = tmp_path.glob("generate-real-cpu*.jsonl")
    assert len(jsonl.read_text().splitlines()) == len(rows)


def test_real_data_onnx_runtime_decodes_what_ours_decodes(tmp_path):
    """`--systems ours,onnx-float32` with the paper's beam 4: the ONNX Runtime programs inside our generate() give
    our translations (the same BLEU and chrF on the same sentences, the same number of new tokens)."""
    pytest.importorskip("onnxruntime")
    argv = [*real_data_argv(tmp_path, paper_decoding=True), "--systems", "ours,onnx-float32"]
    rows = {r["system"]: r for r in generate_main([*argv, "--batch_tokens", "60", "--out_dir", str(tmp_path)])}
    assert set(rows) == {"ours", "onnx-float32"}
    for key in ("new_tokens", "bleu", "chrf", "sentences", "batches"):
        assert rows["onnx-float32"][key] == rows["ours"][key], key


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--modes", "beam5"], "--modes takes beam4 and/or greedy"),
        (["--systems", "ours,fairseq"], "--systems on cpu takes"),
        (["--skip_speed"], "--skip_speed leaves nothing to do"),
        (["--bleu_model", "runs/none"], "--bleu_model and --bleu_test_file go together"),
        (["--model", "runs/none"], "--model and --test_file go together"),
        (["--model", "runs/none", "--test_file", "x"], "not a model folder"),
    ],
)
def test_bad_arguments_are_named(tmp_path, argv, message):
    with pytest.raises(SystemExit, match=message):
        generate_main(["--smoke", "--device", "cpu", "--out_dir", str(tmp_path), *argv])
