"""What every benchmark shares: timing, the environment record, and the results files.

Each script prints one JSON line per measurement and a markdown table, and writes both under
`benchmarks/results/` as `<name>-<hardware>-<date>.{jsonl,md}` (never over an existing file: a numbered suffix
is added instead), each record carrying the date, the hardware and the library versions.
"""

import datetime
import json
import os
import platform
import re
import statistics
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


def hardware_tag(env: dict) -> str:
    """A short file-name tag: the GPU name on GPU, else "cpu<threads>"."""
    if env["device"] == "cuda":
        return re.sub(r"[^a-z0-9]+", "-", env["gpu"].lower()).strip("-")
    return f"cpu{env['cpu_threads']}"


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


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1, with the bad value named."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"expected a positive integer, got {value}")
    return value


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
