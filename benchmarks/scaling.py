"""Step time and memory of one training step against sequence length and against batch size, for this model and
its Marian twin.

    # a few seconds on a CPU: the tiny preset, lengths 4-16, batches 1-4
    python -m benchmarks.scaling --smoke
    # the CPU run: base preset, lengths 8, 16, 32, 64 at batch 8; batches 1, 2, 4, 8 at length 32
    nice -n 10 python -m benchmarks.scaling --device cpu
    # the GPU run: base preset, bf16 autocast, lengths 16-256 at batch 64; batches 8-128 at length 128
    python -m benchmarks.scaling --device cuda
    # other points
    python -m benchmarks.scaling --lengths 32,64,128,256,512 --batch_size 32 --batch_sizes 16,32,64 --length 256

Two sweeps, each point one training step of the kind benchmarks/train.py times (zero_grad, forward with the
model's own loss, backward, AdamW step; bf16 autocast on CUDA, fp32 on CPU; eager, no torch.compile) on random
token ids (4..V-1, no padding) with T_src = T_tgt = T:
- "length": T from --lengths at a fixed batch of B = --batch_size sentence pairs;
- "batch": B from --batch_sizes at a fixed T = --length.
Systems: "ours" (VaswaniForConditionalGeneration, SDPA) and "marian" (`benchmarks.twins.marian_twin`, SDPA). Each
system is built once from the same seed and runs all its points, the other system is not in memory meanwhile.

Per point:
- step_time_median_s (and min) over --repeats timed steps, after one step that measures memory and --warmup
  further untimed steps; tokens_per_s = B · 2T / step time.
- saved_activations_gib: the bytes of the tensors autograd saves for backward in one forward pass, recorded with
  `torch.autograd.graph.saved_tensors_hooks`, each storage counted once (by data_ptr) and the model's parameters
  left out: the activation memory a step holds at its peak, on any device. Under autocast the bf16 copies of the
  weights count (they are saved tensors too).
- peak_memory_gib: on CUDA `torch.cuda.max_memory_allocated` over the point's steps (weights, gradients, Adam
  moments and activations); None on CPU, which keeps no allocator statistics.

Rows are printed as JSON lines and a markdown table and saved as benchmarks/results/scaling-<hw>-<date>.{jsonl,md};
the plot, 2 × 2 panels (time and memory against T, time and memory against B; one line per system; memory is the
CUDA peak on CUDA, the saved activations elsewhere), as scaling-<hw>-<date>.png beside them. Nothing is
overwritten: a numbered name is taken instead. A point that fails (out of memory) gets a row with "error".
"""

import argparse
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

from benchmarks.common import (
    add_model_arguments,
    add_run_arguments,
    apply_isa,
    benchmark_parser,
    emit,
    environment,
    fill_defaults,
    free_path,
    peak_memory_gib,
    pick_device,
    positive,
    positive_list,
    pyplot,
    report,
    reset_peak_memory,
    save_figure,
    set_threads,
    time_it,
)
from benchmarks.train import (
    SYSTEMS,
    autocast,
    build_model,
    load_preset,
    make_optimizer,
    random_batch,
    release,
    train_step,
)

DEFAULTS = {
    "cuda": {
        "preset": "base",
        "lengths": [16, 32, 64, 128, 256],
        "batch_size": 64,
        "batch_sizes": [8, 16, 32, 64, 128],
        "length": 128,
        "warmup": 2,
        "repeats": 10,
    },
    "cpu": {
        "preset": "base",
        "lengths": [8, 16, 32, 64],
        "batch_size": 8,
        "batch_sizes": [1, 2, 4, 8],
        "length": 32,
        "warmup": 1,
        "repeats": 2,
    },
}
SMOKE = {
    "preset": "tiny",
    "lengths": [4, 8, 16],
    "batch_size": 2,
    "batch_sizes": [1, 2, 4],
    "length": 8,
    "warmup": 0,
    "repeats": 2,
    "threads": 1,  # tiny matrices: more threads only wait on each other
}
TABLE = [
    "sweep",
    "system",
    "batch_size",
    "source_len",
    "target_len",
    "step_time_median_s",
    "tokens_per_s",
    "saved_activations_gib",
    "peak_memory_gib",
]


class SavedTensorBytes:
    """Context manager: the bytes of the storages autograd saves for backward inside it, each storage once.

    Storages in `exclude` (the parameters' data pointers) are not counted. The pack hook keeps the tensor itself,
    so a storage stays alive (and its address unique) until backward frees it.
    """

    def __init__(self, exclude: set[int]):
        self.exclude, self.storages = exclude, {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, nested, wrapper)
            return tensor
        if storage.data_ptr() not in self.exclude:
            self.storages[storage.data_ptr()] = max(storage.nbytes(), self.storages.get(storage.data_ptr(), 0))
        return tensor

    def __enter__(self) -> "SavedTensorBytes":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    @property
    def nbytes(self) -> int:
        return sum(self.storages.values())


def measure_point(model, optimizer, precision, batch, device: torch.device, args: argparse.Namespace) -> dict:
    """One step under the saved-tensor hook, --warmup more untimed, --repeats timed; times and memory."""
    reset_peak_memory(device)
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with SavedTensorBytes(parameters) as saved:
        model.zero_grad(set_to_none=True)
        with precision():
            loss = model(**batch).loss
    loss.backward()  # outside the hook: backward saves nothing new
    optimizer.step()
    del loss
    times = time_it(lambda: train_step(model, optimizer, batch, precision), device, args.warmup, args.repeats)
    B, T_src = batch["input_ids"].shape
    return {
        "step_time_median_s": times["median_s"],
        "step_time_min_s": times["min_s"],
        "times_s": times["times_s"],
        "tokens_per_s": B * (T_src + batch["labels"].shape[1]) / times["median_s"],
        "saved_activations_gib": saved.nbytes / 2**30,
        "peak_memory_gib": peak_memory_gib(device),
    }


def points(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    """(sweep, B, T) in the order run: the length sweep, then the batch sweep."""
    return [("length", args.batch_size, T) for T in args.lengths] + [
        ("batch", B, args.length) for B in args.batch_sizes
    ]


def plot(rows: list[dict], path: Path, title: str) -> Path:
    """2 × 2 panels: step time and memory against T (top) and against B (bottom), one line per system."""
    plt = pyplot()
    memory_key = "peak_memory_gib" if any(r.get("peak_memory_gib") is not None for r in rows) else None
    memory_key = memory_key or "saved_activations_gib"
    memory_label = "peak allocated (GiB)" if memory_key == "peak_memory_gib" else "saved activations (GiB)"
    fig, axes = plt.subplots(2, 2, figsize=(10, 8))
    for r, (sweep, x_key, x_label) in enumerate(
        (("length", "source_len", "T = T_src = T_tgt (tokens)"), ("batch", "batch_size", "B (sentence pairs)"))
    ):
        for c, (y_key, y_label) in enumerate((("step_time_median_s", "step time (s)"), (memory_key, memory_label))):
            ax = axes[r][c]
            for system in SYSTEMS:
                done = [x for x in rows if x["sweep"] == sweep and x["system"] == system and x.get(y_key) is not None]
                ax.plot([x[x_key] for x in done], [x[y_key] for x in done], marker="o", label=system)
            ax.set_xscale("log", base=2)
            xs = sorted({x[x_key] for x in rows if x["sweep"] == sweep})
            ax.set_xticks(xs, [str(x) for x in xs])  # the measured values, not 2^k labels
            ax.minorticks_off()
            ax.set_xlabel(x_label)
            ax.set_ylabel(y_label)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
    fig.suptitle(title)
    return save_figure(fig, path)


def build_parser() -> argparse.ArgumentParser:
    p = benchmark_parser("scaling", __doc__)
    a = p.add_argument
    add_model_arguments(p, "V, replacing the preset's (default: the preset's)")
    a("--lengths", type=positive_list, help="length sweep: T values, comma-separated (default 16..256 GPU, 8..64 CPU)")
    a("--batch_size", type=positive, help="length sweep: the fixed B (default 64 GPU, 8 CPU)")
    a("--batch_sizes", type=positive_list, help="batch sweep: B values, comma-separated (default 8..128 GPU, 1..8 CPU)")
    a("--length", type=positive, help="batch sweep: the fixed T (default 128 GPU, 32 CPU)")
    a("--warmup", type=int, help="untimed steps per point after the memory step (default 2 GPU, 1 CPU)")
    a("--repeats", type=positive, help="timed steps per point (default 10 GPU, 2 CPU)")
    add_run_arguments(
        p,
        seed_help="seed of the weights and the random batches",
        smoke_help="seconds-long check: tiny preset, T 4-16, B 1-4, 2 timed steps, 1 thread",
        results=".jsonl, .md and .png",
    )
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    apply_isa(args.isa, "benchmarks.scaling", argv)  # first: may start this script again with the caps set
    device = pick_device(args.device)
    args = fill_defaults(args, device, DEFAULTS, SMOKE)  # unset flags from the device's defaults
    set_threads(args.threads)
    config = load_preset(args.preset, args.vocab_size)
    env = environment(device)
    precision, precision_name = autocast(device)
    plan = points(args)
    longest = max(T for _, _, T in plan)

    rows, bar = [], tqdm(total=len(plan) * len(SYSTEMS), desc="scaling benchmark", unit="point", file=sys.stderr)
    for system in SYSTEMS:
        model = build_model(system, config, device, args.seed, max_positions=longest)
        optimizer, optimizer_name = make_optimizer(model)
        for sweep, B, T in plan:
            bar.set_postfix_str(f"{system} {sweep} B={B} T={T}")
            row = {
                "benchmark": "scaling",
                "sweep": sweep,
                "system": system,
                "preset": args.preset,
                "vocab_size": config.vocab_size,
                "batch_size": B,
                "source_len": T,
                "target_len": T,
                "tokens_per_step": B * 2 * T,
                "precision": precision_name,
                "optimizer": optimizer_name,
                "attn_implementation": model.config._attn_implementation,
            }
            batch = random_batch(B, T, T, config.vocab_size, args.seed, device)  # (B, T) ids, mask and labels
            try:
                row.update(measure_point(model, optimizer, precision, batch, device, args))
            except Exception as e:  # one failed point (out of memory) must not lose the others
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                print(f"{system} {sweep} B={B} T={T} failed: {row['error']}", file=sys.stderr, flush=True)
                optimizer.zero_grad(set_to_none=True)
            del batch
            release(device)
            rows.append(emit(row))
            bar.update()
        model = optimizer = None
        release(device)
    bar.close()

    shown = [{**r, "tokens_per_s": round(r["tokens_per_s"])} if r.get("tokens_per_s") else r for r in rows]
    jsonl, _ = report("scaling", env, rows, TABLE, args.out_dir, shown=shown)
    title = f"one training step, {args.preset} preset, {precision_name}, {env.get('gpu') or env['cpu']}"
    print(f"plot: {plot(rows, free_path(jsonl.parent, jsonl.stem, '.png'), title)}", file=sys.stderr)
    return rows


if __name__ == "__main__":
    main()
