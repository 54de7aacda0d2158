"""Train the Transformer with the paper's recipe (§5) on transformers' Seq2SeqTrainer and Accelerate.

The main command of the README, the tiny preset on the offline default corpus (10–13 minutes on 2 CPU cores):

    python -m training.train --output_dir runs/tiny

Then it prints validation BLEU, saves the model folder (safetensors, tokenizer, generation config, the
training-curve PNG, run_summary.json), reloads it with AutoModelForSeq2SeqLM/AutoTokenizer and translates examples.

    # the paper's base recipe on WMT'14 from the Hub, 8 GPUs (DDP), bf16
    accelerate launch --config_file configuration/accelerate_multi_gpu.yaml -m training.train \\
        --recipe configuration/recipe_base.json --dataset_name wmt14 --dataset_config de-en \\
        --source_lang en --target_lang de --bf16 --output_dir runs/base
    # Multi30k from local Moses-style files
    python -m training.train --recipe configuration/recipe_small.json --source_lang en --target_lang de \\
        --train_file ../shared/data/multi30k/train --validation_file ../shared/data/multi30k/val \\
        --test_file ../shared/data/multi30k/test_2016_flickr --output_dir runs/multi30k
    # continue a killed run from its newest complete checkpoint
    python -m training.train --output_dir runs/tiny --resume
    # two CPU processes (gloo DDP), as the DDP test runs it
    torchrun --nproc_per_node 2 -m training.train --max_steps 20 --output_dir runs/ddp

A recipe JSON (configuration/recipe_*.json) gives the defaults; every flag below overrides it, and its help shows
the recipe's value. A true/false flag alone means true: `--bf16` switches bf16 on, `--bf16 false` off. Recipe keys
and flags take Seq2SeqTrainingArguments' names where it has the setting (`label_smoothing_factor`,
`dataloader_num_workers`); the earlier `label_smoothing` and `num_workers` still work. Everything is checked before
the tokenizer trains (settings, recipe, model configuration, data files, output folder); a bad input ends with one
line `error: ...` and exit status 2 (`--debug`: the traceback), and a run that fails before training starts leaves
the output folder as it found it. `--resume` takes the newest checkpoint whose files are all present and intact
(training/checkpoints/complete.py) and moves newer, damaged ones aside.
"""

# Only the standard library and our light modules at import time: the arguments are parsed (and `--help` answered)
# before torch, datasets and accelerate load, which takes seconds; transformers loads for HfArgumentParser alone
# (tests/test_cli_errors.py).
import argparse
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from transformers import HfArgumentParser

from training.checkpoints.complete import move_aside
from training.common.arguments import command_parser, parse_command
from training.common.checks import language_problem, positive_integer_problem
from training.common.errors import problems_message, run_command
from training.common.files import follow_umask, project_file
from training.data.prepare import describe_data, load_data, micro_batch_tokens
from training.trainer.build import build_trainer, first_step_callback, select_device
from training.trainer.run_folder import OutputFolder, check_output_dir

DEFAULT_RECIPE = "configuration/recipe_tiny.json"
DEVICE_RE = re.compile(r"^(cpu|cuda|cuda:\d+)$")
EXAMPLES = {"en": ["I bought forty-five books on Monday.", "on March 5, 2021", "three hundred forty-two apples"]}


def arg(help: str, default: Any = None, *aliases: str) -> Any:
    """A dataclass field as HfArgumentParser reads it: its help, default and other flag names."""
    return field(default=default, metadata={"help": help, **({"aliases": list(aliases)} if aliases else {})})


# The settings of a run, one flag each (HfArgumentParser), and the keys of a recipe JSON. A name that
# Seq2SeqTrainingArguments has means the same there and is handed to it under that name
# (training/trainer/build.py, TRAINING_ARGUMENTS; tests/test_train_script.py checks the names). A field's default
# here applies when the recipe does not set it; None means "not set" (the library's default).
@dataclass
class RunArguments:
    output_dir: str = field(metadata={"help": "run folder: checkpoints, logs, and at the end the model folder"})
    recipe: str = arg("training recipe JSON whose values are the defaults of all flags", DEFAULT_RECIPE)
    model_config: str | None = arg("model configuration JSON (configuration/base.json, big.json, tiny.json...)")
    overwrite_output_dir: bool = arg("delete an existing, non-empty output_dir first", False)
    resume: bool = arg("continue from the newest complete checkpoint in output_dir", False)


@dataclass
class DataArguments:
    _argument_group_name = "data"
    dataset_name: str | None = arg('"default" (the offline corpus) or a Hub translation dataset, e.g. wmt14')
    dataset_config: str | None = arg("the Hub dataset's configuration, e.g. de-en")
    train_file: str | None = arg("local training data: .jsonl, .tsv, or a Moses prefix (path/train)")
    validation_file: str | None = arg("local validation data, same formats")
    test_file: str | None = arg("local test data, same formats")
    source_lang: str = arg("source language key", "en")
    target_lang: str = arg("target language key", "de")
    vocab_size: int | None = arg("size of the shared BPE vocabulary to train (§5.1: 37,000)")
    max_length: int | None = arg("pairs with more tokens on either side are dropped (counted)")
    max_train_samples: int | None = arg("train on the first N training pairs only")
    max_eval_samples: int | None = arg("validate on the first N validation pairs only")
    num_proc: int | None = arg(
        "processes that tokenize (datasets.map); default: one per available core from 50,000 pairs on, else 1"
    )
    streaming: bool = arg(
        "read the training data as a stream (datasets.IterableDataset), tokenized on the fly in chunks: for "
        "corpora larger than RAM or disk cache (training/data/streaming.py)",
        False,
    )
    stream_chunk_pairs: int | None = arg("--streaming: pairs per length-sorted chunk (default 100,000)")
    bpe_max_pairs: int | None = arg(
        "the shared BPE learns from a random sample of this many training pairs when there are more "
        "(default 1,000,000; logged and recorded in run_summary.json)"
    )


@dataclass
class OptimisationArguments:
    _argument_group_name = "optimisation (§5.2, §5.3)"
    max_steps: int | None = arg("optimizer steps (paper: 100,000)")
    max_tokens_per_step: int | None = arg("source (and target) tokens per optimizer step, all devices")
    gradient_accumulation_steps: int = arg("micro-batches per optimizer step", 1)
    warmup_steps: int | None = arg("warmup_steps of the schedule (paper: 4,000)")
    lr_scale: float = arg("multiplier on d_model^-0.5·min(step^-0.5, step·warmup^-1.5)", 1.0)
    adam_beta1: float = arg("Adam's β1 (paper: 0.9)", 0.9)
    adam_beta2: float = arg("Adam's β2 (paper: 0.98)", 0.98)
    adam_epsilon: float = arg("Adam's ε (paper: 1e-9)", 1e-9)
    label_smoothing_factor: float = arg("ε_ls (paper: 0.1)", 0.1, "--label_smoothing")
    max_grad_norm: float = arg("gradient clipping; 0 disables it (the paper does not clip)", 0.0)
    bf16: bool = arg("bfloat16 mixed precision", False)
    fp16: bool = arg("float16 mixed precision with loss scaling", False)
    seed: int = arg("seed for weights, dropout and batch order", 0)
    device: str | None = arg(
        "cpu, cuda or cuda:N (default: cuda if a GPU is visible, else cpu); under a launcher each process takes "
        "its own GPU"
    )
    use_cpu: bool = arg("the same as --device cpu", False)
    fused_loss: bool = arg(
        "the chunked fused training loss, without whole (tokens × vocab) logits (config.fused_loss); "
        "--no_fused_loss (or --fused_loss false) computes the logits whole",
        True,
    )


@dataclass
class LoggingArguments:
    _argument_group_name = "logging and checkpoints"
    logging_steps: int = arg("log loss, NLL and learning rate every N steps", 50)
    eval_steps: int | None = arg("validate (loss and BLEU with the paper's decoding) every N steps")
    save_steps: int = arg("checkpoint every N steps", 500)
    save_total_limit: int = arg("keep the last N checkpoints (paper averages 5)", 5)
    dataloader_num_workers: int = arg("data loader worker processes", 0, "--num_workers")


ARGUMENT_CLASSES = (RunArguments, DataArguments, OptimisationArguments, LoggingArguments)
# recipe keys of earlier versions, read under today's names (their flags stay as aliases, above)
RENAMED_KEYS = {"label_smoothing": "label_smoothing_factor", "num_workers": "dataloader_num_workers"}
NEGATED_KEYS = {"no_fused_loss": "fused_loss"}  # the flag's earlier form, `true` meaning fused_loss false
POSITIVE_INTEGERS = ("vocab_size", "max_length", "max_train_samples", "max_eval_samples", "num_proc",
                     "stream_chunk_pairs", "bpe_max_pairs", "max_steps", "max_tokens_per_step",
                     "gradient_accumulation_steps", "warmup_steps", "logging_steps", "eval_steps", "save_steps",
                     "save_total_limit")  # fmt: skip
REQUIRED = ("max_steps", "max_tokens_per_step", "warmup_steps", "max_length", "vocab_size")  # recipe or flag
DATA_SOURCE = {"dataset_name": ("dataset_name", "dataset_config"),
               "train_file": ("train_file", "validation_file", "test_file")}  # fmt: skip


@dataclass
class FirstLook:
    """What the defaults depend on, read before the full command line: the recipe, and the data source given."""

    recipe: str = DEFAULT_RECIPE
    dataset_name: str | None = None
    train_file: str | None = None


def setting_types() -> dict[str, type]:
    """Each setting's type (int, float, bool or str), in the order of --help."""
    types = {}
    for cls in ARGUMENT_CLASSES:
        hints = get_type_hints(cls)
        for f in fields(cls):
            types[f.name] = next(t for t in getattr(hints[f.name], "__args__", (hints[f.name],)) if t is not type(None))
    return types


def type_problems(settings: dict[str, Any]) -> list[str]:
    """Settings of the wrong JSON type (a command-line value was converted by the parser already)."""
    kinds = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    problems = []
    for name, kind in setting_types().items():
        value = settings.get(name)
        if value is None:
            continue
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, int | float if kind is float else kind):
            wrong = f"{name} must be {kinds[kind]}, got {value!r}"
            problems.append(positive_integer_problem(name, value) if name in POSITIVE_INTEGERS else wrong)
    return problems


def read_recipe(path: str | os.PathLike) -> dict[str, Any]:
    """The recipe's settings (keys starting with "_" are comments); SystemExit naming the file if it is unusable."""
    path = project_file(path)  # as given, else the checkout's or the installed copy (configuration/...)
    if not path.is_file():
        raise SystemExit(f"--recipe {path}: no such file")
    try:
        recipe = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SystemExit(f"--recipe {path}: not valid JSON ({e})") from None
    if not isinstance(recipe, dict):
        raise SystemExit(f"--recipe {path}: expected a JSON object of settings, got {type(recipe).__name__}")
    return {k: v for k, v in recipe.items() if not k.startswith("_")}


def recipe_defaults(path: str | os.PathLike) -> dict[str, Any]:
    """The recipe's settings under today's names (RENAMED_KEYS, NEGATED_KEYS), each known and of its type;
    SystemExit naming the file and the keys otherwise (tests/test_cli_errors.py)."""
    recipe, settings = read_recipe(path), {}
    unknown = [k for k in recipe if RENAMED_KEYS.get(k, k) not in setting_types() and k not in NEGATED_KEYS]
    if unknown:
        raise SystemExit(f"--recipe {path}: unknown setting(s) {unknown} (every flag of --help can be set)")
    for key, value in recipe.items():
        name = RENAMED_KEYS.get(key) or NEGATED_KEYS.get(key) or key
        if name in settings:
            raise SystemExit(f"--recipe {path}: {key} and {name} are the same setting; keep {name}")
        settings[name] = (not value if isinstance(value, bool) else value) if key in NEGATED_KEYS else value
    problems = type_problems(settings)
    if problems:
        raise SystemExit(problems_message(f"--recipe {path}: bad settings", problems))
    return settings


def _shown(value: Any) -> str:
    text = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
    return text.replace("%", "%%")  # argparse formats help strings with %


def build_parser(recipe: str | os.PathLike = DEFAULT_RECIPE, defaults: dict[str, Any] | None = None):
    """The command line (HfArgumentParser over ARGUMENT_CLASSES) with the recipe's values as its defaults; each
    flag's help ends with its default and, if the recipe gives it, the recipe's name. A true/false flag alone means
    true, and `--bf16 false` switches off what a recipe switched on."""
    if defaults is None:
        try:
            defaults = recipe_defaults(recipe)
        except SystemExit:  # reported by parse_settings; --help still works
            defaults = {}
    parser = command_parser("python -m training.train", __doc__, ARGUMENT_CLASSES)
    parser.allow_abbrev = False  # `--rec` must not pass for --recipe here and for nothing in parse_settings' first look
    parser.set_defaults(**defaults)
    for action in parser._actions:
        if action.option_strings[0] == f"--no_{action.dest}":  # HfArgumentParser's complement of a true default:
            action.help = argparse.SUPPRESS  # named in the flag's own help
        elif action.dest in defaults:
            action.help += f" [default: {_shown(defaults[action.dest])}, from {Path(recipe).name}]"
        elif not any(action.default is no_default for no_default in (None, False, argparse.SUPPRESS)):
            action.help += f" [default: {_shown(action.default)}]"
    return parser


def parse_settings(argv: list[str] | None = None) -> dict[str, Any]:
    """The run's settings: the recipe's values, overridden by the flags given, then checked (check_settings).

    A data source on the command line replaces the recipe's other one: `--train_file` drops the recipe's
    dataset_name and dataset_config, `--dataset_name` its files (tests/test_train_script.py)."""
    first = HfArgumentParser(FirstLook, add_help=False, allow_abbrev=False)
    given = first.parse_known_args(argv)[0]
    try:
        defaults, recipe_error = recipe_defaults(given.recipe), None
    except SystemExit as e:  # after --help and the command line's own errors
        defaults, recipe_error = {}, e
    for flag, other in (("train_file", "dataset_name"), ("dataset_name", "train_file")):
        if getattr(given, flag) is not None and getattr(given, other) is None:
            for key in DATA_SOURCE[other]:
                defaults.pop(key, None)
    parser = build_parser(given.recipe, defaults)
    *groups, _ = parse_command(parser, argv)
    if recipe_error is not None:
        raise recipe_error
    return check_settings({k: v for group in groups for k, v in asdict(group).items() if v is not None})


def check_settings(s: dict[str, Any]) -> dict[str, Any]:
    """Contradictions and bad numbers, found before any work starts: the numbers, the device and the model
    configuration (tests/test_train_script.py, tests/test_cli_errors.py)."""
    s.setdefault("dataset_name", None if s.get("train_file") else "default")
    problems = [p for k in POSITIVE_INTEGERS if (k in REQUIRED or s.get(k) is not None)
                and (p := positive_integer_problem(k, s.get(k)))]  # fmt: skip
    if problems:  # the checks below compare numbers
        raise SystemExit(problems_message("bad settings", problems))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_micro_step = micro_batch_tokens(s, world)
    if per_micro_step < s["max_length"]:
        problems.append(
            f"max_tokens_per_step {s['max_tokens_per_step']} over {world} process(es) x "
            f"{s['gradient_accumulation_steps']} accumulation step(s) gives {per_micro_step} tokens per micro-batch, "
            f"less than max_length {s['max_length']}: a sentence that long would not fit"
        )
    if not 0 <= s["label_smoothing_factor"] < 1:
        problems.append(f"label_smoothing_factor must be in [0, 1), got {s['label_smoothing_factor']}")
    if s.get("bf16") and s.get("fp16"):
        problems.append("choose one of --bf16 and --fp16")
    if problem := language_problem(s["source_lang"], s["target_lang"], prefix=""):
        problems.append(problem)
    if s.get("dataset_name") and s.get("train_file"):
        problems.append("give either --dataset_name or --train_file, not both")
    if s.get("streaming"):
        if s.get("dataset_name") == "default":
            problems.append("--streaming reads files or a Hub dataset; the default corpus is generated in memory")
        if s["dataloader_num_workers"]:
            problems.append("--streaming tokenizes in the training process: --dataloader_num_workers must be 0")
        if s.get("max_train_samples"):
            problems.append("--max_train_samples needs the map-style path (a stream has no first N to select)")
    if s.get("use_cpu"):
        if s.get("device", "cpu") != "cpu":
            problems.append(f"--use_cpu contradicts --device {s['device']}")
        s["device"] = "cpu"
    if s.get("device") is not None and not DEVICE_RE.match(str(s["device"])):
        problems.append(f"device must be cpu, cuda or cuda:N, got {s['device']!r}")
    elif str(s.get("device")).startswith("cuda:") and world > 1:
        problems.append(f"--device {s['device']} picks one GPU, but {world} processes each take their own")
    if isinstance(s.get("model_config"), str):  # as given, else the checkout's or the installed configuration/
        s["model_config"] = str(project_file(s["model_config"]))
    if not Path(s.get("model_config", "")).is_file():
        problems.append(f"model_config {s.get('model_config')!r}: no such file")
    else:
        problems += model_config_problems(Path(s["model_config"]))
    if problems:
        raise SystemExit(problems_message("bad settings", problems))
    return s


def model_config_problems(path: Path) -> list[str]:
    """Whether `path` holds a model configuration this package can build (types, sizes, d_model % h, ...)."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return [f"model_config {path}: not valid JSON ({e})"]
    if not isinstance(config, dict):
        return [f"model_config {path}: expected a JSON object, got {type(config).__name__}"]
    if config.get("model_type", "vaswani") != "vaswani":
        return [f"model_config {path}: model_type is {config['model_type']!r}, not 'vaswani'"]
    from modeling_vaswani import VaswaniConfig

    try:
        VaswaniConfig.from_json_file(path)
    except ValueError as e:  # the config's own checks, field types included
        return [f"model_config {path}: {e}"]
    return []


def main(argv: list[str] | None = None) -> dict[str, Any]:
    s = parse_settings(argv)
    use_cpu = select_device(s)
    checkpoint, rejected = check_output_dir(s)
    from accelerate import PartialState

    # No GPU: run on the CPU, and several processes (torchrun / mpirun) then form a gloo process group.
    state = PartialState(cpu=use_cpu)
    out = Path(s["output_dir"])
    src = s["source_lang"]
    started = time.time()

    loading = time.perf_counter()
    with state.main_process_first():  # the main process converts the files to Arrow; the others map that file
        raw = load_data(s)
    load_seconds = round(time.perf_counter() - loading, 2)
    empty = [split for split, part in raw.items() if hasattr(part, "__len__") and len(part) == 0]
    if empty:
        raise SystemExit(f"no pairs in the {', '.join(empty)} split(s) of {describe_data(s, empty)}")
    folder = OutputFolder(out, bool(s.get("overwrite_output_dir")), state.is_main_process)
    state.wait_for_everyone()
    try:
        built = build_trainer(s, state, raw, out, use_cpu, checkpoint, load_seconds)
        trainer, data, tokenizer, drop_stats, signatures = built
    except BaseException:
        folder.failed()
        raise
    folder.started()
    first_step = first_step_callback(started, trainer)
    trainer.add_callback(first_step)
    if state.is_main_process:
        for problems in rejected:  # newer than the checkpoint resumed from: never resumed from, never overwritten
            aside = move_aside(problems.folder, problems.kind)
            print(f"{problems.folder.name}: {problems.describe()}; moved aside to {aside.name}", flush=True)
        if checkpoint is not None:
            print(f"resuming from {checkpoint}", flush=True)
    state.wait_for_everyone()
    model, training_args, world = trainer.model, trainer.args, state.num_processes

    result = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    if state.is_main_process:  # the model folder: safetensors, config, generation config, tokenizer; no pickles
        trainer.accelerator.unwrap_model(trainer.model).save_pretrained(out)
        tokenizer.save_pretrained(out)
        follow_umask(p for p in out.iterdir() if p.is_file())  # safetensors writes 0600
    final = trainer.evaluate() if "validation" in data else {}
    test_scores = {}
    if "test" in data:
        test = data["test"].remove_columns([c for c in ("src_len", "tgt_len") if c in data["test"].column_names])
        test_scores = trainer.predict(test, metric_key_prefix="test").metrics
    tokens = int(trainer.accelerator.reduce(trainer.tokens_seen, reduction="sum").item())  # all ranks
    summary = {
        "wall_seconds": round(time.time() - started, 1),
        "seconds_to_first_step": first_step.seconds,
        "train_seconds": round(result.metrics["train_runtime"], 1),
        "steps": trainer.state.global_step,
        "tokens_seen_src_plus_tgt": tokens,
        "tokens_per_second": round(tokens / max(result.metrics["train_runtime"], 1e-9)),
        # the same without the first step (which waits for the data loader's first batch): steady throughput
        "first_step_train_seconds": first_step.first_step_train_seconds,
        "steady_tokens_per_second": steady_tokens_per_second(trainer, first_step),
        "final_train_loss": result.metrics.get("train_loss"),
        "validation": {k: v for k, v in final.items() if k in ("eval_loss", "eval_bleu", "eval_chrf")},
        "signatures": signatures,
        "test": {k: v for k, v in test_scores.items() if k in ("test_loss", "test_bleu", "test_chrf")},
        "best_validation_bleu": max(
            (r["eval_bleu"] for r in trainer.state.log_history if "eval_bleu" in r), default=None
        ),
        "dropped_pairs": drop_stats,
        "data_preparation": trainer.data_preparation,
        "data_sizes": {split: len(ds) for split, ds in data.items() if hasattr(ds, "__len__")},
        "parameters": sum(p.numel() for p in model.parameters()),
        "devices": f"{world} x {training_args.device.type}",
        "settings": {k: v for k, v in s.items() if k not in ("overwrite_output_dir", "resume")},
    }
    if state.is_main_process:
        from training.trainer.plots import plot_history

        (out / "run_summary.json").write_text(json.dumps(summary, indent=2, default=str))
        plot_history(trainer.state.log_history, out / "training_curves.png", title=str(out))
        print_summary(summary, out)
        translate_examples(out, src)
    return summary


def steady_tokens_per_second(trainer, clock) -> int | None:
    """Source + target tokens per second after the first optimizer step, all processes (None after one step)."""
    if not clock.steady_seconds:
        return None
    import torch

    tokens = torch.tensor(clock.steady_tokens, device=trainer.tokens_seen.device)
    return round(int(trainer.accelerator.reduce(tokens, reduction="sum").item()) / clock.steady_seconds)


def print_summary(summary: dict[str, Any], out: Path) -> None:
    val, test = summary["validation"], summary["test"]
    lines = [
        f"run folder         {out}",
        f"steps              {summary['steps']}  ({summary['train_seconds']} s training, {summary['wall_seconds']} s all)",
        f"tokens/s           {summary['tokens_per_second']:,} (source + target, {summary['devices']})",
        f"validation BLEU    {val.get('eval_bleu', float('nan')):.2f}  chrF {val.get('eval_chrf', float('nan')):.2f}"
        f"  loss {val.get('eval_loss', float('nan')):.3f}",
        f"best val BLEU      {summary['best_validation_bleu'] or float('nan'):.2f}",
    ]
    if test:
        lines.append(f"test BLEU          {test.get('test_bleu', float('nan')):.2f}  chrF {test.get('test_chrf'):.2f}")
    lines.append(f"sacreBLEU          {summary['signatures'].get('bleu')}")
    lines.append(f"dropped pairs      {summary['dropped_pairs']}")
    lines.append(f"curves             {out / 'training_curves.png'}")
    print("\n" + "\n".join(lines), flush=True)


def translate_examples(folder: Path, source_lang: str) -> None:
    """Reload the saved folder the way a user would (the Auto classes) and translate a few inputs on the CPU, through
    the path of `evaluate` and `translate` (training/inference/translation.py) with the folder's decoding."""
    from training.inference.translation import load_model, translate_batched

    model, tokenizer = load_model(str(folder), device="cpu")
    sources = EXAMPLES.get(source_lang, ["Hello world."])
    print(f"\nreloaded {folder} with AutoModelForSeq2SeqLM + AutoTokenizer; beam 4, α = 0.6:")
    for source, hyp in zip(sources, translate_batched(model, tokenizer, sources, progress=False), strict=True):
        print(f"  {source}  →  {hyp}")
    sys.stdout.flush()


if __name__ == "__main__":
    run_command(main)
