"""Where a `--streaming` run's time goes: every optimizer step's end time, and every chunk's preparation (which
process, when, how much CPU), for one `training.train --streaming` run, with the chunks after the first prepared by
the background worker (`--chunks worker`), by the training process (`--chunks here`), or as training.train decides
(`--chunks auto`: `training.data.streaming.prefetch_pays`).

    python -m benchmarks.stream_steps --chunks worker -- --train_file CORPUS --streaming --max_steps 90 ...
    python -m benchmarks.stream_steps --chunks here -- (the same)

Everything after `--` goes to `training.train` as it is. The run takes the same batches either way (tested in
tests/test_streaming.py), so the two runs' steps compare one for one. Reported: the steps after the first (their
seconds, real tokens/s, the training process's CPU seconds and the machine's busy CPU seconds over them, from
/proc/stat: on 2 cores, 2 × seconds is all there is), and per chunk: where it was prepared, its reading and its
preparation (tokenization, filtering, batches) in wall and CPU seconds, relative to the end of step 1. One JSON line
per run, also written to `benchmarks/results/stream-steps-<hardware>-<date>.{jsonl,md}`. Take the shared CPU lock
around it (`flock /tmp/cpu.lock python -m benchmarks.stream_steps ...`): the machine's busy time shows anything else.
"""

from __future__ import annotations

import os
import resource
import sys
import time

COLUMNS = [
    "chunks",
    "steps",
    "steady_s",
    "steady_tokens_per_s",
    "train_cpu_s",
    "machine_busy_s",
    "worker_cpu_s",
    "chunk_prepare_wall_s",
]


def _busy_s() -> float:
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(chunks: str, train_argv: list[str]) -> dict:
    """One training.train run with its steps and chunk preparations recorded (see the module doc)."""
    import multiprocessing

    import training.data.streaming as streaming
    import training.train as train

    main_pid, events = os.getpid(), multiprocessing.get_context("fork").SimpleQueue()
    prepare, read = streaming.TokenBudgetStream._prepare, streaming.TokenBudgetStream._chunks

    def timed_prepare(self, rows, epoch, chunk, pairs_before):
        wall, cpu = time.time(), time.process_time()
        out = prepare(self, rows, epoch, chunk, pairs_before)
        where = "here" if os.getpid() == main_pid else "worker"
        events.put(("prepare", where, epoch, chunk, wall, time.time(), time.process_time() - cpu))
        return out

    def timed_read(self, epoch, pairs_before):
        wall, cpu = time.time(), time.process_time()
        for item in read(self, epoch, pairs_before):
            where = "here" if os.getpid() == main_pid else "worker"
            events.put(("read", where, epoch, item[0], wall, time.time(), time.process_time() - cpu))
            yield item
            wall, cpu = time.time(), time.process_time()

    streaming.TokenBudgetStream._prepare, streaming.TokenBudgetStream._chunks = timed_prepare, timed_read
    if chunks != "auto":
        streaming.prefetch_pays = lambda on_cpu, processes=1: chunks == "worker"
    steps: list[tuple[int, float, int, float, float]] = []
    callback = train.first_step_callback

    def recording_callback(started, trainer=None):
        cb = callback(started, trainer)
        step_end = cb.on_step_end

        def on_step_end(args, state, control, **kwargs):
            steps.append((state.global_step, time.time(), int(trainer.tokens_seen.item()), _cpu_s(), _busy_s()))
            return step_end(args, state, control, **kwargs)

        cb.on_step_end = on_step_end
        return cb

    train.first_step_callback = recording_callback
    summary = train.main(train_argv)
    first, last = steps[0], steps[-1]
    seconds = last[1] - first[1]
    preparations = []
    while not events.empty():
        kind, where, epoch, chunk, start, end, cpu = events.get()
        preparations.append(
            {"what": kind, "where": where, "epoch": epoch, "chunk": chunk, "cpu_s": round(cpu, 2)}
            | {"from_s": round(start - first[1], 1), "to_s": round(end - first[1], 1)}
        )
    worker = [p for p in preparations if p["where"] == "worker"]
    return {
        "benchmark": "stream-steps",
        "chunks": chunks,
        "prefetch": summary["data_preparation"].get("stream_prefetch"),
        "steps": last[0],
        "steady_s": round(seconds, 2),
        "steady_tokens": last[2] - first[2],
        "steady_tokens_per_s": round((last[2] - first[2]) / seconds),
        "train_cpu_s": round(last[3] - first[3], 1),
        "machine_busy_s": round(last[4] - first[4], 1),
        "worker_cpu_s": round(sum(p["cpu_s"] for p in worker), 1),
        "chunk_prepare_wall_s": [round(p["to_s"] - p["from_s"], 1) for p in preparations if p["what"] == "prepare"],
        "preparations": preparations,
        "step_seconds": [round(b[1] - a[1], 3) for a, b in zip(steps, steps[1:], strict=False)],
        "train_argv": train_argv,
    }


def main(argv: list[str] | None = None) -> dict:
    from benchmarks.common import benchmark_parser

    argv = sys.argv[1:] if argv is None else argv
    ours, train_argv = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = benchmark_parser("stream_steps", __doc__)
    p.add_argument("--chunks", choices=("worker", "here", "auto"), default="auto", help="who prepares chunk 2 on")
    p.add_argument("--out_dir", default=None, help="results folder [benchmarks/results]")
    args = p.parse_args(ours)
    if "--streaming" not in train_argv:
        raise SystemExit("give training.train's arguments after --, --streaming among them")
    import torch

    from benchmarks.common import environment, report

    row = run(args.chunks, train_argv)
    env = environment(torch.device("cpu"))
    print(row, flush=True)
    report("stream-steps", env, [row], COLUMNS, args.out_dir)
    return row


if __name__ == "__main__":
    main()
