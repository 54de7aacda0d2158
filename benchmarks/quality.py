"""Translation quality at an equal training budget: this model against its Marian twin, each under its own recipe,
plus this model under Marian's learning-rate curve (so that recipe and code can be told apart); then every test set
decoded with each system's default decoding and scored with sacreBLEU.

    # seconds on a CPU: the tiny model on a few hundred generated pairs (tests/test_quality.py runs it)
    python -m benchmarks.quality --smoke
    # the CPU budget of the Multi30k reference (../shared/data/multi30k/README.md): 1,700 steps of 8,192 padded
    # tokens per side for each system, hours on 2 cores; one system per call, then the report (nothing retrains)
    python -m benchmarks.quality --systems ours --train_only
    python -m benchmarks.quality --systems ours-marian-lr --train_only
    python -m benchmarks.quality --systems marian --train_only
    python -m benchmarks.quality --test ../shared/data/multi30k/test_2016_flickr --test path/to/another/set
    # the GPU form (benchmarks/gpu.sh): the base preset, bf16
    python -m benchmarks.quality --device cuda --bf16 --model_config configuration/base.json --p_drop 0.3

The budget. Every system trains on the same pairs (one shared BPE, trained once, the same length filter), in the
same token-budget batches (training/trainer/batching.py: the same sampler, seed and budget, so the same batches in the same
order, padding counted the same way), for the same number of optimizer steps, from the same seed. Ours and the
twin start from the same weights: the twin is built from ours (benchmarks/twins.py's `copy_weights`) except its
sinusoid position tables, which Marian never saves and recomputes in its own layout when a checkpoint loads, so
the twin keeps its own. Each run records the real and the padded source + target tokens it trained on and its
steps; the report refuses systems whose counts differ.

The systems.
- "ours": `VaswaniForConditionalGeneration` through `train`'s own Trainer set-up (training/trainer/build.py:
  VaswaniTrainer, the §5.3 schedule, ε_ls in the fused loss) under --recipe (configuration/recipe_small.json),
  only the budget (--max_steps, --max_tokens_per_step) and the seed overridden. Its default decoding is the paper's
  (beam 4, GNMT α 0.6, at most |source| + 50 tokens) on the average of the last `save_total_limit` checkpoints, as
  the recipe keeps them (§6.1: `save_steps` apart, and the final one); the last checkpoint is scored too, and any
  other window given as --average N@S (the last N, S steps apart: a run that saves more often than the recipe
  holds several windows; saving does not change the weights, so such a run is the same run). --compare_rules decodes
  the default checkpoint once more under transformers' length penalty |Y|^α (the twin's rule), to tell decoding from
  training.
- "ours-marian-lr": the same, under Marian's learning-rate curve: linear warmup over --marian_warmup steps to
  --marian_peak_lr, then inverse square root (fairseq's inverse_sqrt, which is the §5.3 formula with
  lr_scale = peak · √(d_model · warmup)).
- "marian": transformers' `MarianMTModel` (the twin) under the reference recipe of ../shared/data/multi30k: the same
  Trainer set-up and batches, Marian's learning-rate curve, ε_ls 0.1 through Trainer's own `LabelSmoother` (Marian's
  loss is plain cross-entropy), dropout as the preset; its default decoding is transformers' beam search (beam 4,
  length_penalty 0.6 on |Y|^α, early_stopping False, at most the batch's longest source + 50 new tokens) on the last
  checkpoint; the averages (--average) are scored too.

Validation BLEU is measured during training every `eval_steps` (the recipe's, or --eval_steps) with each system's
decoding, for the curve. At the end the validation set and every --test set (Moses-style `prefix.{src,tgt}[.gz]`,
any number) are decoded in full with training/evaluate.py (length-sorted batches of ≤ 4,000 source tokens) and
scored with sacreBLEU (BLEU with its signature, chrF).

Per (system, checkpoint, set) one row: bleu, its 95% confidence half-interval (ci95) and the paired-bootstrap p-value
of its difference from the twin's default decoding (p_vs_twin; sacreBLEU's --paired-bs, 1,000 resamples), chrf,
signature, steps, tokens_seen (real source + target tokens), padded_tokens_seen, train_seconds (Trainer's
train_runtime), decode_seconds, the learning-rate curve, the validation-BLEU curve, and the hardware (CPU model, ISA
flags, threads; GPU). The translations go to <run>/hypotheses/<checkpoint>.<set>.txt. Files:
benchmarks/results/quality-<hardware>-<date>.{jsonl,md,png} (never overwritten; the PNG: validation BLEU against
steps, one line per system). Runs live in --runs_dir (git-ignored runs/quality by default); a system whose run is
complete there is not trained again, and runs of other settings are refused (--overwrite replaces them). A run of the
same settings that stopped early (killed, machine gone) continues from its newest complete checkpoint, as
`train --resume` does: the same batches in the same order, and the token counts and training time carried over from
the checkpoint (quality_progress.json), so a budget of hours can be trained in several sittings.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = next(
    (p for p in (ROOT.parent / "shared/data/multi30k", ROOT / "shared/data/multi30k") if p.is_dir()),
    ROOT.parent / "shared/data/multi30k",
)
SYSTEMS = ("ours", "ours-marian-lr", "marian")
RECIPES = {
    "ours": "recipe (§5.3 schedule, lr_scale and warmup of the recipe), ε_ls in the model's loss",
    "ours-marian-lr": "recipe, but Marian's learning-rate curve",
    "marian": "Marian reference: inverse_sqrt (linear warmup to the peak), ε_ls by Trainer's LabelSmoother",
}
DEFAULT_CHECKPOINT = {"ours": "average", "ours-marian-lr": "average", "marian": "last"}
RUN_RECORD = "quality_run.json"
RUN_SETTINGS = "quality_settings.json"  # written when a run starts: what an unfinished run must match to continue
RUN_PROGRESS = "quality_progress.json"  # per saved checkpoint: token counts and training time up to it
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
# what --smoke changes (explicit flags still win): the tiny model on generated data, a few steps
SMOKE = {
    "max_steps": 6,
    "max_tokens_per_step": 400,
    "vocab_size": 300,
    "max_length": 48,
    "marian_warmup": 3,
    "warmup_steps": 3,
    "save_steps": 2,
    "save_total_limit": 2,
    "eval_steps": 3,
    "logging_steps": 2,
    "max_eval_samples": 12,
    "max_test_samples": 12,
    "threads": 1,
}
TABLE = [
    "system",
    "checkpoint",
    "rule",
    "default",
    "set",
    "bleu",
    "ci95",
    "p_vs_twin",
    "chrf",
    "steps",
    "tokens_seen",
    "padded_tokens_seen",
    "peak_lr",
    "train_seconds",
    "decode_seconds",
]


# ---- settings ----


def build_parser() -> argparse.ArgumentParser:
    from benchmarks.common import benchmark_parser

    p = benchmark_parser("quality", __doc__)
    a = p.add_argument
    a("--recipe", default=str(ROOT / "configuration/recipe_small.json"), help="our recipe (default recipe_small)")
    a("--train_file", help=f"training pairs, Moses prefix / .jsonl / .tsv (default {MULTI30K}/train)")
    a("--validation_file", help=f"validation pairs (default {MULTI30K}/val)")
    a("--test", action="append", default=[], help="a test set's Moses prefix (prefix.SRC, prefix.TGT, .gz or not); "
      f"repeat for more (default {MULTI30K}/test_2016_flickr)")  # fmt: skip
    a("--source_lang", default="en")
    a("--target_lang", default="de")
    a("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {', '.join(SYSTEMS)}")
    a("--max_steps", type=int, default=1700, help="optimizer steps, every system (default 1,700: the reference's)")
    a("--max_tokens_per_step", type=int, default=8192, help="padded tokens per side and step (default 8,192)")
    a("--seed", type=int, default=0, help="weights, dropout and batch order, every system")
    a("--marian_peak_lr", type=float, default=1e-3, help="Marian's peak learning rate (reference: 1e-3)")
    a("--marian_warmup", type=int, default=600, help="Marian's linear warmup steps (reference: 600)")
    a("--model_config", help="model preset JSON instead of the recipe's (e.g. configuration/base.json)")
    a("--p_drop", type=float, help="dropout instead of the preset's")
    a("--vocab_size", type=int, help="shared BPE size instead of the recipe's")
    a("--max_length", type=int, help="length filter instead of the recipe's")
    a("--warmup_steps", type=int, help="our warmup instead of the recipe's")
    a("--save_steps", type=int, help="checkpoint interval instead of the recipe's")
    a("--save_total_limit", type=int, help="checkpoints kept (and averaged by default) instead of the recipe's")
    a(
        "--average",
        action="append",
        default=[],
        metavar="N@S",
        help="score the average of the last N checkpoints S steps apart (and the final one), e.g. 5@200; repeat for "
        "more windows beside the default decoding's (save_total_limit@save_steps: the recipe's, or those flags')",
    )
    a("--eval_steps", type=int, help="validation interval (the curve) instead of the recipe's")
    a("--logging_steps", type=int, help="training-loss log interval instead of the recipe's")
    a("--max_eval_samples", type=int, help="validation pairs used during training (default: the recipe's)")
    a("--compare_rules", action="store_true", help="also decode our systems' default checkpoint with transformers' "
      "length penalty |Y|^α (the twin's), to tell decoding from training")  # fmt: skip
    a("--max_test_samples", type=int, help="decode only the first N pairs of each set at the end")
    a("--bf16", action="store_true", help="bfloat16 mixed precision (GPU)")
    a("--device", help="cpu, cuda or cuda:N (default: cuda if visible)")
    a("--threads", type=int, help="torch CPU threads")
    a("--runs_dir", help="where the runs go (default runs/quality; --smoke: a fresh temporary folder)")
    a("--out_dir", help="folder for the .jsonl, .md and .png results (default benchmarks/results)")
    a("--train_only", action="store_true", help="train the systems and stop (report later, nothing retrains)")
    a("--overwrite", action="store_true", help="replace runs of other settings in --runs_dir")
    a("--note", default="", help="recorded in every row and the table's header (e.g. how the run was isolated)")
    a("--smoke", action="store_true", help="seconds: tiny model, generated data, 6 steps per system")
    return p


def parse_window(text: str) -> tuple[int, int]:
    """ "N@S" -> (N, S): the last N checkpoints S steps apart."""
    try:
        n, s = (int(x) for x in text.split("@"))
    except ValueError:
        raise SystemExit(f"--average takes N@S (the last N checkpoints, S steps apart), got {text!r}") from None
    if n < 1 or s < 1:
        raise SystemExit(f"--average N@S needs N >= 1 and S >= 1, got {text!r}")
    return n, s


def window_steps(steps: list[int], n: int, every: int) -> list[int] | None:
    """The steps of the checkpoints a run saving every `every` steps and keeping `n` would hold at its end: the last
    n of the multiples of `every` up to the final step, and the final step (Trainer saves it too), oldest first;
    None when `steps` (the checkpoints on disk) lacks one of them (tests/test_quality.py)."""
    if not steps:
        return None
    final = max(steps)
    wanted = sorted({s for s in range(every, final + 1, every)} | {final})[-n:]
    return wanted if set(wanted) <= set(steps) else None


def window_name(n: int, every: int) -> str:
    return f"average of last {n} (every {every})"


def parse_systems(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in items if x not in SYSTEMS]
    if not items or unknown:
        raise SystemExit(f"--systems {text!r}: expected a comma-separated subset of {', '.join(SYSTEMS)}")
    return list(dict.fromkeys(items))


def moses_files(prefix: str, lang: str) -> Path | None:
    for suffix in ("", ".gz"):
        path = Path(f"{prefix}.{lang}{suffix}")
        if path.is_file():
            return path
    return None


def check_tests(args: argparse.Namespace) -> None:
    """Every --test prefix must have both language files (before any training)."""
    for prefix in args.test:
        missing = [lang for lang in (args.source_lang, args.target_lang) if moses_files(prefix, lang) is None]
        if missing:
            raise SystemExit(
                f"--test {prefix}: no {' or '.join(f'{prefix}.{lang}[.gz]' for lang in missing)} (a test set is a "
                "Moses prefix: prefix.SRC and prefix.TGT, optionally gzipped)"
            )


def smoke_data(folder: Path, args: argparse.Namespace) -> None:
    """Generated pairs (training/data/corpus.py) as JSON-lines train/validation files, a Moses test set, and the tiny
    preset at d_model 32 (what tests/tiny_runs.py trains)."""
    from training.data.corpus import default_corpus

    folder.mkdir(parents=True, exist_ok=True)
    corpus = default_corpus(seed=1, train_size=600, validation_size=20, test_size=12)
    for split in ("train", "validation"):
        rows = corpus[split]["translation"]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"translation": r}) + "\n" for r in rows))
    for lang in (args.source_lang, args.target_lang):
        (folder / f"test.{lang}").write_text("".join(r[lang] + "\n" for r in corpus["test"]["translation"]))
    tiny = json.loads((ROOT / "configuration/tiny.json").read_text())
    (folder / "model.json").write_text(json.dumps({**tiny, "d_model": 32, "d_ff": 64, "h": 2}))
    args.train_file = args.train_file or str(folder / "train.jsonl")
    args.validation_file = args.validation_file or str(folder / "validation.jsonl")
    args.test = args.test or [str(folder / "test")]
    args.model_config = args.model_config or str(folder / "model.json")


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Defaults, --smoke's sizes, and every check that can fail before training starts."""
    args.systems = parse_systems(args.systems)
    if args.smoke:
        for key, value in SMOKE.items():  # a flag given on the command line wins
            if key not in args.given:
                setattr(args, key, value)
        if args.runs_dir is None:
            import tempfile

            args.runs_dir = tempfile.mkdtemp(prefix="quality-smoke-")
        smoke_data(Path(args.runs_dir) / "data", args)
        args.device = args.device or "cpu"
    args.train_file = args.train_file or str(MULTI30K / "train")
    args.validation_file = args.validation_file or str(MULTI30K / "val")
    args.test = args.test or [str(MULTI30K / "test_2016_flickr")]
    args.runs_dir = Path(args.runs_dir or ROOT / "runs/quality")
    for key in ("max_steps", "max_tokens_per_step", "marian_warmup"):
        if getattr(args, key) < 1:
            raise SystemExit(f"--{key} must be a positive integer, got {getattr(args, key)}")
    if not (math.isfinite(args.marian_peak_lr) and args.marian_peak_lr > 0):
        raise SystemExit(f"--marian_peak_lr must be a positive number, got {args.marian_peak_lr}")
    if args.p_drop is not None and not 0 <= args.p_drop < 1:
        raise SystemExit(f"--p_drop must be in [0, 1), got {args.p_drop}")
    args.average = [parse_window(w) for w in args.average]
    if args.max_test_samples is not None and args.max_test_samples < 1:
        raise SystemExit(f"--max_test_samples must be a positive integer, got {args.max_test_samples}")
    if not args.train_only:
        check_tests(args)
    return args


def model_config_file(args: argparse.Namespace, recipe: dict[str, Any]) -> str:
    """The preset to train: --model_config or the recipe's, with --p_drop written into a copy in the runs folder."""
    path = Path(args.model_config or ROOT / recipe["model_config"])
    if args.p_drop is None:
        return str(path)
    fields = json.loads(path.read_text())
    fields["p_drop"] = args.p_drop
    copy = args.runs_dir / f"{path.stem}-p_drop{args.p_drop:g}.json"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(json.dumps(fields, indent=2))
    return str(copy)


def marian_lr_scale(peak: float, warmup: int, d_model: int) -> float:
    """The §5.3 lr_scale whose curve is fairseq's inverse_sqrt with this peak and warmup: the §5.3 formula peaks at
    d_model^-0.5 · warmup^-0.5 at step = warmup, rising linearly before and falling as step^-0.5 after."""
    return peak * math.sqrt(d_model * warmup)


def system_settings(args: argparse.Namespace, system: str, out: Path) -> dict[str, Any]:
    """training/train.py's settings for `system` (its parser and checks), the budget and seed set for all."""
    from training.train import parse_settings, read_recipe

    recipe = read_recipe(args.recipe)
    argv = ["--recipe", args.recipe, "--output_dir", str(out), "--train_file", args.train_file,
            "--validation_file", args.validation_file, "--source_lang", args.source_lang,
            "--target_lang", args.target_lang, "--max_steps", str(args.max_steps),
            "--max_tokens_per_step", str(args.max_tokens_per_step), "--seed", str(args.seed),
            "--model_config", model_config_file(args, recipe)]  # fmt: skip
    for key in ("vocab_size", "max_length", "warmup_steps", "save_steps", "save_total_limit", "eval_steps",
                "logging_steps", "max_eval_samples"):  # fmt: skip
        if getattr(args, key) is not None:
            argv += [f"--{key}", str(getattr(args, key))]
    if args.bf16:
        argv.append("--bf16")
    if args.device:
        argv += ["--device", args.device]
    s = parse_settings(argv)
    d_model = json.loads(Path(s["model_config"]).read_text())["d_model"]
    if system != "ours":
        s["warmup_steps"] = args.marian_warmup
        s["lr_scale"] = marian_lr_scale(args.marian_peak_lr, args.marian_warmup, d_model)
    s["peak_lr"] = s["lr_scale"] * (d_model * s["warmup_steps"]) ** -0.5
    return s


# ---- the Marian twin under Trainer ----


def marian_classes():
    """(MarianDefaults, TwinTrainer), built on first use so that --help needs neither torch nor transformers."""
    from transformers import MarianMTModel, Seq2SeqTrainer
    from transformers.trainer_pt_utils import LabelSmoother

    from training.trainer.trainer import VaswaniTrainer

    class MarianDefaults(MarianMTModel):
        """MarianMTModel whose generate() stops at the batch's longest source + 50 new tokens unless told a limit
        (the reference's "max length source + 50"; transformers has no per-sentence limit)."""

        def generate(self, input_ids=None, **kwargs):
            if input_ids is not None and not {"max_new_tokens", "max_length"} & set(kwargs):
                kwargs["max_new_tokens"] = input_ids.shape[1] + 50
            return super().generate(input_ids=input_ids, **kwargs)

    class TwinTrainer(VaswaniTrainer):
        """VaswaniTrainer (the same batches, schedule, checkpoints and token counts) for the Marian twin: ε_ls goes
        through Trainer's own LabelSmoother, as Marian's loss is plain cross-entropy."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            eps = self.args.label_smoothing_factor
            self.label_smoother = LabelSmoother(epsilon=eps) if eps else None

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if model.training:
                self.count_tokens(inputs)
            return Seq2SeqTrainer.compute_loss(
                self, model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )

    return MarianDefaults, TwinTrainer


def marian_twin_of(ours, tokenizer):
    """The twin of `ours` with its weights (Marian's own sinusoid tables kept) and the reference's decoding."""
    from transformers import GenerationConfig

    from benchmarks.twins import copy_weights, marian_twin_config

    MarianDefaults, _ = marian_classes()
    twin = MarianDefaults(marian_twin_config(ours.config))
    own = {k: v.clone() for k, v in twin.state_dict().items() if "embed_positions" in k}
    copy_weights(ours, twin)
    twin.load_state_dict(own, strict=False)
    twin.generation_config = GenerationConfig(
        num_beams=4,
        length_penalty=0.6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        decoder_start_token_id=ours.config.decoder_start_token_id,
    )
    return twin.to(ours.device).train(ours.training)


def twin_trainer(trainer, tokenizer):
    """A TwinTrainer on the twin of `trainer`'s model, with everything else of `trainer` (arguments, data,
    metrics, token budget, schedule, callbacks)."""
    from transformers import DataCollatorForSeq2Seq
    from transformers.trainer_callback import ProgressCallback

    from training.trainer.build import rounded_progress_callback

    _, TwinTrainer = marian_classes()
    twin = marian_twin_of(trainer.model, tokenizer)
    twin_trainer = TwinTrainer(
        model=twin,
        args=trainer.args,
        train_dataset=trainer.train_dataset,
        eval_dataset=trainer.eval_dataset,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=twin, label_pad_token_id=-100),
        processing_class=tokenizer,
        compute_metrics=trainer.compute_metrics,
        max_tokens=trainer.max_tokens,
        d_model=trainer.d_model,
        warmup_steps=trainer.warmup_steps,
    )
    twin_trainer.remove_callback(ProgressCallback)
    twin_trainer.add_callback(rounded_progress_callback())
    return twin_trainer


# ---- training ----


def shared_tokenizer(args: argparse.Namespace, s: dict[str, Any], raw) -> Path:
    """The one BPE every system uses, trained once into runs_dir/tokenizer."""
    from training.data.tokenizer import train_tokenizer_for

    folder = args.runs_dir / "tokenizer"
    if not (folder / "tokenizer.json").is_file():
        train_tokenizer_for(raw, args.source_lang, args.target_lang, s["vocab_size"]).save_pretrained(folder)
    return folder


def comparable(s: dict[str, Any]) -> dict[str, Any]:
    """The settings that decide a run (a complete run of other settings is not reused)."""
    drop = ("output_dir", "device", "use_cpu", "overwrite_output_dir", "resume", "debug", "dataloader_num_workers")
    return json.loads(json.dumps({k: v for k, v in s.items() if k not in drop}, default=str))


FILE_SETTINGS = ("recipe", "model_config")  # settings that name a file: a run is decided by what it says
# settings that decide which checkpoints are on disk, not the weights trained: recorded, not compared
SAVING = ("save_steps", "save_total_limit")


def same_settings(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two runs' `comparable` settings are the same run: equal, except that a setting naming a file
    (FILE_SETTINGS) compares the file's content where it can be read, so a run stays reusable from another checkout
    (a run made from one worktree and reported from another), and that what only decides the checkpoints kept
    (SAVING, in the settings or the recipe; a recipe's "_comment") is not compared: a run that kept more checkpoints
    is the same run (tests/test_quality.py)."""

    def content(s: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in s.items() if k not in SAVING}
        for key in FILE_SETTINGS:
            path = Path(str(out.get(key, "")))
            if path.is_file():
                fields = json.loads(path.read_text())
                out[key] = {k: v for k, v in fields.items() if k not in SAVING and not k.startswith("_")}
        return out

    return a == b or content(a) == content(b)


def progress_callback(trainer, path: Path, base: dict[str, float]):
    """A TrainerCallback that, after each checkpoint save, writes the trainer's token counts and training time up to
    that step into `path` (step -> progress), so that a run continued from the checkpoint carries them on. Trainer
    keeps the step, optimizer, schedule, RNG and log history in the checkpoint, but not these counters
    (VaswaniTrainer counts on the device) nor the time spent in earlier sittings."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.wall, self.cpu = time.perf_counter(), time.process_time()

        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                done = json.loads(path.read_text()) if path.is_file() else {}
                done[str(state.global_step)] = progress_so_far(trainer, base, self.wall, self.cpu)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(done, indent=1))
                tmp.replace(path)  # never half a file

    return Progress()


NO_PROGRESS = {"tokens_seen": 0, "padded_tokens_seen": 0, "train_wall_seconds": 0.0, "train_cpu_seconds": 0.0,
               "sittings": 0}  # fmt: skip


def progress_so_far(trainer, base: dict[str, float], wall: float, cpu: float) -> dict[str, float]:
    """Token counts and training time from the run's start (earlier sittings' `base` + this one's)."""
    return {
        "tokens_seen": base["tokens_seen"] + int(trainer.tokens_seen.item()),
        "padded_tokens_seen": base["padded_tokens_seen"] + int(trainer.padded_tokens_seen.item()),
        "train_wall_seconds": round(base["train_wall_seconds"] + time.perf_counter() - wall, 1),
        "train_cpu_seconds": round(base["train_cpu_seconds"] + time.process_time() - cpu, 1),
        "sittings": base["sittings"] + 1,
    }


def continue_from(out: Path, settings: dict[str, Any]) -> tuple[Path | None, dict[str, float]]:
    """(checkpoint, progress up to it) of an unfinished run of these settings in `out`, or (None, zeros)."""
    from training.checkpoints.complete import find_resumable

    started = out / RUN_SETTINGS
    if not started.is_file() or not same_settings(json.loads(started.read_text()), settings):
        return None, NO_PROGRESS
    checkpoint, _ = find_resumable(out)
    progress = json.loads((out / RUN_PROGRESS).read_text()) if (out / RUN_PROGRESS).is_file() else {}
    step = checkpoint.name.split("-")[-1] if checkpoint else None
    if checkpoint is None or step not in progress:
        return None, NO_PROGRESS
    return checkpoint, progress[step]


def train_system(system: str, s: dict[str, Any], raw, tokenizer_dir: Path, args: argparse.Namespace) -> dict:
    """Train `system` in runs_dir/<system> (unless a complete run of these settings is there; an unfinished one
    continues from its newest complete checkpoint) and return its record: steps, tokens seen, times, the
    validation curve."""
    out = args.runs_dir / system
    record_path = out / RUN_RECORD
    settings = comparable(s)
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if same_settings(record["settings"], settings):
            print(f"{system}: complete run in {out}, not trained again", flush=True)
            return record
    checkpoint, base = continue_from(out, settings) if not record_path.is_file() else (None, None)
    if checkpoint is None and out.exists() and any(out.iterdir()):
        if not args.overwrite:
            raise SystemExit(
                f"{out} holds a run of other settings (or an unfinished one without a complete checkpoint): pass "
                "--overwrite to replace it, or another --runs_dir"
            )
        shutil.rmtree(out)
    from accelerate import PartialState

    from training.checkpoints.complete import find_resumable, move_aside
    from training.trainer.build import build_trainer, select_device

    use_cpu = select_device(s)
    state = PartialState(cpu=use_cpu)
    if checkpoint is None:
        out.mkdir(parents=True, exist_ok=True)
        shutil.copytree(tokenizer_dir, out / "tokenizer")  # build_trainer uses it instead of training its own
        (out / RUN_SETTINGS).write_text(json.dumps(settings, indent=2))
    else:
        _, rejected = find_resumable(out)
        for problems in rejected:  # newer than the checkpoint continued from: never overwritten
            print(f"{problems.folder.name}: {problems.describe()}; moved aside to "
                  f"{move_aside(problems.folder, problems.kind).name}", flush=True)  # fmt: skip
    trainer, _, tokenizer, drop_stats, signatures = build_trainer(s, state, raw, out, use_cpu, checkpoint)
    if system == "marian":
        trainer = twin_trainer(trainer, tokenizer)
    trainer.add_callback(progress_callback(trainer, out / RUN_PROGRESS, base))
    sitting = f"continuing from {checkpoint.name}" if checkpoint else "from the start"
    print(f"{system}: training {s['max_steps']} steps ({sitting}), peak lr {s['peak_lr']:.3g}, in {out}", flush=True)
    wall, cpu = time.perf_counter(), time.process_time()
    result = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    progress = progress_so_far(trainer, base, wall, cpu)
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    history = trainer.state.log_history
    record = {
        "system": system,
        "steps": trainer.state.global_step,
        "tokens_seen": progress["tokens_seen"],
        "padded_tokens_seen": progress["padded_tokens_seen"],
        # Trainer's train_runtime of this sitting plus the earlier sittings' time in trainer.train
        "train_seconds": round(base["train_wall_seconds"] + result.metrics["train_runtime"], 1),
        "train_wall_seconds": progress["train_wall_seconds"],
        "train_cpu_seconds": progress["train_cpu_seconds"],  # CPU time of the process: not counting pauses
        "sittings": progress["sittings"],
        "final_train_loss": result.metrics.get("train_loss"),
        "val_curve": [[r["step"], r["eval_bleu"]] for r in history if "eval_bleu" in r],
        "val_loss_curve": [[r["step"], r["eval_loss"]] for r in history if "eval_loss" in r],
        "lr_curve": [[r["step"], r["learning_rate"]] for r in history if "learning_rate" in r],
        "train_loss_curve": [[r["step"], r["loss"]] for r in history if "loss" in r],
        "signatures": signatures,
        "dropped_pairs": drop_stats,
        "parameters": sum(p.numel() for p in model.parameters()),
        "settings": settings,
    }
    record_path.write_text(json.dumps(record, indent=2))
    return record


# ---- decoding ----


def averaged_model(system: str, run: Path, window: tuple[int, int], device: str):
    """(model, tokenizer) averaging the run's checkpoints of `window` (window_steps), or None when one is missing.
    Ours goes through `python -m training.average` (a model folder, written once); the twin's checkpoints lack the
    position tables Marian recomputes, which that command's folder check refuses, so its average is loaded in memory
    from the same `average_checkpoints`."""
    from training.checkpoints.averaging import average_checkpoints, checkpoint_step
    from training.checkpoints.complete import complete_checkpoints

    done = {checkpoint_step(p): p for p in complete_checkpoints(run)}
    steps = window_steps(sorted(done), *window)
    if steps is None:
        print(f"{system}: its checkpoints (steps {sorted(done)}) lack some of the {window_name(*window)}: no average",
              flush=True)  # fmt: skip
        return None
    chosen = [done[s] for s in steps]
    if system == "marian":
        model, tokenizer = load_for_decoding(system, chosen[-1], device)
        averaged = average_checkpoints(chosen, progress=False)
        missing, unexpected = model.load_state_dict(averaged, strict=False)
        state = model.state_dict()
        loaded = {state[k].data_ptr() for k in averaged}  # a missing name may be a tie of a loaded tensor
        lacking = [k for k in missing if "embed_positions" not in k and state[k].data_ptr() not in loaded]
        if unexpected or lacking:
            raise RuntimeError(f"averaged twin: tensors missing {lacking}, unexpected {unexpected}")
        return model.to(device).eval(), tokenizer
    from training.average import main as average

    folder = run / f"average-last{window[0]}-every{window[1]}"
    record = folder / "averaging.json"
    if not record.is_file() or json.loads(record.read_text())["steps"] != steps:
        average(["--checkpoints", *map(str, chosen), "--output_dir", str(folder), "--overwrite", "--quiet"])
    return load_for_decoding(system, folder, device)


def load_for_decoding(system: str, folder: Path, device: str):
    """(model, tokenizer) of a model folder, each system with its own class and generation config."""
    from training.inference.translation import load_model

    if system != "marian":
        return load_model(str(folder), device)
    from transformers import AutoTokenizer

    MarianDefaults, _ = marian_classes()
    return MarianDefaults.from_pretrained(folder).to(device).eval(), AutoTokenizer.from_pretrained(folder)


def read_set(prefix: str, args: argparse.Namespace) -> tuple[list[str], list[str]]:
    from training.data.parallel import load_parallel

    part = next(
        iter(load_parallel(test_file=prefix, source_lang=args.source_lang, target_lang=args.target_lang).values())
    )
    rows = part["translation"][: args.max_test_samples] if args.max_test_samples else part["translation"]
    return [r[args.source_lang] or "" for r in rows], [r[args.target_lang] or "" for r in rows]


def decode_all(
    args: argparse.Namespace, records: dict[str, dict], settings: dict[str, dict], device: str
) -> list[dict]:
    """Every system (last checkpoint and each --average window) on the validation set and every --test set."""
    from training.evaluation.scoring import evaluate_model

    sets = {"val": read_set(args.validation_file, args)}
    for prefix in args.test:
        name = Path(prefix).name
        sets[name if name not in sets else prefix] = read_set(prefix, args)
    rows, hypotheses = [], []
    for system, record in records.items():
        run = args.runs_dir / system
        # the default window is what this command's recipe keeps (the run may have kept more: --average adds windows)
        default = (settings[system]["save_total_limit"], settings[system]["save_steps"])
        windows = [default, *(w for w in args.average if w != default)]
        for checkpoint in ["last", *windows]:
            if checkpoint == "last":
                loaded = load_for_decoding(system, run, device)
            else:
                loaded = averaged_model(system, run, checkpoint, device)
            if loaded is None:
                continue
            model, tokenizer = loaded
            # the default decoding: the last checkpoint, or the recipe's window
            is_default = checkpoint == ("last" if DEFAULT_CHECKPOINT[system] == "last" else default)
            rules = ["gnmt" if system != "marian" else "transformers"]
            if args.compare_rules and is_default and system != "marian":
                rules.append("transformers")  # our model under transformers' rule: decoding told from training
            for rule, (name, (sources, references)) in ((r, item) for r in rules for item in sets.items()):
                kwargs = {"length_penalty_rule": rule} if system != "marian" else None
                result = evaluate_model(model, tokenizer, sources, references, generate_kwargs=kwargs, progress=False)
                row = {
                    "benchmark": "quality",
                    "system": system,
                    "recipe": RECIPES[system],
                    "checkpoint": checkpoint if checkpoint == "last" else window_name(*checkpoint),
                    "default": is_default and rule == rules[0],
                    "rule": rule,  # the length penalty: "gnmt" ((5 + |Y|) / 6)^α as §6.1, "transformers" |Y|^α
                    "set": name,
                    "sentences": len(sources),
                    "bleu": round(result["bleu"], 2),
                    "chrf": round(result["chrf"], 2),
                    "signature": result["signature"],
                    "chrf_signature": result["chrf_signature"],
                    "decoding": {k: v for k, v in result["decoding"].items() if v is not None},
                    "decode_seconds": result["wall_seconds"],
                    **{k: record[k] for k in ("steps", "tokens_seen", "padded_tokens_seen", "train_seconds")},
                    "max_tokens_per_step": record["settings"]["max_tokens_per_step"],
                    "seed": record["settings"]["seed"],
                    "peak_lr": record["settings"]["peak_lr"],
                    "warmup_steps": record["settings"]["warmup_steps"],
                    "lr_scale": record["settings"]["lr_scale"],
                    "val_curve": record["val_curve"],
                    "val_loss_curve": record["val_loss_curve"],
                    "note": args.note,
                }
                print(json.dumps({k: row[k] for k in ("system", "checkpoint", "rule", "set", "bleu")}), flush=True)
                rows.append(row)
                hypotheses.append(result["hypotheses"])
                stem = slug(row["checkpoint"]) + ("" if rule == rules[0] else f"-{rule}-rule")
                write_hypotheses(run / "hypotheses" / f"{stem}.{name}.txt", result["hypotheses"])
            del model
    paired_bootstrap(rows, hypotheses, {name: references for name, (_, references) in sets.items()})
    return rows


def slug(text: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in text).split())


def write_hypotheses(path: Path, hypotheses: list[str]) -> None:
    """One line per source sentence, for sacrebleu's own command line (or another test) to score again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(h.replace("\n", " ") + "\n" for h in hypotheses), encoding="utf-8")


BOOTSTRAP_SAMPLES = 1000  # sacreBLEU's default for --paired-bs (its seed: 12345)


def paired_bootstrap(rows: list[dict], hypotheses: list[list[str]], references: dict[str, list[str]]) -> None:
    """Into every row: `ci95`, half the 95% confidence interval of its BLEU, and `p_vs_twin`, the p-value of its
    difference from the twin's default decoding on the same set, by paired bootstrap resampling (Koehn 2004) as
    `sacrebleu --paired-bs` computes it (sacrebleu.significance.PairedTest; the twin's own row gets no p-value). A
    difference with p ≥ 0.05 is within what the choice of sentences alone can make."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    for name, refs in references.items():
        at = [i for i, row in enumerate(rows) if row["set"] == name]
        twin = [i for i in at if rows[i]["system"] == "marian" and rows[i]["default"]]
        if not at:
            continue
        # PairedTest's baseline first: the twin's row, or (no twin in this report) any row, and then no p-values
        baseline = twin[0] if twin else at[0]
        order = [baseline] + [i for i in at if i != baseline]
        named = [(str(i), hypotheses[i]) for i in order]
        _, scores = PairedTest(named, {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=BOOTSTRAP_SAMPLES)()
        for k, (i, result) in enumerate(zip(order, scores["BLEU"], strict=True)):
            # the same BLEU as the row's (13a, exp smoothing): the test scored what the table shows
            if abs(result.score - rows[i]["bleu"]) > 0.01:
                raise RuntimeError(f"paired bootstrap scored {result.score:.2f}, the row {rows[i]['bleu']}")
            rows[i]["ci95"] = round(result.ci, 2)
            rows[i]["bootstrap_mean"] = round(result.mean, 2)
            if twin and k > 0:
                rows[i]["p_vs_twin"] = round(result.p_value, 4)


def hardware(device_name: str) -> dict:
    """benchmarks/common.py's environment, with the CPU's ISA flags and core count."""
    import torch

    from benchmarks.common import environment

    env = environment(torch.device(device_name.split(":")[0]))
    try:
        flags = next(
            line.split(":", 1)[1].split()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        )
        env["cpu_isa"] = [f for f in ISA_FLAGS if f in flags]
    except (OSError, StopIteration):
        env["cpu_isa"] = None
    env["cpu_cores"] = os.cpu_count()
    return env


def plot(records: dict[str, dict], path: Path, title: str) -> None:
    """Validation BLEU against steps, one line per system."""
    from benchmarks.common import pyplot, save_figure

    fig, ax = pyplot().subplots(figsize=(7, 4.5))
    for system, record in records.items():
        if record["val_curve"]:
            steps, bleu = zip(*record["val_curve"], strict=True)
            ax.plot(steps, bleu, marker="o", ms=3, label=f"{system} (peak lr {record['settings']['peak_lr']:.3g})")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("validation BLEU (each system's decoding)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(loc="lower right")
    ax.set_title(title, fontsize=9)
    save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.given = {a.split("=")[0].lstrip("-") for a in argv if a.startswith("--")}
    args = resolve(args)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from benchmarks.common import set_threads

    set_threads(args.threads)
    settings = {system: system_settings(args, system, args.runs_dir / system) for system in args.systems}
    first = settings[args.systems[0]]
    from training.data.parallel import load_parallel

    raw = load_parallel(train_file=first["train_file"], validation_file=first["validation_file"],
                        source_lang=args.source_lang, target_lang=args.target_lang)  # fmt: skip
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = shared_tokenizer(args, first, raw)
    records = {system: train_system(system, settings[system], raw, tokenizer_dir, args) for system in args.systems}
    budgets = {s: (r["steps"], r["tokens_seen"], r["padded_tokens_seen"]) for s, r in records.items()}
    if len(set(budgets.values())) != 1:
        raise SystemExit(f"the systems did not train on the same budget (steps, tokens, padded tokens): {budgets}")
    if args.train_only:
        return []

    import torch

    device = first.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    env = hardware(device)
    env["isolation"] = args.note or "not stated"
    rows = decode_all(args, records, settings, device)
    from benchmarks.common import free_path, report

    jsonl, _ = report("quality", env, rows, TABLE, args.out_dir)
    png = free_path(jsonl.parent, jsonl.stem, ".png")
    plot(records, png, f"{', '.join(records)}: {first['max_steps']} steps × {first['max_tokens_per_step']} tokens")
    print(f"plot: {png}", file=sys.stderr)
    return rows


if __name__ == "__main__":
    from training.common.errors import run_command

    run_command(main)
