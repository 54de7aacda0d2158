"""What every benchmark shares: timing, the environment record, and the results files.

Each script prints one JSON line per measurement and a markdown table, and writes both under
`benchmarks/results/` as `<name>-<hardware>-<date>.{jsonl,md}` (never over an existing file: a numbered suffix
is added instead), each record carrying the date, the hardware and the library versions.
"""

import argparse
import contextlib
import datetime
import functools
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def environment(device: torch.device) -> dict:
    """Date, hardware and library versions, recorded with every result."""
    import transformers

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": device.type,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu": _cpu_name(),
        "cpu_threads": torch.get_num_threads(),
        **cpu_class(),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    try:
        import ctranslate2

        env["ctranslate2"] = ctranslate2.__version__
    except ImportError:
        pass
    return env


# --isa: the environment variables that cap each library's instruction set before torch (or CTranslate2) loads;
# a value makes an AVX-512 machine behave as the named class. Each entry also names the /proc/cpuinfo flag it needs.
ISA_CAPS = {
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2", "CT2_FORCE_CPU_ISA": "AVX2", "flag": "avx2"},
    "avx512": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "ATEN_CPU_CAPABILITY": "avx512",
               "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512", "MKL_ENABLE_INSTRUCTIONS": "AVX512",
               "CT2_FORCE_CPU_ISA": "AVX512", "flag": "avx512f"},
    "avx512_vnni": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI", "ATEN_CPU_CAPABILITY": "avx512",
                    "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512_E1", "MKL_ENABLE_INSTRUCTIONS": "AVX512_E1",
                    "CT2_FORCE_CPU_ISA": "AVX512", "flag": "avx512_vnni"},
}  # fmt: skip
ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "FBGEMM_ENABLE_INSTRUCTIONS", "MKL_ENABLE_INSTRUCTIONS",
                 "CT2_FORCE_CPU_ISA")  # fmt: skip
OPENMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_NUM_THREADS")  # how idle threads wait
# the /proc/cpuinfo flags that decide which kernels oneDNN, fbgemm, MKL and CTranslate2 can pick
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
             "amx_tile", "amx_int8", "amx_bf16")  # fmt: skip


def isa_choices() -> list[str]:
    return ["native", *ISA_CAPS]


def apply_isa(isa: str | None, module: str, argv: list[str] | None) -> None:
    """`--isa`: run this benchmark with every library capped at `isa` ("avx2", "avx512", "avx512_vnni"), by starting
    the script again (`python -m module argv`) with the variables of ISA_CAPS set, since each library reads them when
    it loads. Nothing to do for "native" or None, or when the variables already hold (the restarted process). A CPU
    without the class's instructions is refused: a cap can only lower the instruction set. A call from Python (argv
    given) cannot restart its caller's process and is refused unless the variables are already set."""
    if isa in (None, "native"):
        return
    if isa not in ISA_CAPS:
        raise SystemExit(f"--isa takes {', '.join(isa_choices())}, got {isa!r}")
    caps = {k: v for k, v in ISA_CAPS[isa].items() if k != "flag"}
    flag = ISA_CAPS[isa]["flag"]
    if flag not in cpu_flags():
        raise SystemExit(
            f"--isa {isa}: this CPU ({_cpu_name()}) has no {flag}; a cap can only lower the instruction set"
        )
    if all(os.environ.get(k) == v for k, v in caps.items()):
        return
    if argv is not None:
        raise SystemExit(
            f"--isa {isa}: run as a command (python -m {module} ...); the caps must be set before torch loads"
        )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], {**os.environ, **caps})


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_class() -> dict:
    """What decides CPU speed here: the CPU's ISA flags, its cores, the caps in force (`--isa`), and the kernels the
    libraries actually dispatch: ATen's capability, oneDNN's ISA and its inner-product implementation for a
    fp32 linear layer (sampled with its verbose log), MKL's code path (its verbose header) and fbgemm's ISA."""
    flags = cpu_flags()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    record = {
        "cpu_isa_flags": [f for f in ISA_FLAGS if f in flags],
        "cpu_cores": cores,
        "isa_caps": {k: os.environ[k] for k in ISA_VARIABLES if k in os.environ},
        "openmp_settings": {k: os.environ[k] for k in OPENMP_VARIABLES if k in os.environ},
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "fbgemm_isa": _fbgemm_isa(flags),
    }
    if torch.backends.mkldnn.is_available():
        record.update(_onednn_dispatch())
    if torch.backends.mkl.is_available():
        record["mkl_isa"] = _mkl_isa()
    return record


def _fbgemm_isa(flags: set[str]) -> str:
    """fbgemm's kernel family: the best the CPU has (AVX512_E1 = with VNNI), lowered by FBGEMM_ENABLE_INSTRUCTIONS."""
    order = ["none", "AVX2", "AVX512", "AVX512_E1"]
    native = (
        "AVX512_E1" if {"avx512f", "avx512bw", "avx512_vnni"} <= flags
        else "AVX512" if {"avx512f", "avx512bw"} <= flags
        else "AVX2" if {"avx2", "fma"} <= flags
        else "none"
    )  # fmt: skip
    cap = os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS", "").upper().replace("_256", "")
    return min(native, cap, key=order.index) if cap in order else native


@contextlib.contextmanager
def _stdout_of_c_code(lines: list[str], fd: int = 1):
    """Collect what C code prints on file descriptor `fd` (1: oneDNN's and MKL's verbose logs; 2: CTranslate2's
    log) into `lines`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            try:
                import ctypes

                ctypes.CDLL(None).fflush(None)
            except (OSError, AttributeError):
                pass
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode(errors="replace").splitlines())


@functools.cache
def _onednn_dispatch() -> dict:
    """oneDNN's ISA and the implementation it runs for a (64 × 512) · (512 × 512) fp32 inner product, the shape
    class of this model's projections, through the model's own packed-weight op. Sampled once per process: oneDNN
    prints its ISA line only the first time its log is on (else the implementation's suffix names it)."""
    lines: list[str] = []
    x, w = torch.randn(64, 512), torch.randn(512, 512)
    with _stdout_of_c_code(lines), torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        packed = torch.ops.mkldnn._reorder_linear_weight(w)
        torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    isa = next((line.split("isa:", 1)[1].strip() for line in lines if "isa:" in line), None)
    impl = None
    for line in lines:
        fields = line.split(",")
        if "exec" in fields and "inner_product" in fields:
            impl = fields[fields.index("inner_product") + 1]
    if isa is None and impl and ":" in impl:
        isa = impl.rsplit(":", 1)[1]
    return {"onednn_isa": isa, "onednn_inner_product": impl}


def ctranslate2_dispatch(make: Callable[[], object]) -> tuple[object, dict]:
    """`make()` (it loads a CTranslate2 model) with CTranslate2's log at "info", and what that log says CTranslate2
    dispatches on this CPU: {"ct2_isa": "AVX2", "ct2_sgemm": "MKL (packed: true)", "ct2_gemm_s8": ...}. Its own
    kernels follow `ct2_isa` (CT2_FORCE_CPU_ISA caps it); its products run MKL, capped by MKL_ENABLE_INSTRUCTIONS.
    CTranslate2 prints these lines at its first model load in a process: later calls give {}."""
    import logging

    try:
        import ctranslate2
    except ImportError:  # `make` says so (benchmarks.twins.ctranslate2_translator returns None)
        return make(), {}
    lines: list[str] = []
    level = ctranslate2.get_log_level()
    ctranslate2.set_log_level(logging.INFO)
    try:
        with _stdout_of_c_code(lines, fd=2):
            made = make()
    finally:
        ctranslate2.set_log_level(level)
    names = {"Selected ISA": "ct2_isa", "SGEMM backend": "ct2_sgemm", "GEMM_S8 backend": "ct2_gemm_s8"}
    record = {}
    for line in lines:
        for label, key in names.items():
            if f"- {label}:" in line:
                record.setdefault(key, line.split(f"- {label}:", 1)[1].strip())
    return made, record


def _mkl_isa() -> str | None:
    """MKL's code path as its verbose header names it: "... Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2)
    enabled processors" on Intel CPUs, "... Intel(R) Architecture processors" (its generic path) on others."""
    lines: list[str] = []
    a = torch.randn(64, 64)
    with _stdout_of_c_code(lines), torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON):
        torch.mm(a, a)
    header = next((line for line in lines if line.startswith("MKL_VERBOSE") and " for " in line), None)
    return header.split(" for ", 1)[1].split(", Lnx")[0] if header else None


def hardware_tag(env: dict) -> str:
    """A short file-name tag: the GPU name on GPU, else "cpu<threads>-<class>" ("cpu2-amx", "cpu2-amx-as-avx2")."""
    if env["device"] == "cuda":
        return re.sub(r"[^a-z0-9]+", "-", env["gpu"].lower()).strip("-")
    return f"cpu{env['cpu_threads']}-{cpu_class_tag(env)}"


def cpu_class_tag(env: dict) -> str:
    """The CPU class of a result for its file name, from the env record: "amx", "avx512", "avx2" (or "other")
    natively; with `--isa` caps, "<native>-as-<cap>" ("amx-as-avx2"), so an emulated class never reads as native."""
    flags = set(env.get("cpu_isa_flags") or [])
    native = ("amx" if "amx_int8" in flags else "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags
              else "other")  # fmt: skip
    caps = env.get("isa_caps") or {}
    cap = next((name for name, values in ISA_CAPS.items()
                if all(caps.get(k) == v for k, v in values.items() if k != "flag")), None)  # fmt: skip
    return f"{native}-as-{cap}" if cap else native


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def pick_device(name: str) -> torch.device:
    """ "auto" → CUDA when there is one, else CPU; an unavailable CUDA is an error, not a silent CPU run."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for, but torch sees no CUDA device")
    return device


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_it(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> dict:
    """Seconds per call of `fn`: `warmup` untimed calls, then `repeats` timed ones; median, min and all."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "min_s": min(times), "times_s": [round(t, 6) for t in times]}


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float | None:
    """Peak allocated accelerator memory since the last reset; None on CPU (no allocator statistics there)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return None


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    """`rows` as a markdown table over `columns` (missing cells empty, floats to 4 significant digits)."""

    def cell(value) -> str:
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def free_path(folder: Path, stem: str, suffix: str) -> Path:
    """`folder/stem+suffix`, or `stem-2`, `stem-3` ... if taken: results are never overwritten."""
    path, n = folder / f"{stem}{suffix}", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}{suffix}"
    return path


def emit(record: dict) -> dict:
    """Print one result as a JSON line (flushed, so a long run shows progress)."""
    print(json.dumps(record), flush=True)
    return record


def save_results(name: str, env: dict, rows: list[dict], table: str, out_dir: str | Path | None) -> tuple[Path, Path]:
    """Write `rows` (JSON lines, each with `env`) and `table` (markdown, with an environment header)."""
    folder = Path(out_dir) if out_dir is not None else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{name}-{hardware_tag(env)}-{env['date'][:10]}"
    jsonl, md = free_path(folder, stem, ".jsonl"), free_path(folder, stem, ".md")
    jsonl.write_text("".join(json.dumps({**row, "env": env}) + "\n" for row in rows))
    header = f"# {name}\n\n" + "\n".join(f"- {k}: {v}" for k, v in env.items()) + "\n\n"
    md.write_text(header + table + "\n")
    return jsonl, md


def add_model_arguments(parser, vocab_help: str) -> None:
    """--device and --preset, shared by the speed benchmarks (train, scaling), and --vocab_size with its meaning."""
    parser.add_argument("--device", default="auto", help='"auto" (CUDA when there is one), "cuda", "cuda:1" or "cpu"')
    parser.add_argument(
        "--preset", help="configuration/<preset>.json: base, big, small, tiny, or a JSON path (default base)"
    )
    parser.add_argument("--vocab_size", type=positive, help=vocab_help)


def add_run_arguments(parser, *, seed_help: str, smoke_help: str, results: str = ".jsonl and .md") -> None:
    """--threads, --seed, --smoke, --out_dir and --isa, shared by the speed benchmarks (train, scaling)."""
    parser.add_argument(
        "--threads", type=positive, help="CPU threads for torch (default: torch's choice; 1 with --smoke)"
    )
    parser.add_argument("--seed", type=int, default=0, help=seed_help)
    parser.add_argument("--smoke", action="store_true", help=smoke_help)
    parser.add_argument("--out_dir", help=f"folder for the {results} results (default benchmarks/results)")
    parser.add_argument(
        "--isa",
        choices=isa_choices(),
        help="cap oneDNN, ATen, fbgemm, MKL and CTranslate2 at this instruction set (ONEDNN_MAX_CPU_ISA, "
        "ATEN_CPU_CAPABILITY ...; the script restarts with them set) to measure that CPU class here; default native",
    )


# ---- argument types (argparse shows an ArgumentTypeError's message as it is) ----


def _positive(text: str, cast: Callable[[str], float], what: str):
    try:
        value = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive {what}, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive {what}, got {value}")
    return value


def positive(text: str) -> int:
    """argparse type: an integer ≥ 1, with the bad value named."""
    return _positive(text, int, "integer")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0, with the bad value named."""
    return _positive(text, float, "number")


def positive_list(text: str) -> list[int]:
    """argparse type: comma-separated integers ≥ 1, e.g. "8,16,32" (repeats dropped)."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return list(dict.fromkeys(positive(x) for x in items))


def choice_list(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    """argparse type: a comma-separated subset of `choices`, in the order given."""

    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        unknown = [x for x in items if x not in choices]
        if not items or unknown:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {', '.join(choices)}; got {text!r}"
                + (f" (unknown: {', '.join(unknown)})" if unknown else "")
            )
        return list(dict.fromkeys(items))

    return parse


def benchmark_parser(module: str, doc: str | None):
    """The parser of `python -m benchmarks.<module>`: its docstring (runnable commands) as the description."""
    return argparse.ArgumentParser(
        prog=f"python -m benchmarks.{module}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def report(name: str, env: dict, rows: list[dict], columns: list[str], out_dir, shown: list[dict] | None = None):
    """Print `shown` (default `rows`) as a markdown table over `columns`, save `rows` and the table with
    `save_results`, and say where (on stderr: stdout keeps the table and the JSON lines)."""
    table = markdown_table(rows if shown is None else shown, columns)
    print(table)
    jsonl, md = save_results(name, env, rows, table, out_dir)
    print(f"results: {jsonl} and {md}", file=sys.stderr)
    return jsonl, md


def pyplot():
    """matplotlib's pyplot, drawing to files only (no screen needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 100) -> Path:
    """Lay out `fig`, write it to `path` as PNG and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def set_threads(threads: int | None) -> None:
    """Pin torch's CPU threads (and OpenMP's) so every system in a run uses the same number."""
    if threads:
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def fill_defaults(args, device: torch.device, defaults: dict[str, dict], smoke: dict):
    """Unset flags (None) from the device's defaults, then --smoke's; --warmup and --seed must be ≥ 0."""
    chosen = {**defaults["cuda" if device.type == "cuda" else "cpu"], **(smoke if args.smoke else {})}
    for key, value in chosen.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.warmup < 0:
        raise SystemExit(f"--warmup must be ≥ 0, got {args.warmup}")
    if args.seed < 0:
        raise SystemExit(f"--seed must be ≥ 0, got {args.seed}")
    return args
