"""training/export.py on a trained tiny model: every backend that installs here exports, reloads from its folder and
decodes the tokens `model.generate` decodes.

- logits: each exported program (encoder, prefill, decode) against eager, fp32, a padded batch, teacher-forced past
  the traced cache length: max |Δlogit| ≤ 1e-4 (logits of order 10; float32 sums in another order);
- decoding: greedy and beam-4 `generate()` driven by the exported programs (`ExportedForGeneration`), |source| + 50,
  a padded batch, the cache growing past the traced length: the same token ids as `model.generate`;
- static cache (`--cache_implementation static --max_cache_len N`, N the batch's |source| + 50): the same logits
  and tokens (greedy, beam 4, against `model.generate` with the same static cache and with the dynamic one), a
  fixed-length cache input, and a clear error before any decoder step for a call that could outgrow it;
- the saved folder loads with transformers alone (a process that cannot import this package) and decodes greedily
  to the same tokens (ONNX, OpenVINO);
- CTranslate2: the converted directory decodes our tokens, greedy and beam 4; int8 converts and decodes;
- the command: a progress line per component, a summary of files and sizes, clear errors.

ONNX Runtime, torch.export (dynamo), OpenVINO and CTranslate2 run wherever their package is installed (CI installs
the `onnx` extra; OpenVINO's wheel is not on CI's package index); ExecuTorch (minutes to export), and OpenVINO with
a static cache, run with VASWANI_TEST_SLOW_EXPORTS=1.
"""

import contextlib
import importlib.util
import io
import json
import logging
import os
from pathlib import Path

import pytest
import torch

from training.export import main as export_main
from training.inference.translation import load_model
from training.serving.ctranslate2_conversion import ctranslate2_options
from training.serving.formats import ExportError, check_format
from training.serving.programs import ExportedForGeneration
from training.train import main as train_main

from isolated import run_isolated
from tiny_runs import TINY_TRAIN_ARGS, write_inputs

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_pt2_loading")  # one_thread: tests/conftest.py

SLOW = os.environ.get("VASWANI_TEST_SLOW_EXPORTS") == "1"
NEEDS = {"onnx": ("onnxscript", "onnxruntime"), "dynamo": (), "executorch": ("executorch",), "openvino": ("openvino",)}
ATOL = 1e-4  # fp32 logits of order 10, summed in another order by the backend


def backend(fmt: str, slow: bool = False):
    missing = [m for m in NEEDS[fmt] if importlib.util.find_spec(m) is None]
    marks = [pytest.mark.skipif(bool(missing), reason=f"{missing} not installed (pip install -e '.[export]')")]
    if slow:
        marks.append(pytest.mark.skipif(not SLOW, reason="slow export: set VASWANI_TEST_SLOW_EXPORTS=1"))
    return pytest.param(fmt, marks=marks, id=fmt)


FORMATS = [backend("onnx"), backend("dynamo"), backend("executorch", slow=True), backend("openvino")]

SENTENCES = [
    "I bought forty-five books on Monday.",
    "on March 5, 2021",
    "three hundred forty-two apples",
    "at 5:45 pm",
]


@pytest.fixture(scope="module")
def quiet_pt2_loading():
    """A saved torch.export program is a pickle: torch loads it with weights_only=False after the safe load fails
    (ExportedModel.from_pretrained asks for trust_remote_code first), and logs that with a malformed message
    (torch 2.13: two %s, no arguments) on which pytest's log capture raises. The message is silenced here."""
    logger = logging.getLogger("torch._export.serde.serialize")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, one_thread) -> Path:
    """A model trained 300 steps by training/train.py (d_model 32): poor translations, but varied ones."""
    root = tmp_path_factory.mktemp("export")
    train = write_inputs(root, train_size=600)["train"]
    train_main([
        "--model_config", str(root / "model.json"), "--train_file", str(train), *TINY_TRAIN_ARGS,
        "--warmup_steps", "20", "--max_steps", "300", "--save_steps", "1000", "--logging_steps", "100",
        "--output_dir", str(root / "run"),
    ])  # fmt: skip
    return root / "run"


@pytest.fixture(scope="module")
def model_and_tokenizer(folder):
    return load_model(str(folder), "cpu")


@pytest.fixture(scope="module")
def batch(model_and_tokenizer) -> dict[str, torch.Tensor]:
    """The sentences padded to one batch: rows of 13, 7, 9 and 7 tokens."""
    return model_and_tokenizer[1](SENTENCES, return_tensors="pt", padding=True)


@pytest.fixture(scope="module")
def exports(folder, tmp_path_factory):
    """One export folder per format, written once by the command (`python -m training.export`, in-process); its
    stderr is kept as `progress[(fmt, quantization)]`."""
    root, done = tmp_path_factory.mktemp("exports"), {}

    def get(fmt: str, quantization: str | None = None, max_cache_len: int | None = None) -> Path:
        key = (fmt, quantization) if max_cache_len is None else (fmt, quantization, max_cache_len)
        if key not in done:
            done[key] = root / "-".join(
                [fmt, quantization or "fp32", *([f"static{max_cache_len}"] * bool(max_cache_len))]
            )
            args = [str(folder), "--format", fmt, "--output_dir", str(done[key])]
            args += ["--quantization", quantization] if quantization else []
            args += ["--cache_implementation", "static", "--max_cache_len", str(max_cache_len)] if max_cache_len else []
            stderr, stdout = io.StringIO(), io.StringIO()
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
                export_main(args)
            get.progress[key] = stderr.getvalue()
        return done[key]

    get.progress = {}
    return get


def eager_steps(model, batch, targets: torch.Tensor) -> list[torch.Tensor]:
    """Logits of each teacher-forced decoder step, one token at a time through the cache, eager."""
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(**batch)
        cache, logits = None, []
        for t in range(targets.shape[1]):
            out = model(
                encoder_outputs=encoder_outputs,
                attention_mask=batch["attention_mask"],
                decoder_input_ids=targets[:, t : t + 1] if t else targets[:, :1],
                cache=cache,
                use_cache=True,
            )
            cache = out.cache
            logits.append(out.logits[:, -1])
    return logits


def targets_for(model, batch, steps: int = 12) -> torch.Tensor:
    """Random decoder inputs starting with <s>: 12 steps, past the 2 positions the cache held when traced."""
    g = torch.Generator().manual_seed(0)
    targets = torch.randint(4, model.config.vocab_size, (batch["input_ids"].shape[0], steps), generator=g)
    targets[:, 0] = model.config.decoder_start_token_id
    return targets


def exported_steps(exported: ExportedForGeneration, batch, targets: torch.Tensor) -> list[torch.Tensor]:
    """As `eager_steps`, through the exported encoder, prefill (first step) and decode (the others) programs, on a
    cache of the kind they were traced on (dynamic, or static self-attention)."""
    encoder_outputs = exported.get_encoder()(**batch)
    cache = exported.new_cache()
    logits = []
    for t in range(targets.shape[1]):
        out = exported(
            decoder_input_ids=targets[:, t : t + 1],
            attention_mask=batch["attention_mask"],
            encoder_outputs=encoder_outputs,
            cache=cache,
        )
        cache = out.cache
        logits.append(out.logits[:, -1])
    assert cache.get_seq_length() == targets.shape[1]
    exported_steps.cache = cache
    return logits


@pytest.mark.parametrize("fmt", FORMATS)
def test_exported_programs_give_eager_logits(fmt, exports, model_and_tokenizer, batch):
    """Encoder, prefill and decode programs fed step by step for 12 steps: the encoder states and the logits of
    every step within ATOL of eager's, padded rows included."""
    model, _ = model_and_tokenizer
    exported = ExportedForGeneration.from_export(exports(fmt))
    targets = targets_for(model, batch)
    model.set_cpu_kernel("aten")
    with torch.no_grad():
        eager_encoder = model.get_encoder()(**batch).last_hidden_state
    torch.testing.assert_close(exported.get_encoder()(**batch).last_hidden_state, eager_encoder, atol=ATOL, rtol=0)
    for t, (got, want) in enumerate(
        zip(exported_steps(exported, batch, targets), eager_steps(model, batch, targets), strict=True)
    ):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0, msg=f"step {t}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_greedy_generate_through_exported_programs_gives_model_tokens(fmt, exports, model_and_tokenizer, batch):
    """Greedy `generate()` on the exported programs, |source| + 50 per sentence, padded batch: the same ids."""
    model, _ = model_and_tokenizer
    exported = ExportedForGeneration.from_export(exports(fmt))
    with torch.no_grad():
        want = model.set_cpu_kernel("aten").generate(**batch, num_beams=1)
        got = exported.generate(**batch, num_beams=1)
    assert want.shape[1] > 4  # the cache grew past the traced sample's
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize("fmt", FORMATS)
def test_beam_search_through_exported_programs_gives_model_tokens(fmt, exports, model_and_tokenizer, batch):
    """Beam 4 with the paper's decoding (GNMT α = 0.6, |source| + 50, sentences leaving the batch as they finish)
    on the same programs that ran greedy search: 4 decoder rows per encoder row (traced on 2), a padded batch, the
    cache growing past the traced length: the same ids as `model.generate`."""
    model, _ = model_and_tokenizer
    assert model.generation_config.num_beams == 4 and model.generation_config.length_penalty_rule == "gnmt"
    exported = ExportedForGeneration.from_export(exports(fmt))
    with torch.no_grad():
        want = model.set_cpu_kernel("aten").generate(**batch)
        got = exported.generate(**batch)
    assert want.shape[1] > 4
    assert got.tolist() == want.tolist()


# ---- static cache (--cache_implementation static --max_cache_len N) ----

STATIC_FORMATS = [backend("onnx"), backend("dynamo"), backend("openvino", slow=True), backend("executorch", slow=True)]


@pytest.fixture(scope="module")
def max_cache_len(batch) -> int:
    """The batch's longest source + 50: the most cache positions generate() may fill under the paper's rule
    (max_length 1 + |source| + 50; the last token is never fed back), so the static cache is exactly full."""
    return int(batch["attention_mask"].sum(-1).max()) + 50


@pytest.mark.parametrize("fmt", STATIC_FORMATS)
def test_static_cache_programs_give_eager_logits(fmt, exports, model_and_tokenizer, batch, max_cache_len):
    """The decoder programs on a static self-attention cache of N positions (transformers' StaticCache, written in
    place at each step): 12 teacher-forced steps, padded batch, logits within ATOL of eager's; the cache they
    filled is still N long, and the ONNX decode program takes exactly N positions (a fixed axis, not a dynamic one)
    for any number of rows (a dynamic batch axis)."""
    from transformers.cache_utils import StaticCache

    model, _ = model_and_tokenizer
    exported = ExportedForGeneration.from_export(exports(fmt, max_cache_len=max_cache_len))
    assert exported.static_cache_len == max_cache_len
    targets = targets_for(model, batch)
    model.set_cpu_kernel("aten")
    for t, (got, want) in enumerate(
        zip(exported_steps(exported, batch, targets), eager_steps(model, batch, targets), strict=True)
    ):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0, msg=f"step {t}")
    self_cache = exported_steps.cache.self_attention_cache
    assert isinstance(self_cache, StaticCache)
    d_k = model.config.d_model // model.config.h
    assert self_cache.layers[0].keys.shape == (4, model.config.h, max_cache_len, d_k)
    if fmt == "onnx":
        session = exported.exported.runners["decode"].session
        shapes = [i.shape for i in session.get_inputs() if "self_attention_cache" in i.name and len(i.shape) == 4]
        assert len(shapes) == 2 * model.config.decoder_layers, shapes  # keys and values per layer
        # ONNX Runtime names each axis: a number for a fixed one, a symbol (s11) for a dynamic one
        assert all(str(shape[2]) == str(max_cache_len) and not str(shape[0]).isdigit() for shape in shapes), shapes


@pytest.mark.parametrize("fmt", STATIC_FORMATS)
def test_static_cache_generate_gives_model_tokens(fmt, exports, model_and_tokenizer, batch, max_cache_len):
    """Greedy and beam 4 (the paper's decoding) through the static-cache programs, padded batch, |source| + 50 (as
    many positions as the cache has): the same ids as `model.generate` with the same static cache settings, and as
    `model.generate` with its dynamic cache. The export's generation config selects the static cache itself."""
    model, _ = model_and_tokenizer
    exported = ExportedForGeneration.from_export(exports(fmt, max_cache_len=max_cache_len))
    assert exported.generation_config.cache_implementation == "static"
    model.set_cpu_kernel("aten")
    static = {"cache_implementation": "static", "max_cache_len": max_cache_len}
    for num_beams in (1, 4):
        with torch.no_grad():
            want = model.generate(**batch, num_beams=num_beams, **static)
            dynamic = model.generate(**batch, num_beams=num_beams)
            got = exported.generate(**batch, num_beams=num_beams)
        assert want.shape[1] > 4  # the cache filled past the traced sample's positions
        assert got.tolist() == want.tolist() == dynamic.tolist(), f"num_beams={num_beams}"


def test_static_cache_refuses_what_it_cannot_hold(exports, model_and_tokenizer, batch, max_cache_len):
    """Before any decoder step, a clear error naming the limit: a source whose |source| + 50 outgrows the N
    positions, an explicit max_new_tokens past them, another cache length or kind; and a dynamic export refuses a
    static cache."""
    pytest.importorskip("onnxruntime")
    model, tokenizer = model_and_tokenizer
    exported = ExportedForGeneration.from_export(exports("onnx", max_cache_len=max_cache_len))
    exported.forward = lambda *args, **kwargs: pytest.fail("a decoder step ran")
    limit = f"max_cache_len={max_cache_len}"
    long = tokenizer([" ".join(SENTENCES)], return_tensors="pt")
    assert long["input_ids"].shape[1] + 50 > max_cache_len  # |source| + 50 positions needed
    with pytest.raises(ValueError, match=rf"more than this export's static {limit}.*--max_cache_len \d+ or more"):
        exported.generate(**long, num_beams=1)
    with pytest.raises(ValueError, match=rf"fill {max_cache_len + 1} decoder cache positions.*{limit}"):
        exported.generate(**batch, num_beams=4, max_new_tokens=max_cache_len + 1)
    with pytest.raises(ValueError, match=f"take a static cache of {limit} only"):
        exported.generate(**batch, cache_implementation="static", max_cache_len=2 * max_cache_len)
    with pytest.raises(ValueError, match=f"take a static cache of {limit} only"):
        exported.generate(**batch, cache_implementation="dynamic")
    dynamic = ExportedForGeneration.from_export(exports("onnx"))
    dynamic.forward = exported.forward
    with pytest.raises(ValueError, match="take a dynamic cache; export with --cache_implementation static"):
        dynamic.generate(**batch, cache_implementation="static", max_cache_len=max_cache_len)


def test_onnx_int8_export_is_close(exports, model_and_tokenizer, batch):
    """onnxruntime dynamic int8 quantization (the exporters' quantizer): an approximation, so its teacher-forced
    logits are held to 10% of the largest |logit| of each step."""
    pytest.importorskip("onnxruntime")
    model, _ = model_and_tokenizer
    exported = ExportedForGeneration.from_export(exports("onnx", "int8"))
    targets = targets_for(model, batch)
    for t, (got, want) in enumerate(
        zip(exported_steps(exported, batch, targets), eager_steps(model, batch, targets), strict=True)
    ):
        assert (got - want).abs().max() <= 0.1 * want.abs().max(), f"step {t}"


CHILD = """
import json, sys
import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.exporters import ExportedModel

folder, payload, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
exported = ExportedModel.from_pretrained(folder, trust_remote_code=True)
config = exported.config
ids, mask = torch.tensor(payload["input_ids"]), torch.tensor(payload["attention_mask"])
memory = exported.runners["encoder"](input_ids=ids, attention_mask=mask)
cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
tokens = torch.full((ids.shape[0], 1), config.decoder_start_token_id)
for step in range(steps):
    logits, grown = exported.runners["decode" if step else "prefill"](
        decoder_input_ids=tokens[:, -1:], attention_mask=mask, encoder_hidden_states=memory, cache=cache
    )
    # prefill returns the whole cache; decode its self-attention part (the cross-attention part does not change)
    cache = grown if step == 0 else EncoderDecoderCache(grown, cache.cross_attention_cache)
    tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
print("RESULT " + json.dumps({"tokens": tokens.tolist(), "model_type": config.model_type,
                              "config_module": type(config).__module__}))
"""


@pytest.mark.parametrize("fmt", [backend("onnx"), backend("openvino")])
def test_export_loads_and_decodes_without_this_package(fmt, exports, model_and_tokenizer, batch, tmp_path):
    """ExportedModel.from_pretrained in a process that cannot import this package (config as remote code), then a
    plain greedy loop over its runners for 10 steps: each row, up to its first </s>, is model.generate's greedy row."""
    model, _ = model_and_tokenizer
    payload = json.dumps({k: v.tolist() for k, v in batch.items()})
    child = run_isolated(CHILD, [str(exports(fmt)), payload, "10"], tmp_path)
    assert child["model_type"] == "vaswani"
    assert child["config_module"].startswith("transformers_modules."), child["config_module"]
    with torch.no_grad():
        want = model.generate(**batch, num_beams=1, max_new_tokens=10)
    eos = model.config.eos_token_id

    def until_eos(row: list[int]) -> list[int]:
        return row[: row.index(eos) + 1] if eos in row else row

    assert [until_eos(row) for row in child["tokens"]] == [until_eos(row) for row in want.tolist()]


def test_dynamo_program_holds_no_eager_only_kernels(model_and_tokenizer):
    """The traced graphs use aten linear only: no oneDNN (mkldnn) or fbgemm int8 op, even when the model was set
    to them before exporting, and the model's kernels are restored afterwards."""
    from training.serving.programs import export_programs

    model, _ = model_and_tokenizer
    model.set_cpu_kernel("int8")
    exported = export_programs(model, "dynamo", log=lambda message: None)
    assert {m.cpu_kernel for m in model.modules() if hasattr(m, "cpu_kernel")} == {"int8"}
    model.set_cpu_kernel("onednn")
    for name, component in exported.components.items():
        targets = {str(n.target) for n in component.program.graph_module.graph.nodes if n.op == "call_function"}
        assert not [t for t in targets if "mkldnn" in t or "quantized" in t], name
        assert any("linear" in t or "addmm" in t or "mm" in t for t in targets), name


# ---- CTranslate2 ----


def ct2_sources(tokenizer, batch) -> tuple[list[list[str]], list[int]]:
    """The batch's rows as CTranslate2 takes them: token strings, padding removed; and their lengths."""
    lengths = batch["attention_mask"].sum(-1).tolist()
    rows = batch["input_ids"].tolist()
    return [tokenizer.convert_ids_to_tokens(row[:n]) for row, n in zip(rows, lengths, strict=True)], lengths


@pytest.mark.parametrize("num_beams", [1, 4])
def test_ctranslate2_directory_decodes_our_tokens(num_beams, exports, model_and_tokenizer, batch):
    """The converted directory with its tokenizer: CTranslate2's tokens equal model.generate's under the rules both
    have (transformers' |Y|^α length penalty, a per-batch length limit)."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    model, tokenizer = model_and_tokenizer
    directory = exports("ctranslate2")
    assert {"model.bin", "config.json", "shared_vocabulary.json", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in directory.iterdir()
    }
    translator = ctranslate2.Translator(str(directory), device="cpu", intra_threads=1)
    sources, lengths = ct2_sources(tokenizer, batch)
    config = model.generation_config
    options = ctranslate2_options(config, lengths) | {"beam_size": num_beams}
    results = translator.translate_batch(sources, **options)
    with torch.no_grad():
        want = model.generate(
            **batch,
            num_beams=num_beams,
            length_penalty_rule="transformers",
            early_stopping=True,
            max_new_tokens=options["max_decoding_length"],
        )
    special = set(tokenizer.all_special_ids)
    want_tokens = [[t for t in row if t not in special] for row in want.tolist()]
    got = [tokenizer.convert_tokens_to_ids(r.hypotheses[0]) for r in results]
    assert got == want_tokens


def test_ctranslate2_int8_directory(exports, model_and_tokenizer, batch):
    """--quantization int8: int8 weights in model.bin (under 0.6× the fp32 file) and a directory that decodes. Its
    closeness is a question for a trained model of real size (the benchmark's BLEU rows): at d_model 32 int8 moves
    the log-probabilities by a third."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    _, tokenizer = model_and_tokenizer
    float_dir, int8_dir = exports("ctranslate2"), exports("ctranslate2", "int8")
    assert (int8_dir / "model.bin").stat().st_size < 0.6 * (float_dir / "model.bin").stat().st_size
    sources, _ = ct2_sources(tokenizer, batch)
    int8 = ctranslate2.Translator(str(int8_dir), intra_threads=1, compute_type="int8")
    results = int8.translate_batch(sources, beam_size=1, max_decoding_length=10)
    vocabulary = tokenizer.get_vocab()
    assert len(results) == len(sources)
    assert all(token in vocabulary for r in results for token in r.hypotheses[0])


# ---- the command ----


def test_command_prints_progress_and_a_summary(folder, tmp_path, capsys):
    pytest.importorskip("ctranslate2")
    out_dir = tmp_path / "ct2"
    files = export_main([str(folder), "--format", "ctranslate2", "--output_dir", str(out_dir)])
    captured = capsys.readouterr()
    assert "converting encoder, decoder and output projection" in captured.err
    lines = captured.out.strip().splitlines()
    assert len(lines) == len(files) + 1
    assert lines[-1].strip().endswith(f"in all, {len(files)} files in {out_dir}")
    assert any(line.endswith("model.bin") for line in lines)


@pytest.mark.parametrize("fmt", FORMATS)
def test_command_names_each_component(fmt, exports):
    """One progress line per exported component, in order, and the files the loader needs."""
    directory = exports(fmt)
    progress = [line for line in exports.progress[(fmt, None)].splitlines() if line.startswith("exporting ")]
    assert progress == [f"exporting {name} ({fmt})" for name in ("encoder", "prefill", "decode")]
    names = {p.name for p in directory.iterdir()}
    assert {"export.json", "config.json", "generation_config.json", "tokenizer.json", "modeling_vaswani.py"} <= names
    assert json.loads((directory / "config.json").read_text())["auto_map"]["AutoConfig"].startswith("configuration_")


def test_command_refuses_a_non_empty_output_dir(folder, tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit, match="exists and is not empty"):
        export_main([str(folder), "--format", "ctranslate2", "--output_dir", str(tmp_path)])
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_missing_package_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    with pytest.raises(ExportError, match=r"needs openvino, not installed: pip install -e '\.\[export\]'"):
        check_format("openvino", None)


@pytest.mark.parametrize(
    ("fmt", "quantization", "message"),
    [
        ("tflite", None, "--format must be one of"),
        ("onnx", "float16", "--format onnx takes --quantization int8"),
        ("dynamo", "int8", "--format dynamo takes no --quantization"),
        ("ctranslate2", "int4", "--format ctranslate2 takes --quantization int8 | "),
    ],
)
def test_bad_settings_are_refused(fmt, quantization, message):
    with pytest.raises(ExportError, match=message):
        check_format(fmt, quantization)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cache_implementation", "static"], r"needs --max_cache_len N ≥ 5 \(got None\)"),
        (["--cache_implementation", "static", "--max_cache_len", "3"], r"needs --max_cache_len N ≥ 5 \(got 3\)"),
        (["--max_cache_len", "64"], "--max_cache_len sizes a static cache: add --cache_implementation static"),
        (["--format", "ctranslate2", "--cache_implementation", "static", "--max_cache_len", "64"], "not ctranslate2"),
    ],
)
def test_bad_cache_settings_are_refused_before_loading(args, message, tmp_path):
    """The command refuses a static cache without its length (or a length without a static cache), and a static
    cache for CTranslate2, before it reads the model (the folder does not exist)."""
    fmt = [] if "--format" in args else ["--format", "onnx"]
    with pytest.raises(SystemExit, match=message):
        export_main([str(tmp_path / "no-model"), *fmt, *args, "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
