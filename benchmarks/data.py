"""The data path at WMT scale: preparing N sentence pairs (BPE, tokenization, filtering, the sampler's length table),
in time, memory and restart time, on a synthetic corpus made of real sentences.

The corpus: N pairs drawn at random (with replacement, seed 0) from Multi30k's training set
(`../shared/data/multi30k/train.{en,de}.gz`; the generated default corpus where that is missing), written as
Moses-style `train.en`/`train.de` into a temporary folder at run time (never kept, never committed), so sentence
lengths and the vocabulary are real ones. Each size N is measured in four steps, each in its own process, each as
`training.train` runs it (`training.data.parallel.load_parallel`, `training.data.tokenizer.shared_bpe`,
`training.data.parallel.tokenize_pairs`, `training.trainer.batching.TokenBudgetBatchSampler`), with the datasets cache in the temporary folder:

1. **cold**: preparation from the files with empty caches. Reported: seconds per phase (`load_s`: files to Arrow,
   `bpe_s`, `tokenize_s`: tokenization and filtering, `table_s`: length columns to the sampler's batches),
   `prepare_s` (their sum), `pairs_per_s` (N / prepare_s), `tokenize_pairs_per_s` (N / tokenize_s), and the
   memory of the process and its tokenizing workers, sampled every 50 ms: `peak_pss_gib` (the tree's proportional
   set size: each page shared between the forked workers and their parent counted once, the memory the machine
   really gives the job) and `peak_pss_anon_gib` (the same for anonymous memory: what the program holds, without the
   pages of the memory-mapped Arrow files, which the kernel can drop at any time), `peak_rss_gib`/`peak_anon_gib`
   (the processes' RSS summed: shared pages counted once per process, an upper bound), and
   `maxrss_self_gib`/`maxrss_child_gib` (getrusage's high-water marks of the main process and its largest worker);
2. **cached**: the same preparation again: every phase comes from the cache;
3. **restart**: `python -m training.train` on the same files and cache (a new run folder, the tiny model of
   configuration/tiny.json): seconds from the start of its main() (before torch and transformers are imported) to
   the end of its first optimizer step (`restart_first_step_s`, run_summary.json's `seconds_to_first_step`), and its
   training tokens/s over `--train_steps` steps (`map_tokens_per_s`);
4. **streaming**: the same run with `--streaming`, chunks of the command's size unless `--stream_chunk_pairs` says
   otherwise. Both runs take the same `--train_steps` steps, and each is measured two ways, from run_summary.json:
   the whole training time (`*_tokens_per_s`: Trainer's train_runtime) and the steady throughput after the first
   optimizer step (`*_steady_tokens_per_s`: the real tokens of steps 2..N over the time from the end of step 1 to
   the end of step N). The first step is reported apart (`*_first_step_train_s`, from train()'s start): it waits for
   the data loader's first batch, which under --streaming is the tokenization of the whole first chunk (100,000
   pairs), done once at the start as the map-style path prepares before it. Later chunks are prepared by a
   background worker while training runs, so their cost is inside the steady window. `stream_over_map` compares
   the steady rates; `stream_over_map_whole` the whole-run rates.

`--corpus_dir DIR` keeps each size's corpus in `DIR/<N>/` and reuses it in later runs (the caches stay per run, so
"cold" stays cold), and `--cold_only` measures only step 1: together, repeated cold preparations of a large N, e.g.
an A/B of a switch the preparation reads from the environment (`VASWANI_RELEASE_PAGES=0`: the tokenization's page
release off, recorded in each row as `release_pages`).

Isolation: with `--lock FILE`, each measured step (one process) holds `flock FILE` from its start to its end, and
every row records `other_cpu_s`: the CPU seconds the machine spent on anything else meanwhile (/proc/stat's busy
time less this process tree's), so a timing taken beside another job shows it.

    python -m benchmarks.data --smoke                                       # about 40 s: CI
    python -m benchmarks.data --sizes 100000,1000000 --lock /tmp/cpu.lock   # each measured step holds the lock
    python -m benchmarks.data --plot benchmarks/results/data-cpu2-2026-11-30.jsonl   # PNG; 4.5M projected if unmeasured
    python -m benchmarks.data --plot A.jsonl B.jsonl     # the sizes of both files in one PNG (next to B.jsonl)
    VASWANI_RELEASE_PAGES=0 python -m benchmarks.data --sizes 4500000 --cold_only --corpus_dir /data/bench  # A/B

Rows go to `benchmarks/results/data-<hardware>-<date>.{jsonl,md}` like the other benchmarks.
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# the shared data folder sits next to the main checkout (../shared), or inside a worktree's checkout (shared/)
MULTI30K = next(
    (
        p / "shared" / "data" / "multi30k"
        for p in (REPO, *REPO.parents)
        if (p / "shared" / "data" / "multi30k").is_dir()
    ),
    REPO.parent / "shared" / "data" / "multi30k",
)
COLUMNS = [
    "pairs",
    "step",
    "release_pages",
    "prepare_s",
    "load_s",
    "bpe_s",
    "tokenize_s",
    "table_s",
    "pairs_per_s",
    "tokenize_pairs_per_s",
    "peak_pss_gib",
    "peak_pss_anon_gib",
    "peak_rss_gib",
    "other_cpu_s",
    "restart_first_step_s",
    "map_steady_tokens_per_s",
    "stream_steady_tokens_per_s",
    "stream_over_map",
    "map_first_step_train_s",
    "stream_first_step_train_s",
    "stream_over_map_whole",
]


def environment() -> dict:
    """benchmarks.common's record (date, CPU model, ISA flags, cores, the kernels torch dispatches, versions), with
    the data libraries' versions and the machine's memory."""
    import datasets
    import tokenizers
    import torch

    from benchmarks.common import environment as common_environment
    from training.data.parallel import available_cores

    return {
        **common_environment(torch.device("cpu")),
        "datasets": datasets.__version__,
        "tokenizers": tokenizers.__version__,
        "available_cores": available_cores(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


# --- the corpus --------------------------------------------------------------------------------------------------


def seed_pairs() -> tuple[list[str], list[str], str]:
    """Real sentence pairs to draw from: Multi30k's training set, else the generated default corpus."""
    if (MULTI30K / "train.en.gz").is_file() and (MULTI30K / "train.de.gz").is_file():
        with gzip.open(MULTI30K / "train.en.gz", "rt", encoding="utf-8") as f:
            en = f.read().splitlines()
        with gzip.open(MULTI30K / "train.de.gz", "rt", encoding="utf-8") as f:
            de = f.read().splitlines()
        return en, de, "multi30k train (29,000 pairs)"
    from training.data.corpus import default_corpus

    rows = default_corpus(0, 5000, 0, 0)["train"]["translation"]
    return [r["en"] for r in rows], [r["de"] for r in rows], "generated default corpus (5,000 pairs)"


def reuse_or_write_corpus(folder: Path, pairs: int, seed: int = 0) -> tuple[str, bool]:
    """`write_corpus` into `folder` unless a finished one of the same size and seed is there (`corpus.json`, written
    last); returns the seed text's description and whether the corpus was reused."""
    stamp = folder / "corpus.json"
    if stamp.is_file():
        kept = json.loads(stamp.read_text())
        if kept.get("pairs") == pairs and kept.get("seed") == seed:
            return kept["seed_text"], True
    stamp.unlink(missing_ok=True)
    source = write_corpus(folder, pairs, seed)
    stamp.write_text(json.dumps({"pairs": pairs, "seed": seed, "seed_text": source}))
    return source, False


def write_corpus(folder: Path, pairs: int, seed: int = 0) -> str:
    """`folder/train.en` and `folder/train.de`: `pairs` pairs drawn at random from the seed pairs."""
    import numpy as np

    en, de, source = seed_pairs()
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    with (
        open(folder / "train.en", "w", encoding="utf-8") as f_en,
        open(folder / "train.de", "w", encoding="utf-8") as f_de,
    ):
        for start in range(0, pairs, 100_000):
            picks = rng.integers(0, len(en), size=min(100_000, pairs - start))
            f_en.write("".join(en[i] + "\n" for i in picks))
            f_de.write("".join(de[i] + "\n" for i in picks))
    return source


# --- measuring a process tree ------------------------------------------------------------------------------------


def _tree_memory(pid: int, cpu: dict[int, float]) -> dict[str, int]:
    """Memory in bytes of `pid` and all its descendants, from /proc: `rss` and `anon` (VmRSS and RssAnon summed:
    pages a forked worker shares with its parent count once per process) and `pss` and `pss_anon` (smaps_rollup's
    proportional set sizes summed: each shared page split between its sharers, so the tree's real footprint).
    Each process's CPU seconds so far go into `cpu` (by pid)."""
    import psutil

    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    total = dict.fromkeys(("rss", "anon", "pss", "pss_anon"), 0)
    names = {"VmRSS": "rss", "RssAnon": "anon", "Pss": "pss", "Pss_Anon": "pss_anon"}
    tick = os.sysconf("SC_CLK_TCK")
    for proc in procs:
        try:
            found = {}
            for name in ("status", "smaps_rollup"):
                for line in Path(f"/proc/{proc.pid}/{name}").read_text().splitlines():
                    key = line.split(":", 1)[0]
                    if key in names:
                        found[names[key]] = int(line.split()[1]) * 1024  # kB
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu[proc.pid] = max(cpu.get(proc.pid, 0.0), (int(fields[11]) + int(fields[12])) / tick)
        except (OSError, IndexError, ValueError):
            continue  # the process ended meanwhile: none of its numbers are added
        for key, value in found.items():
            total[key] += value
    return total


def _machine_busy_s() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat: every state but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def run_measured(cmd: list[str], env: dict, timeout: float) -> tuple[subprocess.CompletedProcess, dict]:
    """Run `cmd`, sampling its process tree's memory every 50 ms; the peaks in GiB, the wall time, and
    `other_cpu_s`: the CPU seconds the machine spent on anything else meanwhile (the isolation check: near 0 when
    the command ran alone)."""
    peaks = dict.fromkeys(("rss", "anon", "pss", "pss_anon"), 0)
    busy, own, children, tree_cpu = (
        _machine_busy_s(),
        _cpu_s(resource.RUSAGE_SELF),
        _cpu_s(resource.RUSAGE_CHILDREN),
        {},
    )
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = threading.Event()

    def sample():
        while not done.is_set():
            for key, value in _tree_memory(proc.pid, tree_cpu).items():
                peaks[key] = max(peaks[key], value)
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"{' '.join(cmd[:4])} ... ran over --timeout {timeout:g} s") from None
    finally:
        done.set()
        sampler.join()
    wall = time.perf_counter() - started
    # the command's tree: its waited-for processes' exact total, or the sum sampled from /proc if larger (workers
    # that exited without being waited for)
    tree = max(_cpu_s(resource.RUSAGE_CHILDREN) - children, sum(tree_cpu.values()))
    other = (_machine_busy_s() - busy) - (_cpu_s(resource.RUSAGE_SELF) - own) - tree
    result = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{stderr[-3000:]}")
    memory = {f"peak_{key}_gib": value / 2**30 for key, value in peaks.items()}
    return result, {**memory, "wall_s": wall, "other_cpu_s": round(max(other, 0.0), 2)}


@contextmanager
def held(lock: str | None):
    """Hold `lock` (flock, exclusive) for one measured step; nothing without one."""
    if lock is None:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- the preparation, in its own process -------------------------------------------------------------------------


def prepare(folder: Path, vocab_size: int, max_length: int, max_tokens: int, corpus: Path | None = None) -> dict:
    """What training.train does before training, timed per phase, on `corpus/train.{en,de}` (default `folder`'s);
    run in a child process (`--_prepare`)."""
    import datasets

    datasets.disable_progress_bars()
    from transformers import AutoTokenizer

    from training.data.memory import release_pages_enabled
    from training.data.parallel import load_parallel, tokenize_pairs
    from training.data.tokenizer import BPE_MAX_PAIRS, shared_bpe
    from training.trainer.batching import TokenBudgetBatchSampler

    times = {}
    start = time.perf_counter()
    raw = load_parallel(train_file=(corpus or folder) / "train", source_lang="en", target_lang="de")
    times["load_s"] = time.perf_counter() - start
    start = time.perf_counter()
    bpe, info = shared_bpe(raw["train"], "en", "de", vocab_size, max_pairs=BPE_MAX_PAIRS, show_progress=False)
    tokenizer_dir = folder / f"tokenizer-{os.getpid()}"
    bpe.save_pretrained(tokenizer_dir)  # as training.train: saved, then loaded as the run loads it
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    times["bpe_s"] = time.perf_counter() - start
    start = time.perf_counter()
    data = tokenize_pairs(raw, tokenizer, "en", "de", max_length)
    times["tokenize_s"] = time.perf_counter() - start
    start = time.perf_counter()
    lengths = data["train"].select_columns(["src_len", "tgt_len"]).with_format("numpy")[:]
    sampler = TokenBudgetBatchSampler(lengths["src_len"], lengths["tgt_len"], max_tokens)
    times["table_s"] = time.perf_counter() - start
    shutil.rmtree(tokenizer_dir)
    self_usage, child_usage = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        **{k: round(v, 3) for k, v in times.items()},
        "prepare_s": round(sum(times.values()), 3),
        "kept": data.stats["train"]["kept"],
        "batches": len(sampler),
        "vocab": len(tokenizer),
        "bpe": info,
        "release_pages": release_pages_enabled(),
        "maxrss_self_gib": self_usage.ru_maxrss / 2**20,
        "maxrss_child_gib": child_usage.ru_maxrss / 2**20,
    }


# --- the runs ----------------------------------------------------------------------------------------------------


def child_env(folder: Path) -> dict:
    return {
        **os.environ,
        "HF_DATASETS_CACHE": str(folder / "cache"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO),
    }


def measure_preparation(folder: Path, args, step: str, corpus: Path | None = None) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.data", "--_prepare", str(folder), "--_corpus", str(corpus or folder)]
    cmd += ["--vocab_size", str(args.vocab_size), "--max_length", str(args.max_length)]
    cmd += ["--max_tokens", str(args.max_tokens)]
    with held(args.lock):
        done, memory = run_measured(cmd, child_env(folder), args.timeout)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"step": step, **result, **memory}


def measure_training(folder: Path, args, streaming: bool, corpus: Path | None = None) -> dict:
    out = folder / ("run-stream" if streaming else "run-map")
    train = (corpus or folder) / "train"
    cmd = [sys.executable, "-m", "training.train", "--train_file", str(train), "--output_dir", str(out)]
    cmd += ["--vocab_size", str(args.vocab_size), "--max_length", str(args.max_length)]
    cmd += ["--max_steps", str(args.train_steps), "--max_tokens_per_step", str(args.max_tokens)]
    cmd += ["--save_steps", "1000000", "--logging_steps", str(args.train_steps), "--device", "cpu"]
    cmd += ["--overwrite_output_dir", "--seed", "0", "--model_config", str(REPO / "configuration" / "tiny.json")]
    if streaming:
        cmd += ["--streaming"]
        if args.stream_chunk_pairs:
            cmd += ["--stream_chunk_pairs", str(args.stream_chunk_pairs)]
    with held(args.lock):
        _, memory = run_measured(cmd, child_env(folder), args.timeout)
    summary = json.loads((out / "run_summary.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return {
        "first_step_s": summary.get("seconds_to_first_step"),
        "tokens_per_s": summary["tokens_per_second"],
        "steady_tokens_per_s": summary["steady_tokens_per_second"],
        "first_step_train_s": summary["first_step_train_seconds"],
        "tokens": summary["tokens_seen_src_plus_tgt"],
        "train_s": summary["train_seconds"],
        "wall_s": memory["wall_s"],
        "peak_rss_gib": memory["peak_rss_gib"],
        "peak_pss_gib": memory["peak_pss_gib"],
        "other_cpu_s": memory["other_cpu_s"],
    }


def measure_size(pairs: int, args, env: dict) -> list[dict]:
    root = Path(tempfile.mkdtemp(prefix=f"data-bench-{pairs}-", dir=args.work_dir))
    try:
        started = time.perf_counter()
        corpus = root if args.corpus_dir is None else Path(args.corpus_dir) / str(pairs)
        source, reused = reuse_or_write_corpus(corpus, pairs)
        corpus_s = time.perf_counter() - started
        common = {"benchmark": "data", "pairs": pairs, "seed_text": source, "corpus_write_s": round(corpus_s, 2)}
        common["corpus_reused"] = reused
        common |= {"vocab_size": args.vocab_size, "max_length": args.max_length, "isolation": args.isolation}
        rows = []
        for step in ("cold",) if args.cold_only else ("cold", "cached"):
            row = {**common, **measure_preparation(root, args, step, corpus)}
            row["pairs_per_s"] = pairs / row["prepare_s"]
            row["tokenize_pairs_per_s"] = pairs / max(row["tokenize_s"], 1e-9)
            rows.append(row)
            print(json.dumps({**row, "env": env}), flush=True)
        if args.train_steps and not args.cold_only:
            mapped = measure_training(root, args, streaming=False, corpus=corpus)
            rows[-1]["restart_first_step_s"] = mapped["first_step_s"]
            rows[-1]["map_tokens_per_s"] = mapped["tokens_per_s"]
            rows[-1]["restart_wall_s"] = mapped["wall_s"]
            rows[-1]["map_train_s"] = mapped["train_s"]
            streamed = measure_training(root, args, streaming=True, corpus=corpus)
            rows[-1]["stream_tokens_per_s"] = streamed["tokens_per_s"]
            rows[-1]["stream_first_step_s"] = streamed["first_step_s"]
            rows[-1]["stream_train_s"] = streamed["train_s"]
            rows[-1]["stream_peak_pss_gib"] = streamed["peak_pss_gib"]
            rows[-1]["map_peak_pss_gib"] = mapped["peak_pss_gib"]
            for name, run in (("map", mapped), ("stream", streamed)):
                rows[-1][f"{name}_steady_tokens_per_s"] = run["steady_tokens_per_s"]
                rows[-1][f"{name}_first_step_train_s"] = run["first_step_train_s"]
            rows[-1]["stream_over_map"] = streamed["steady_tokens_per_s"] / mapped["steady_tokens_per_s"]
            rows[-1]["stream_over_map_whole"] = streamed["tokens_per_s"] / mapped["tokens_per_s"]
            rows[-1]["stream_excess_s"] = round(streamed["train_s"] - mapped["train_s"], 1)
            rows[-1]["map_tokens_per_step"] = round(mapped["tokens"] / args.train_steps)
            rows[-1]["stream_tokens_per_step"] = round(streamed["tokens"] / args.train_steps)
            rows[-1]["map_other_cpu_s"], rows[-1]["stream_other_cpu_s"] = mapped["other_cpu_s"], streamed["other_cpu_s"]
            print(json.dumps({**rows[-1], "env": env}), flush=True)
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)


PHASES = ("load_s", "bpe_s", "tokenize_s", "table_s")
MEMORY = ("peak_pss_gib", "peak_pss_anon_gib", "peak_rss_gib", "peak_anon_gib")


def project(cold: list[dict], pairs: int) -> dict:
    """A cold preparation of `pairs` pairs projected from measured ones (at least two sizes): each phase and each
    memory peak on the straight line (least squares) through the measured points, except the BPE, which learns from
    a sample of BPE_MAX_PAIRS pairs once the corpus is larger: its time stays that of the largest measured size at or
    above the cap (the sampling's cost, a gather of BPE_MAX_PAIRS rows, is what is left out)."""
    import numpy as np

    from training.data.tokenizer import BPE_MAX_PAIRS

    if len({r["pairs"] for r in cold}) < 2:
        raise ValueError("a projection needs cold rows of at least two sizes")
    n = np.array([r["pairs"] for r in cold], dtype=float)
    row = {"pairs": pairs, "step": "projected", "projected_from": sorted({r["pairs"] for r in cold})}
    for key in PHASES + MEMORY:
        slope, intercept = np.polyfit(n, [r[key] for r in cold], 1)
        row[key] = float(slope * pairs + intercept)
    capped = [r for r in cold if r["pairs"] >= BPE_MAX_PAIRS]
    if pairs > BPE_MAX_PAIRS and capped:
        row["bpe_s"] = max(capped, key=lambda r: r["pairs"])["bpe_s"]
    row["prepare_s"] = sum(row[k] for k in PHASES)
    row["pairs_per_s"] = pairs / row["prepare_s"]
    row["tokenize_pairs_per_s"] = pairs / row["tokenize_s"]
    return row


def read_rows(jsonls: list[Path]) -> list[dict]:
    return [json.loads(line) for jsonl in jsonls for line in jsonl.read_text().splitlines() if line.strip()]


def projection(cold: list[dict], pairs: int = 4_500_000) -> tuple[dict | None, str]:
    """`project`'s estimate at `pairs` where no cold row measured that size and two sizes were measured (else None),
    and what the plot's time panel says about that size: measured, projected, or neither."""
    label = f"{pairs / 1e6:g}M"
    if any(r["pairs"] == pairs for r in cold):
        return None, f"cold preparation time (every point measured, {label} included)"
    if len({r["pairs"] for r in cold}) < 2 or pairs < max(r["pairs"] for r in cold):
        return None, "cold preparation time (solid: measured)"
    return project(cold, pairs), f"cold preparation time (solid: measured; dashed: {label} projected)"


def plot(jsonls: list[Path], png: Path, projected_pairs: int = 4_500_000) -> Path:
    """Preparation time and peak memory against N (the cold runs of every file, solid), and `project`'s estimate at
    WMT14 en-de's 4.5M pairs where no file measured it (dashed, hollow marker: a projection, not a measurement); the
    titles say which (`projection`)."""
    from benchmarks.common import pyplot, save_figure

    plt = pyplot()
    rows = read_rows(jsonls)
    cold = sorted((r for r in rows if r["step"] == "cold"), key=lambda r: r["pairs"])
    guess, time_title = projection(cold, projected_pairs)
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, keys, unit in (
        (ax_t, [("prepare_s", "preparation"), ("tokenize_s", "tokenization"), ("bpe_s", "BPE")], "seconds"),
        (
            ax_m,
            [
                ("peak_pss_gib", "peak PSS (tree)"),
                ("peak_pss_anon_gib", "peak PSS, anonymous (tree)"),
                ("peak_rss_gib", "peak RSS (summed)"),
            ],
            "GiB",
        ),
    ):
        for key, label in keys:
            x, y = [r["pairs"] / 1e6 for r in cold], [r[key] for r in cold]
            (line,) = ax.plot(x, y, "o-", label=label)
            if guess is not None:
                px, py = [x[-1], projected_pairs / 1e6], [y[-1], guess[key]]
                ax.plot(px, py, "--", color=line.get_color(), alpha=0.6)
                ax.plot(px[1:], py[1:], "o", mfc="none", color=line.get_color())
        ax.set_xlabel("sentence pairs (millions)")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for goal in (180, 480):  # the goals: 1M in 3 min, 4.5M in 8 min
        ax_t.axhline(goal, color="grey", lw=0.8, ls=":")
    ax_m.axhline(1.5, color="grey", lw=0.8, ls=":")  # ... and 1.5 GiB at every N
    ax_t.set_title(time_title, fontsize=10)
    ax_m.set_title("peak memory during cold preparation" + (" (dashed: projected)" if guess else ""), fontsize=10)
    return save_figure(fig, png)


def build_parser() -> argparse.ArgumentParser:
    from benchmarks.common import benchmark_parser, positive

    p = benchmark_parser("data", __doc__)
    p.add_argument("--sizes", default="100000", help="comma-separated corpus sizes in pairs [100000]")
    p.add_argument("--vocab_size", type=positive, default=37000, help="shared BPE size [37,000, §5.1]")
    p.add_argument("--max_length", type=positive, default=128, help="pairs longer than this are dropped [128]")
    p.add_argument("--max_tokens", type=positive, default=3000, help="tokens per side per step [3,000]")
    p.add_argument("--train_steps", type=int, default=60, help="steps of the restart/streaming runs; 0: none [60]")
    p.add_argument(
        "--stream_chunk_pairs",
        type=positive,
        default=None,
        help="the streaming run's chunk size [the command's: 100,000]",
    )
    p.add_argument("--lock", help="flock this file around each measured step (e.g. /tmp/cpu.lock)")
    p.add_argument("--isolation", default="", help="how the run was isolated, recorded with every row")
    p.add_argument("--work_dir", default=None, help="where the temporary corpus and caches go [system temp]")
    p.add_argument(
        "--corpus_dir",
        default=None,
        help="keep each size's corpus in DIR/<N> and reuse it in later runs (caches stay per run) [not kept]",
    )
    p.add_argument("--cold_only", action="store_true", help="measure only the cold preparation of each size")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per measured step [1800]")
    p.add_argument("--out_dir", default=None, help="results folder [benchmarks/results]")
    p.add_argument("--smoke", action="store_true", help="seconds: 2,000 pairs, vocabulary 500, 2 training steps")
    p.add_argument(
        "--plot", type=Path, nargs="+", help="only draw the PNG of existing results .jsonl files, next to the last"
    )
    p.add_argument("--_prepare", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--_corpus", type=Path, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    if args._prepare is not None:
        result = prepare(args._prepare, args.vocab_size, args.max_length, args.max_tokens, args._corpus)
        print(json.dumps(result), flush=True)
        return [result]
    if args.plot is not None:
        print(plot(args.plot, args.plot[-1].with_suffix(".png")))
        rows = read_rows(args.plot)
        guess, _ = projection([r for r in rows if r["step"] == "cold"])
        if guess is not None:  # only where 4.5M was not measured
            print(json.dumps(guess))
        return [guess] if guess is not None else []
    if args.smoke:
        args.sizes, args.vocab_size, args.train_steps = "2000", 500, min(args.train_steps, 2)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        raise SystemExit(f"--sizes must be comma-separated integers, got {args.sizes!r}") from None
    if not sizes or min(sizes) < 1:
        raise SystemExit(f"--sizes must be positive, got {args.sizes!r}")
    if args.train_steps < 0:
        raise SystemExit(f"--train_steps must be >= 0, got {args.train_steps}")
    from benchmarks.common import report

    env = environment()
    rows = [row for pairs in sizes for row in measure_size(pairs, args, env)]
    report("data", env, rows, COLUMNS, args.out_dir)
    return rows


if __name__ == "__main__":
    main()
