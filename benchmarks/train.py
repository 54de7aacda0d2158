"""Training throughput: this model against its Marian twin, in the same run, on the same batches, with the same
optimizer.

    # a few seconds on a CPU: the tiny preset, batch 4, lengths 8, 2 timed steps
    python -m benchmarks.train --smoke
    # the CPU run: base preset, 8 × 32 source + 8 × 32 target tokens per step, fp32, eager only (about 2 minutes)
    nice -n 10 python -m benchmarks.train --device cpu
    # the GPU run: base preset, 200 × 128 source + 200 × 128 target tokens per step, bf16 autocast,
    # eager and torch.compile for both systems
    python -m benchmarks.train --device cuda
    # only the real-data case, compiled, a larger token budget, another GPU's peak (A100: 312 bf16 TFLOP/s)
    python -m benchmarks.train --device cuda --cases budget --compile compile --max_tokens 50000 --peak_tflops 312

The systems. "ours" is `VaswaniForConditionalGeneration` with attn_implementation "sdpa"; "marian" is its twin
`benchmarks.twins.marian_twin`: a transformers `MarianMTModel` with the same sizes, dropout and (copied) initial
weights, also on SDPA. Both are built afresh, from the same seed, for every configuration.

The step. zero_grad, forward(input_ids, attention_mask, labels), backward, optimizer.step; bf16 autocast on CUDA
(fp32 weights and Adam states), fp32 on CPU. Each model computes its own training loss from `labels`: ours is the
paper's label-smoothed cross-entropy (ε_ls = 0.1, §5.4), Marian's is plain cross-entropy, so the loss values
differ; the work differs by a few elementwise passes over the B × T_tgt × V logits. Ours trains as
training/train.py trains it, with config.fused_loss: the loss and its gradient are computed a chunk of rows at a
time from the decoder states, so the whole (B·T_tgt, V) logits, fp32 log-probabilities and their gradients never
exist (set FUSED_LOSS = False below to measure without). The optimizer is
`torch.optim.AdamW(lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0)` (§5.3's Adam, no schedule), fused where
the device has the fused kernel, else foreach. With "compile", `torch.compile(model)` compiles forward and backward;
the optimizer step stays eager. Batches are on the device before timing: no host-to-device copies are timed.

The cases.
- "fixed": random token ids in 4..V-1 (no specials, no padding), B × T_src source and B × T_tgt target tokens, the
  same batch every step.
- "budget": real sentence-length distribution. Multi30k's training split (../shared/data/multi30k/train.{en,de}.gz)
  where it exists, else the generated default corpus (training/data/corpus.py); a shared BPE trained on it with
  training/data/tokenizer.py (vocabulary = the preset's vocab_size, or fewer where the data has fewer pieces), tokenized
  and length-filtered with training/data/parallel.py, cut into token-budget batches by `TokenBudgetBatchSampler` (≤
  --max_tokens padded tokens per side, shuffled with --seed) and padded by `DataCollatorForSeq2Seq` as
  training/train.py does. The timed steps take --steps different batches (repeated where the data has fewer); the
  warm-up takes the next ones, and with "compile" it first goes once through all the timed batches, so that
  recompiling for new shapes stays outside the timing (with "compile" there are at least 2 warm-up steps in
  either case).

The numbers, per (case, system, compile).
- tokens_per_s: real (non-pad) source + target tokens of the timed steps / their summed time; padded_tokens_per_s
  the same with padding counted; padding_fraction = 1 - real / padded (0 in the fixed case).
- tokens_per_s_median_step: the median over the timed steps of each step's real tokens / its time, which a
  stalled step (another process on a shared CPU) moves less than the mean.
- step_time_median_s (and min) over the timed steps.
- MFU = F · tokens_per_s / P. F = `model_flops_per_token` (benchmarks/twins.py): training FLOPs per source + target
  token, 6 × the matmul weights a token multiplies plus the attention scores (QKᵀ, AV; causal self-attention
  halved), at the batch's lengths; in the budget case summed per pair at its real lengths over the timed pairs and
  divided by their real tokens, so that padding counts as waste. P = --peak_tflops × 10¹²: by default 989 on CUDA
  (H100/H200 dense bf16); on CPU only when --peak_tflops is given, else MFU is left empty. Both systems are the
  same network and get the same F.
- peak_memory_gib: `torch.cuda.max_memory_allocated` from moving the model to the device to the last step
  (weights, gradients, Adam moments, activations, compile workspace); None on CPU, which keeps no statistics.
- tokens_per_s_ours_over_marian and peak_memory_ours_over_marian: ours / Marian for the same (case, compile),
  on both rows.

Each row is printed as a JSON line, then a markdown table; both are saved as benchmarks/results/train-<hw>-<date>
.{jsonl,md} (never over an earlier file). A configuration that fails (out of memory, a compile error) gets a row
with "error" and the run goes on.
"""

import argparse
import contextlib
import gc
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tqdm.auto import tqdm

from benchmarks.common import (
    add_model_arguments,
    add_run_arguments,
    apply_isa,
    benchmark_parser,
    choice_list,
    emit,
    environment,
    fill_defaults,
    peak_memory_gib,
    pick_device,
    positive,
    positive_float,
    report,
    reset_peak_memory,
    set_threads,
    time_it,
)
from benchmarks.twins import marian_twin, model_flops_per_token
from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from modeling_vaswani.kernels_vaswani import cpu_kernel_table
from training.common.runtime import keep_freed_memory_for_reuse

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "configuration"
FUSED_LOSS = True  # ours trains with config.fused_loss (chunked loss, no whole logits), as training/train.py does
# ../shared next to the checkout, or shared/ inside it (as a copied working tree has it)
MULTI30K = [ROOT.parent / "shared/data/multi30k/train", ROOT / "shared/data/multi30k/train"]
SOURCE_LANG, TARGET_LANG = "en", "de"
FIRST_ORDINARY_ID = 4  # <s> 0, <pad> 1, </s> 2, <unk> 3
SYSTEMS = ("ours", "marian")
CASES = ("fixed", "budget")
COMPILE = ("none", "compile")
H100_BF16_DENSE_TFLOPS = 989.0

# what a flag left unset becomes, by device; --smoke overrides these, an explicit flag overrides both
DEFAULTS = {
    "cuda": {
        "preset": "base",
        "batch_size": 200,
        "source_len": 128,
        "target_len": 128,
        "max_tokens": 25_000,  # §5.1's 25,000 source + 25,000 target tokens per step, on one device
        "steps": 20,
        "warmup": 3,
        "rounds": 1,
        "compile": list(COMPILE),
        "pad_to_multiple_of": 8,
        "max_pairs": None,
    },
    "cpu": {
        "preset": "base",
        "batch_size": 8,
        "source_len": 32,
        "target_len": 32,
        "max_tokens": 256,
        "steps": 5,
        "warmup": 2,
        "compile": ["none"],
        "pad_to_multiple_of": 1,
        "max_pairs": None,
        "rounds": 3,
    },
}
SMOKE = {
    "preset": "tiny",
    "batch_size": 4,
    "source_len": 8,
    "target_len": 8,
    "max_tokens": 128,
    "steps": 2,
    "warmup": 1,
    "rounds": 1,
    "compile": ["none"],
    "max_pairs": 1000,
    "threads": 1,  # tiny matrices: more threads only wait on each other (and on anything else running)
}

TABLE = [
    "case",
    "system",
    "compile",
    "batch_size",
    "source_len",
    "target_len",
    "tokens_per_s",
    "tokens_per_s_median_step",
    "padded_tokens_per_s",
    "padding_fraction",
    "step_time_median_s",
    "mfu",
    "peak_memory_gib",
    "tokens_per_s_ours_over_marian",
    "peak_memory_ours_over_marian",
]


def load_preset(name: str, vocab_size: int | None = None) -> VaswaniConfig:
    """configuration/<name>.json (base, big, small, tiny) or a JSON path; `vocab_size` replaces the preset's."""
    path = PRESETS / f"{name}.json" if (PRESETS / f"{name}.json").is_file() else Path(name)
    if not path.is_file():
        known = sorted(p.stem for p in PRESETS.glob("*.json") if not p.stem.startswith(("recipe", "accelerate")))
        raise SystemExit(f"--preset {name!r}: neither a preset ({', '.join(known)}) nor a JSON file")
    config = VaswaniConfig.from_json_file(str(path))
    if vocab_size is not None:
        config.vocab_size = vocab_size
    if config.vocab_size <= FIRST_ORDINARY_ID:
        raise SystemExit(f"vocab_size must exceed {FIRST_ORDINARY_ID} (the special ids), got {config.vocab_size}")
    return config


# ---- the systems and the step, shared with benchmarks/scaling.py ----


def build_model(system: str, config: VaswaniConfig, device: torch.device, seed: int, max_positions: int = 1024):
    """A fresh model in training mode on `device`: ours (SDPA) or its Marian twin with the same initial weights."""
    torch.manual_seed(seed)
    ours = VaswaniForConditionalGeneration._from_config(config, attn_implementation="sdpa")
    if system == "ours":
        model = ours
        model.config.fused_loss = FUSED_LOSS  # as training/train.py trains it
        model.config.label_smoothing = 0.1  # ε_ls (§5.4), the recipe's label_smoothing_factor, applied by this loss
    elif system == "marian":
        model = marian_twin(ours, max_positions=max(1024, max_positions))
        model.set_attn_implementation("sdpa")
        del ours
    else:
        raise ValueError(f"unknown system {system!r}; expected one of {SYSTEMS}")
    return model.to(device).train()


def make_optimizer(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, str]:
    """AdamW(lr 1e-4, β₁ 0.9, β₂ 0.98, ε 1e-9, no weight decay): fused where the device has it, else foreach."""
    hyper = {"lr": 1e-4, "betas": (0.9, 0.98), "eps": 1e-9, "weight_decay": 0.0}
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        return torch.optim.AdamW(params, fused=True, **hyper), "AdamW fused"
    except RuntimeError:  # no fused kernel for this device or dtype
        return torch.optim.AdamW(params, foreach=True, **hyper), "AdamW foreach"


def autocast(device: torch.device) -> tuple[Callable[[], contextlib.AbstractContextManager], str]:
    """bf16 autocast on CUDA, nothing (fp32) elsewhere; and the precision's name for the results."""
    if device.type == "cuda":
        return (lambda: torch.autocast("cuda", dtype=torch.bfloat16)), "bf16 autocast"
    return contextlib.nullcontext, "fp32"


def random_batch(
    batch_size: int, source_len: int, target_len: int, vocab_size: int, seed: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """Token ids drawn uniformly from 4..V-1 (no specials, no padding)."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(FIRST_ORDINARY_ID, vocab_size, (batch_size, source_len), generator=g)  # (B, T_src)
    labels = torch.randint(FIRST_ORDINARY_ID, vocab_size, (batch_size, target_len), generator=g)  # (B, T_tgt)
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
    return {k: v.to(device) for k, v in batch.items()}


def train_step(
    model: Callable,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    precision: Callable[[], contextlib.AbstractContextManager],
    forward_context: contextlib.AbstractContextManager | None = None,
) -> torch.Tensor:
    """zero_grad, forward with the model's own loss, backward, optimizer step; the detached loss."""
    optimizer.zero_grad(set_to_none=True)
    with forward_context or contextlib.nullcontext(), precision():
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    return loss.detach()


def release(device: torch.device, compiled: bool = False) -> None:
    """Free what the previous configuration left: Python garbage, cached CUDA blocks, compiled graphs."""
    if compiled:
        torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---- the two cases ----


def real_tokens(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per pair: real source tokens (mask) and real target tokens (labels ≠ -100); (B,) each."""
    return batch["attention_mask"].sum(1), (batch["labels"] != -100).sum(1)


def batch_stats(batches: list[dict[str, torch.Tensor]], config: VaswaniConfig) -> dict[str, float]:
    """Real and padded tokens and model FLOPs of `batches` (FLOPs per pair at its real lengths)."""
    padded = flops = 0.0
    pairs = src = tgt = 0
    per_batch = []
    cache: dict[tuple[int, int], float] = {}
    for batch in batches:
        n_src, n_tgt = real_tokens(batch)
        for s, t in zip(n_src.tolist(), n_tgt.tolist(), strict=True):
            if (s, t) not in cache:
                cache[s, t] = model_flops_per_token(config, s, t)["flops_per_step_per_pair"]
            flops += cache[s, t]
        pairs += len(n_src)
        per_batch.append(int(n_src.sum() + n_tgt.sum()))
        src, tgt = src + int(n_src.sum()), tgt + int(n_tgt.sum())
        padded += batch["input_ids"].numel() + batch["labels"].numel()
    real = src + tgt
    return {
        "real_tokens": real,
        "padded_tokens": padded,
        "flops": flops,
        "real_tokens_per_batch": per_batch,
        "pairs": pairs,
        "mean_source_len": src / pairs,
        "mean_target_len": tgt / pairs,
    }


def find_data(name: str) -> tuple[dict, str]:
    """load_parallel arguments and a label for --data ("auto": Multi30k where it exists, else the default corpus)."""
    if name == "default":
        return {"dataset_name": "default"}, "default corpus (training/data/corpus.py)"
    if name == "auto":
        for prefix in MULTI30K:
            if prefix.with_name("train.en.gz").is_file() or prefix.with_name("train.en").is_file():
                return {"train_file": str(prefix)}, f"Multi30k train ({prefix})"
        return {"dataset_name": "default"}, "default corpus (training/data/corpus.py; no Multi30k found)"
    path = Path(name)
    moses = [path.with_name(f"{path.name}.{lang}{gz}") for lang in (SOURCE_LANG, TARGET_LANG) for gz in ("", ".gz")]
    if not path.is_file() and not any(p.is_file() for p in moses):
        raise SystemExit(f"--data {name}: no such file, nor Moses files {path}.{{en,de}}[.gz]")
    return {"train_file": str(path)}, str(path)


def budget_batches(
    args: argparse.Namespace, config: VaswaniConfig, device: torch.device, needed: int
) -> tuple[list[dict[str, torch.Tensor]], VaswaniConfig, dict]:
    """`needed` token-budget batches of real text (in the sampler's seeded order, repeated if it has fewer), on
    `device`, with the config resized to the trained BPE vocabulary."""
    import datasets
    from transformers import DataCollatorForSeq2Seq

    from training.data.parallel import load_parallel, tokenize_pairs
    from training.data.tokenizer import train_tokenizer_for
    from training.trainer.batching import TokenBudgetBatchSampler

    source, label = find_data(args.data)
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        raw = load_parallel(**source, source_lang=SOURCE_LANG, target_lang=TARGET_LANG, splits=["train"])
        if args.max_pairs:
            raw["train"] = raw["train"].select(range(min(args.max_pairs, len(raw["train"]))))
        tokenizer = train_tokenizer_for(raw, SOURCE_LANG, TARGET_LANG, config.vocab_size, show_progress=False)
        max_length = min(args.max_length, args.max_tokens)  # a longer pair fits in no batch
        data = tokenize_pairs(raw, tokenizer, SOURCE_LANG, TARGET_LANG, max_length)["train"]
    finally:
        if bars:
            datasets.enable_progress_bars()
    if len(data) == 0:
        raise SystemExit(f"budget case: no pair of {label} has at most {max_length} tokens per side")
    sampler = TokenBudgetBatchSampler(
        data["src_len"], data["tgt_len"], args.max_tokens, seed=args.seed, pad_to_multiple_of=args.pad_to_multiple_of
    )
    order = list(sampler)
    collate = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100, pad_to_multiple_of=args.pad_to_multiple_of)
    rows = data.select_columns(["input_ids", "attention_mask", "labels"])
    batches = []
    for i in range(needed):
        features = [rows[j] for j in order[i % len(order)]]
        batches.append({k: v.to(device) for k, v in collate(features).items()})  # (B, T_src), (B, T_tgt)
    config = VaswaniConfig.from_dict(config.to_dict())
    config.vocab_size = len(tokenizer)
    info = {"data": label, "pairs_available": len(data), "batches_available": len(order), "max_length": max_length}
    return batches, config, info


# ---- measuring one configuration ----


def measure(
    system: str,
    compile_mode: str,
    config: VaswaniConfig,
    warm: list[dict[str, torch.Tensor]],
    timed: list[dict[str, torch.Tensor]],
    device: torch.device,
    args: argparse.Namespace,
) -> dict:
    """Build `system`, run the `warm` steps untimed and the `timed` steps timed; times, memory and losses."""
    reset_peak_memory(device)
    max_positions = max(max(b["input_ids"].shape[1], b["labels"].shape[1]) for b in timed + warm)
    model = build_model(system, config, device, args.seed, max_positions)
    optimizer, optimizer_name = make_optimizer(model)
    precision, precision_name = autocast(device)
    step_model = torch.compile(model) if compile_mode == "compile" else model
    losses: list[torch.Tensor] = []
    feed: Iterator[dict[str, torch.Tensor]] = iter(warm + timed)
    try:
        times = time_it(
            lambda: losses.append(train_step(step_model, optimizer, next(feed), precision)),
            device,
            warmup=len(warm),
            repeats=len(timed),
        )
        result = {
            "attn_implementation": model.config._attn_implementation,
            "precision": precision_name,
            "optimizer": optimizer_name,
            "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "step_time_median_s": times["median_s"],
            "step_time_min_s": times["min_s"],
            "total_s": sum(times["times_s"]),
            "times_s": times["times_s"],
            "peak_memory_gib": peak_memory_gib(device),
            "loss_first": float(losses[len(warm)]),
            "loss_last": float(losses[-1]),
        }
    finally:  # drop the model, its optimizer states and compiled graphs before the next configuration
        model = optimizer = step_model = None
        losses.clear()
        release(device, compiled=compile_mode == "compile")
    return result


def warm_up(mode: str, timed: list, further: list) -> list:
    """The untimed steps: `further`; compiled, first every distinct timed batch (each new shape compiles once
    here), then `further`, at least 2 steps in all (the first compiles, the second may recompile)."""
    if mode != "compile":
        return further
    warm = list({id(b): b for b in timed}.values()) + further
    return warm + [timed[0]] * max(0, 2 - len(warm))


def merge_rounds(results: list[dict]) -> dict:
    """One system's rounds as one measurement: step times pooled, peak memory the largest, losses of round 1."""
    merged = dict(results[0])
    merged["times_s"] = [t for r in results for t in r["times_s"]]
    merged["total_s"] = sum(r["total_s"] for r in results)
    merged["step_time_median_s"] = statistics.median(merged["times_s"])
    merged["step_time_min_s"] = min(merged["times_s"])
    memory = [r["peak_memory_gib"] for r in results if r.get("peak_memory_gib") is not None]
    merged["peak_memory_gib"] = max(memory) if memory else None
    merged["rounds"] = len(results)
    return merged


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def build_parser() -> argparse.ArgumentParser:
    p = benchmark_parser("train", __doc__)
    a = p.add_argument
    add_model_arguments(p, "V for the fixed case and the BPE size for the budget case (default: preset's)")
    a("--cases", type=choice_list(CASES), default=list(CASES), help="comma-separated: fixed, budget (default both)")
    a("--compile", type=choice_list(COMPILE), help="comma-separated: none, compile (default: none on CPU, both on GPU)")
    a("--batch_size", type=positive, help="fixed case: B sentence pairs per step (default 200 GPU, 8 CPU)")
    a("--source_len", type=positive, help="fixed case: T_src tokens per source sentence (default 128 GPU, 32 CPU)")
    a("--target_len", type=positive, help="fixed case: T_tgt tokens per target sentence (default 128 GPU, 32 CPU)")
    a("--max_tokens", type=positive, help="budget case: padded tokens per side and batch (default 25000 GPU, 256 CPU)")
    a("--max_length", type=positive, default=256, help="budget case: drop pairs longer than this (and max_tokens)")
    a("--pad_to_multiple_of", type=positive, help="budget case: pad lengths to a multiple (default 8 GPU, 1 CPU)")
    a("--data", default="auto", help='budget case: "auto" (Multi30k if present), "default", or a file/Moses prefix')
    a("--max_pairs", type=positive, help="budget case: use only the first N training pairs (default all)")
    a("--steps", type=positive, help="timed steps per configuration (default 20 GPU, 5 CPU)")
    a("--warmup", type=int, help="untimed steps before them (default 3 GPU, 2 CPU; compile adds a pass, see above)")
    a(
        "--rounds",
        type=positive,
        help="measure each system this many times, alternating which goes first (ours, marian / marian, ours, ...);"
        " the times are pooled: cancels drift on a shared CPU (default 3 CPU, 1 GPU)",
    )
    a("--peak_tflops", type=positive_float, help="peak FLOP/s in 10^12 for MFU (default 989 on CUDA, none on CPU)")
    add_run_arguments(
        p,
        seed_help="seed of the weights, the random batch and the batch order",
        smoke_help="seconds-long check: tiny preset, batch 4, lengths 8, 2 timed steps, 1 thread",
    )
    return p


def resolve(args: argparse.Namespace, device: torch.device) -> argparse.Namespace:
    """Fill unset flags from the device's defaults (and --smoke's); refuse contradictions before any work."""
    args = fill_defaults(args, device, DEFAULTS, SMOKE)
    if args.peak_tflops is None and device.type == "cuda":
        args.peak_tflops = H100_BF16_DENSE_TFLOPS
    if "budget" in args.cases and min(args.max_length, args.max_tokens) < 2:
        raise SystemExit("--max_tokens and --max_length must be ≥ 2 (one token and </s>) for the budget case")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    apply_isa(args.isa, "benchmarks.train", argv)  # first: may start this script again with the caps set
    device = pick_device(args.device)
    args = resolve(args, device)
    set_threads(args.threads)
    config = load_preset(args.preset, args.vocab_size)
    env = environment(device)
    env["malloc_keeps_freed_blocks"] = keep_freed_memory_for_reuse()  # training/common/runtime.py; both systems alike

    # every batch first (a bad --data fails here, before any model is built)
    workloads = {}  # case → (config, timed batches, further warm-up batches, case info)
    if "fixed" in args.cases:
        batch = random_batch(args.batch_size, args.source_len, args.target_len, config.vocab_size, args.seed, device)
        workloads["fixed"] = (config, [batch] * args.steps, [batch] * args.warmup, {})
    if "budget" in args.cases:
        batches, budget_config, info = budget_batches(args, config, device, args.steps + args.warmup)
        workloads["budget"] = (budget_config, batches[: args.steps], batches[args.steps :], info)

    plan = [(case, mode, system) for case in workloads for mode in args.compile for system in SYSTEMS]
    rows, bar = [], tqdm(total=len(plan) * args.rounds, desc="train benchmark", unit="run", file=sys.stderr)
    for case, (case_config, timed, further, info) in workloads.items():
        stats = batch_stats(timed, case_config)
        flops_per_token = stats["flops"] / stats["real_tokens"]
        for mode in args.compile:
            warm = warm_up(mode, timed, further)
            pair = {}
            for system in SYSTEMS:
                bar.set_postfix_str(f"{case} {system} {mode}")
                row = {
                    "benchmark": "train",
                    "case": case,
                    "system": system,
                    "compile": mode,
                    "preset": args.preset,
                    "vocab_size": case_config.vocab_size,
                    "batch_size": args.batch_size if case == "fixed" else round(stats["pairs"] / len(timed), 1),
                    "source_len": args.source_len if case == "fixed" else round(stats["mean_source_len"], 2),
                    "target_len": args.target_len if case == "fixed" else round(stats["mean_target_len"], 2),
                    **({"max_tokens": args.max_tokens, **info} if case == "budget" else {}),
                    "warmup_steps": len(warm),
                    "timed_steps": len(timed),
                }
                pair[system] = row
            for round_ in range(args.rounds):  # ours first in even rounds, marian first in odd ones
                for system in SYSTEMS if round_ % 2 == 0 else SYSTEMS[::-1]:
                    row = pair[system]
                    if "error" in row:
                        continue
                    bar.set_postfix_str(f"{case} {system} {mode} round {round_ + 1}")
                    try:
                        result = measure(system, mode, case_config, warm, timed, device, args)
                    except Exception as e:  # one failed configuration (OOM, compile error) must not lose the others
                        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                        print(f"{case} {system} {mode} failed: {row['error']}", file=sys.stderr, flush=True)
                        release(device, compiled=mode == "compile")
                        bar.update(args.rounds - round_)
                        continue
                    row.setdefault("_rounds", []).append(result)
                    bar.update()
            for system in SYSTEMS:
                row = pair[system]
                done = row.pop("_rounds", [])
                if done and "error" not in row:
                    result = merge_rounds(done)
                    total = result.pop("total_s")
                    tokens_per_s = len(done) * stats["real_tokens"] / total
                    per_step = [
                        n / t
                        for n, t in zip(stats["real_tokens_per_batch"] * len(done), result["times_s"], strict=True)
                    ]
                    row.update(result)
                    row.update(
                        tokens_per_s=tokens_per_s,
                        tokens_per_s_median_step=statistics.median(per_step),
                        padded_tokens_per_s=len(done) * stats["padded_tokens"] / total,
                        padding_fraction=1 - stats["real_tokens"] / stats["padded_tokens"],
                        flops_per_token=flops_per_token,
                        peak_tflops=args.peak_tflops,
                        mfu=flops_per_token * tokens_per_s / (args.peak_tflops * 1e12) if args.peak_tflops else None,
                    )
            ours, marian = pair["ours"], pair["marian"]
            if device.type == "cpu":
                ours["cpu_kernel_choices"] = cpu_kernel_table()  # the "auto" kernel's choices per shape (training)
            for row in (ours, marian):
                row["tokens_per_s_ours_over_marian"] = ratio(ours.get("tokens_per_s"), marian.get("tokens_per_s"))
                row["peak_memory_ours_over_marian"] = ratio(ours.get("peak_memory_gib"), marian.get("peak_memory_gib"))
                rows.append(emit(row))
    bar.close()

    whole = (
        "tokens_per_s",
        "tokens_per_s_median_step",
        "padded_tokens_per_s",
    )  # tokens/s as whole numbers in the table, not 1.234e+04
    shown = [{**r, **{k: round(r[k]) for k in whole if r.get(k) is not None}} for r in rows]
    report("train", env, rows, TABLE, args.out_dir, shown=shown)
    return rows


if __name__ == "__main__":
    main()
