"""CPU smoke runs of benchmarks/train.py and benchmarks/scaling.py, in-process: the rows, the ratios, the results
files (never overwritten), the plot, and argument errors that name the problem."""

import itertools
import json
import math

import pytest
import torch

from benchmarks import scaling as scaling_bench
from benchmarks import train as train_bench

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def positive_finite(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def check_env(path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows
    for row in rows:
        for key in ("date", "torch", "transformers", "device"):
            assert row["env"][key], key
        assert row["env"]["torch"] == torch.__version__
        check_cpu_class(row["env"])


def check_cpu_class(env: dict) -> None:
    """Every row names its CPU class: model, ISA flags, cores, caps, and the kernels the libraries dispatched."""
    from benchmarks.common import ISA_FLAGS, cpu_flags

    assert env["cpu"] and env["cpu_cores"] >= 1
    assert env["cpu_isa_flags"] == [f for f in ISA_FLAGS if f in cpu_flags()]
    capped = env["isa_caps"].get("ATEN_CPU_CAPABILITY")  # --isa: the capped class, else this process's own
    assert env["aten_cpu_capability"] == (capped.upper() if capped else torch.backends.cpu.get_cpu_capability())
    assert env["fbgemm_isa"] in ("none", "AVX2", "AVX512", "AVX512_E1")
    assert isinstance(env["isa_caps"], dict)
    if torch.backends.mkldnn.is_available():
        assert env["onednn_isa"] and env["onednn_inner_product"]  # e.g. "Intel AVX2", "brg_matmul:avx2"


def test_train_smoke(tmp_path, one_thread):
    rows = train_bench.main(["--smoke", "--device", "cpu", "--out_dir", str(tmp_path)])

    expected = set(itertools.product(("fixed", "budget"), ("ours", "marian"), ("none",)))
    keys = [(r["case"], r["system"], r["compile"]) for r in rows]
    assert sorted(keys) == sorted(expected)  # one row each
    for row in rows:
        assert "error" not in row, row["error"]
        for key in ("tokens_per_s", "tokens_per_s_median_step", "padded_tokens_per_s", "step_time_median_s"):
            assert positive_finite(row[key]), (key, row)
        assert positive_finite(row["flops_per_token"])
        assert row["padded_tokens_per_s"] >= row["tokens_per_s"]
        assert 0 <= row["padding_fraction"] < 1
        assert math.isfinite(row["loss_first"]) and math.isfinite(row["loss_last"])
        assert row["peak_memory_gib"] is None and row["mfu"] is None  # CPU: no allocator statistics, no peak given
        assert row["attn_implementation"] == "sdpa" and row["precision"] == "fp32"
    by_key = {(r["case"], r["system"]): r for r in rows}
    for case in ("fixed", "budget"):
        ours, marian = by_key[case, "ours"], by_key[case, "marian"]
        for row in (ours, marian):
            assert row["tokens_per_s_ours_over_marian"] == pytest.approx(ours["tokens_per_s"] / marian["tokens_per_s"])
            assert "peak_memory_ours_over_marian" in row
        assert ours["flops_per_token"] == marian["flops_per_token"]  # the same network, the same batches
        assert ours["trainable_parameters"] == marian["trainable_parameters"]  # Marian's sinusoid tables are frozen
    fixed = by_key["fixed", "ours"]
    assert fixed["padding_fraction"] == 0 and fixed["timed_steps"] == 2
    assert fixed["tokens_per_s"] == pytest.approx(4 * (8 + 8) * 2 / sum(fixed["times_s"]))  # B · (T_src + T_tgt)
    assert by_key["fixed", "ours"]["batch_size"] == 4 and by_key["fixed", "ours"]["source_len"] == 8
    assert "data" in by_key["budget", "ours"] and by_key["budget", "ours"]["max_tokens"] == 128

    [jsonl], [md] = sorted(tmp_path.glob("train-*.jsonl")), sorted(tmp_path.glob("train-*.md"))
    check_env(jsonl)
    assert len(jsonl.read_text().splitlines()) == len(rows)
    text = md.read_text()
    assert "- torch: " in text and "- transformers: " in text and "| case | system | compile |" in text
    first = (jsonl.read_text(), text)

    # a second run (fixed case only, with a peak for MFU, 2 rounds) writes new files and leaves the first ones alone
    again = train_bench.main(
        ["--smoke", "--device", "cpu", "--cases", "fixed", "--peak_tflops", "1", "--rounds", "2",
         "--out_dir", str(tmp_path)]
    )  # fmt: skip
    assert len(sorted(tmp_path.glob("train-*.jsonl"))) == 2 and len(sorted(tmp_path.glob("train-*.md"))) == 2
    assert (jsonl.read_text(), md.read_text()) == first
    for row in again:
        assert row["mfu"] == pytest.approx(row["flops_per_token"] * row["tokens_per_s"] / 1e12)
        assert row["rounds"] == 2 and len(row["times_s"]) == 2 * 2  # two rounds of two timed steps, pooled
        assert row["tokens_per_s"] == pytest.approx(4 * (8 + 8) * 4 / sum(row["times_s"]))
        assert row["padded_tokens_per_s"] == pytest.approx(row["tokens_per_s"])  # no padding in the fixed case


def test_scaling_smoke(tmp_path, one_thread):
    rows = scaling_bench.main(["--smoke", "--device", "cpu", "--out_dir", str(tmp_path)])

    lengths, batches = scaling_bench.SMOKE["lengths"], scaling_bench.SMOKE["batch_sizes"]
    expected = [("length", s, T) for s in ("ours", "marian") for T in lengths]
    expected += [("batch", s, B) for s in ("ours", "marian") for B in batches]
    got = [(r["sweep"], r["system"], r["source_len"] if r["sweep"] == "length" else r["batch_size"]) for r in rows]
    assert sorted(got) == sorted(expected)
    for row in rows:
        assert "error" not in row, row["error"]
        for key in ("step_time_median_s", "tokens_per_s", "saved_activations_gib"):
            assert positive_finite(row[key]), (key, row)
        assert row["peak_memory_gib"] is None
    for sweep, system in itertools.product(("length", "batch"), ("ours", "marian")):
        saved = [r["saved_activations_gib"] for r in rows if r["sweep"] == sweep and r["system"] == system]
        assert saved == sorted(saved) and saved[0] < saved[-1]  # more tokens, more activations

    [jsonl] = sorted(tmp_path.glob("scaling-*.jsonl"))
    check_env(jsonl)
    [png] = sorted(tmp_path.glob("scaling-*.png"))
    assert png.stem == jsonl.stem
    data = png.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR" and len(data) > 1000

    scaling_bench.main(
        ["--smoke", "--device", "cpu", "--lengths", "4", "--batch_sizes", "1", "--out_dir", str(tmp_path)]
    )
    assert len(sorted(tmp_path.glob("scaling-*.png"))) == 2 and png.read_bytes() == data  # not overwritten


def test_saved_tensor_bytes_counts_each_storage_once_without_parameters():
    weight = torch.nn.Parameter(torch.randn(8, 8))
    x = torch.randn(100, 8, requires_grad=True)
    with scaling_bench.SavedTensorBytes({weight.untyped_storage().data_ptr()}) as saved:
        y = (x @ weight).exp()  # mm saves x (and the excluded weight); exp saves its output
        (y * y).sum()  # mul saves y twice: one storage
    assert saved.nbytes == x.nbytes + y.nbytes


@pytest.mark.parametrize(
    ("script", "argv", "message"),
    [
        (train_bench, ["--batch_size", "0"], "argument --batch_size: expected a positive integer, got 0"),
        (train_bench, ["--compile", "none,fast"], "unknown: fast"),
        (train_bench, ["--preset", "huge"], "--preset 'huge'"),
        (train_bench, ["--data", "/nonexistent/train"], "--data /nonexistent/train"),
        (scaling_bench, ["--lengths", "8,0"], "argument --lengths: expected a positive integer, got 0"),
        (scaling_bench, ["--warmup", "-1"], "--warmup must be ≥ 0"),
    ],
)
def test_bad_arguments_fail_clearly(script, argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--smoke", "--device", "cpu", *argv, "--out_dir", str(tmp_path)])
    assert message in f"{exit_info.value.code} {capsys.readouterr().err}"
    assert not list(tmp_path.iterdir())  # nothing written


def test_isa_option_restarts_the_script_with_the_caps(tmp_path):
    """--isa avx2 (on any CPU with AVX2): the script runs again with oneDNN, ATen, fbgemm, MKL and CTranslate2 capped,
    and its rows record the caps and what the libraries dispatched under them."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from benchmarks.common import ISA_CAPS, cpu_flags

    if "avx2" not in cpu_flags():
        pytest.skip("no AVX2 on this CPU")
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ISA_CAPS["avx2"]}
    command = [sys.executable, "-m", "benchmarks.train", "--smoke", "--device", "cpu", "--cases", "fixed"]
    done = subprocess.run([*command, "--isa", "avx2", "--out_dir", str(tmp_path)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for path in tmp_path.glob("*.jsonl") for line in path.read_text().splitlines()]
    assert rows
    for row in rows:
        record = row["env"]
        check_cpu_class(record)
        assert record["isa_caps"] == {k: v for k, v in ISA_CAPS["avx2"].items() if k != "flag"}
        assert record["aten_cpu_capability"] == "AVX2" and record["fbgemm_isa"] == "AVX2"
        assert "AVX2" in record["onednn_isa"] and record["onednn_inner_product"].endswith("avx2")


def test_isa_option_caps_ctranslate2_too(tmp_path):
    """--isa avx2 in the generate benchmark: CTranslate2 runs capped as well (CT2_FORCE_CPU_ISA for its kernels,
    MKL_ENABLE_INSTRUCTIONS for its products), as its own log says, so both sides of a ratio run the same class;
    the files name the native class and the emulated one."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from benchmarks.common import ISA_CAPS, cpu_flags

    pytest.importorskip("ctranslate2")
    if "avx2" not in cpu_flags():
        pytest.skip("no AVX2 on this CPU")
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ISA_CAPS["avx2"]}
    command = [sys.executable, "-m", "benchmarks.generate", "--smoke", "--device", "cpu", "--modes", "greedy",
               "--systems", "ours,ct2-float32", "--repeats", "1", "--warmup", "0", "--threads", "1"]  # fmt: skip
    done = subprocess.run([*command, "--isa", "avx2", "--out_dir", str(tmp_path)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    [jsonl] = tmp_path.glob("generate-cpu1-*-as-avx2-*.jsonl")
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert {row["system"] for row in rows} == {"ours", "ct2-float32"}
    for row in rows:
        record = row["env"]
        check_cpu_class(record)
        assert record["aten_cpu_capability"] == "AVX2" and record["onednn_inner_product"].endswith("avx2")
        assert record["ct2_isa"] == "AVX2", record
        assert record["isa_caps"]["CT2_FORCE_CPU_ISA"] == "AVX2"
        assert record["isa_caps"]["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"


def test_cpu_class_tag_names_native_and_emulated_classes():
    from benchmarks.common import ISA_CAPS, cpu_class_tag, hardware_tag

    amx = ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16"]
    caps = {k: v for k, v in ISA_CAPS["avx2"].items() if k != "flag"}
    assert cpu_class_tag({"cpu_isa_flags": amx, "isa_caps": {}}) == "amx"
    assert cpu_class_tag({"cpu_isa_flags": amx[:5], "isa_caps": {}}) == "avx512"
    assert cpu_class_tag({"cpu_isa_flags": ["avx2", "fma"], "isa_caps": {}}) == "avx2"
    assert cpu_class_tag({"cpu_isa_flags": [], "isa_caps": {}}) == "other"
    assert cpu_class_tag({"cpu_isa_flags": amx, "isa_caps": caps}) == "amx-as-avx2"
    env = {"device": "cpu", "cpu_threads": 2, "cpu_isa_flags": amx[:5], "isa_caps": {}}
    assert hardware_tag(env) == "cpu2-avx512"


def test_isa_option_refuses_what_it_cannot_do(monkeypatch):
    from benchmarks import common

    monkeypatch.setattr(common, "cpu_flags", lambda: {"avx2", "fma"})
    for name in common.ISA_CAPS["avx2"]:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit, match="--isa avx512: this CPU .* has no avx512f; a cap can only lower"):
        common.apply_isa("avx512", "benchmarks.train", None)
    with pytest.raises(SystemExit, match="--isa avx2: run as a command"):  # a Python call cannot restart its caller
        common.apply_isa("avx2", "benchmarks.train", ["--smoke"])
    common.apply_isa("native", "benchmarks.train", ["--smoke"])  # nothing to do
    for name, value in common.ISA_CAPS["avx2"].items():
        monkeypatch.setenv(name, value)
    common.apply_isa("avx2", "benchmarks.train", ["--smoke"])  # already in force: runs in this process


def test_fbgemm_isa_follows_flags_and_cap(monkeypatch):
    from benchmarks.common import _fbgemm_isa

    monkeypatch.delenv("FBGEMM_ENABLE_INSTRUCTIONS", raising=False)
    vnni = {"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"}
    assert (_fbgemm_isa(vnni), _fbgemm_isa({"avx2", "fma"}), _fbgemm_isa(set())) == ("AVX512_E1", "AVX2", "none")
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "AVX2")
    assert _fbgemm_isa(vnni) == "AVX2"
