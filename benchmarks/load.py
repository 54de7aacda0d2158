"""Speed under load: a training step and a beam search, on an idle CPU and beside one competing process, under the
thread and OpenMP wait settings that decide how torch behaves on a shared machine.

    # seconds: one setting, idle and beside a busy Python process, 2 timed calls each
    python -m benchmarks.load --smoke
    # the CPU run: 2 workloads × 4 settings × 4 loads, ~10 minutes on 2 cores; run it alone (each cell starts its own
    # processes), one workload at a time if you must share the machine
    python -m benchmarks.load
    # a subset
    python -m benchmarks.load --workloads train --settings torch-default,commands --loads idle,torch

Why. torch's CPU build parallelises with OpenMP (libgomp). A thread that finishes its share of a parallel region
spins (GOMP_SPINCOUNT iterations, 300,000 by default) waiting for the others before it sleeps. On an idle machine
that saves the wake-up latency; when another process holds a core, the spinning thread burns the very core its
partner needs, and every region waits for the descheduled thread.

Each cell (workload, setting, load) runs in fresh processes, so the environment reaches libgomp before it loads:
- the competitor (none for "idle"): "python", a pure-Python busy loop (an interpreter, a tokenizer, a data loader
  next door); "torch", a 2-thread torch process doing 512×512 fp32 matmuls with torch's default settings (another
  user's job); "same", a second copy of the measured workload under the same setting (two of our commands side by
  side, as CI and users run them);
- the measured worker: `--worker train|beam` with the setting's environment, which warms up, then times calls
  for --seconds and reports the mean and median time per call.
The workloads: "train", a training step (forward, backward, AdamW) of the tiny preset on 25 × 60 source + 25 × 60
target tokens (3,000 tokens; the kernels training.train uses); "beam", `generate()` of the small preset, beam 4,
batch 8, 24 new tokens at fixed length (the paper's decoding loop, one call).
The settings: "torch-default" (nothing set), "passive" (OMP_WAIT_POLICY=PASSIVE: sleep at once), "spin-<N>"
(GOMP_SPINCOUNT=N), "1-thread" (OMP_NUM_THREADS=1) and "commands": what `python -m training.<command>` applies
before torch loads (training/threads.py), measured through the same function.

Columns: ms per call (mean over the timed calls, which counts the stalls a competitor causes), the slowdown
against the same workload under "torch-default" on the idle machine, and the competitor's own progress where it
reports one. Results: benchmarks/results/load-<hw>-<date>.{jsonl,md}.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "torch-default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin-1k": {"GOMP_SPINCOUNT": "1000"},
    "spin-10k": {"GOMP_SPINCOUNT": "10000"},
    "spin-100k": {"GOMP_SPINCOUNT": "100000"},
    "1-thread": {"OMP_NUM_THREADS": "1"},
    "commands": None,  # training.threads.command_defaults(), filled in at run time
}
LOADS = ("idle", "python", "torch", "same")
WORKLOADS = ("train", "beam")
COMPETITORS = {
    "python": "while True:\n    pass\n",
    "torch": (
        "import torch\nx = torch.randn(512, 512)\nwhile True:\n    for _ in range(50):\n        x = torch.tanh(x @ x)\n"
    ),
}


def setting_env(name: str) -> dict[str, str]:
    """The environment variables a setting adds (on top of a clean inherited environment)."""
    if name == "commands":
        from training.threads import command_defaults

        return command_defaults(os.cpu_count() or 1)
    if name not in SETTINGS:
        raise SystemExit(f"unknown setting {name!r}; known: {', '.join(SETTINGS)}")
    return dict(SETTINGS[name])


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without any thread/wait variable, plus `extra`."""
    drop = {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "KMP_BLOCKTIME"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["VASWANI_NO_THREAD_DEFAULTS"] = "1"  # the worker imports training/: it must not apply the defaults itself
    env.update(extra)
    return env


# --------------------------------------------------------------------------------------------- the worker process
def worker(workload: str, seconds: float, warmup: int) -> dict:
    """Time `workload` calls for `seconds` (at least 3) after `warmup` calls; runs in its own process."""
    import torch

    from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration

    torch.manual_seed(0)
    preset = "tiny" if workload == "train" else "small"
    config = VaswaniConfig.from_json_file(str(ROOT / "configuration" / f"{preset}.json"))
    model = VaswaniForConditionalGeneration(config)
    generator = torch.Generator().manual_seed(0)
    if workload == "train":
        model.train()
        batch, length = 25, 60
        src = torch.randint(4, config.vocab_size, (batch, length), generator=generator)
        labels = torch.randint(4, config.vocab_size, (batch, length), generator=generator)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)

        def call():
            optimizer.zero_grad(set_to_none=True)
            model(input_ids=src, labels=labels).loss.backward()
            optimizer.step()

    else:
        model.eval()
        src = torch.randint(4, config.vocab_size, (8, 20), generator=generator)

        def call():
            with torch.inference_mode():
                model.generate(
                    input_ids=src,
                    num_beams=4,
                    max_new_tokens=24,
                    min_new_tokens=24,
                    do_sample=False,
                    length_penalty=1.0,
                )

    for _ in range(warmup):
        call()
    times, start = [], time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return {
        "calls": len(times),
        "mean_ms": 1000 * statistics.fmean(times),
        "median_ms": 1000 * statistics.median(times),
        "threads": torch.get_num_threads(),
    }


# --------------------------------------------------------------------------------------------- one cell
def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_cell(workload: str, setting: str, load: str, seconds: float, warmup: int) -> dict:
    """One measurement in fresh processes. `foreign_cpu_s` is CPU time spent during the cell by processes other than
    the worker and the competitor (Linux only): a run meant to be alone should show ~0."""
    busy0, ours0 = busy_cpu_seconds(), children_cpu_seconds()
    env = clean_env(setting_env(setting))
    competitor = None
    if load in COMPETITORS:
        competitor = subprocess.Popen([sys.executable, "-c", COMPETITORS[load]], env=clean_env({}))
    elif load == "same":  # the same worker, run longer than the measured one so it competes throughout
        cmd = [sys.executable, "-m", "benchmarks.load", "--worker", workload, "--seconds", str(seconds * 3 + 30)]
        competitor = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        if competitor is not None:
            time.sleep(1.0)  # let it start spinning
        cmd = [sys.executable, "-m", "benchmarks.load", "--worker", workload]
        cmd += ["--seconds", str(seconds), "--warmup", str(warmup)]
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    foreign = (busy_cpu_seconds() - busy0) - (children_cpu_seconds() - ours0)
    if done.returncode != 0:
        return {"workload": workload, "setting": setting, "load": load, "error": done.stderr.strip()[-500:]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    env_added = " ".join(f"{k}={v}" for k, v in setting_env(setting).items()) or "(none)"
    row = {"workload": workload, "setting": setting, "env_added": env_added, "load": load, **result}
    return row | {"foreign_cpu_s": round(foreign, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {WORKLOADS}")
    parser.add_argument(
        "--settings", default="torch-default,passive,commands,1-thread", help=f"comma-separated, of {tuple(SETTINGS)}"
    )
    parser.add_argument("--loads", default=",".join(LOADS), help=f"comma-separated, of {LOADS}")
    parser.add_argument("--seconds", type=float, default=8.0, help="timed seconds per cell (default 8)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first (default 2)")
    parser.add_argument("--smoke", action="store_true", help="seconds: train only, torch-default, idle + python")
    parser.add_argument("--out_dir", default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.seconds, args.warmup)), flush=True)
        return 0
    if args.smoke:  # an explicit --settings is kept
        explicit = any(a.startswith("--settings") for a in (argv if argv is not None else sys.argv[1:]))
        args.workloads, args.loads, args.seconds, args.warmup = "train", "idle,python", 0.5, 1
        args.settings = args.settings if explicit else "torch-default"
    picks = {}
    for flag, known in (("workloads", WORKLOADS), ("settings", tuple(SETTINGS)), ("loads", LOADS)):
        picks[flag] = [p for p in getattr(args, flag).split(",") if p]
        unknown = [p for p in picks[flag] if p not in known]
        if unknown or not picks[flag]:
            parser.error(f"--{flag}: unknown {unknown or 'empty'}; known: {', '.join(known)}")

    import torch

    from benchmarks.common import emit, environment, report

    env = environment(torch.device("cpu"))
    env["os_cpu_count"] = os.cpu_count()
    rows = []
    for workload in picks["workloads"]:
        for setting in picks["settings"]:
            for load in picks["loads"]:
                rows.append(emit(run_cell(workload, setting, load, args.seconds, args.warmup)))
    for row in rows:  # slowdown against torch's defaults on the idle machine, same workload
        base = next(
            (
                r
                for r in rows
                if r["workload"] == row["workload"] and r["setting"] == "torch-default" and r["load"] == "idle"
            ),
            None,
        )
        if base and "mean_ms" in row and "mean_ms" in base:
            row["slowdown_vs_idle_default"] = row["mean_ms"] / base["mean_ms"]
    columns = ["workload", "setting", "env_added", "load", "threads", "calls", "mean_ms", "median_ms", "foreign_cpu_s"]
    report("load", env, rows, columns + ["slowdown_vs_idle_default", "error"], args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
