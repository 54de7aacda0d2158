"""Average the parameters of a run's last checkpoints into one model folder (§6.1: "for the base models, we used a
single model obtained by averaging the last 5 checkpoints, which were written at 10-minute intervals").

    # the paper: the last 5 complete checkpoints of a run
    python -m training.average runs/base --last 5 --output_dir runs/base-avg5
    # chosen checkpoints (of one run, or of several runs of the same model)
    python -m training.average --checkpoints runs/tiny/checkpoint-1000 runs/tiny/checkpoint-1500 \\
        --output_dir runs/tiny-avg2
    # tiny, on CPU: train 8 steps with a checkpoint every 4 (about a minute, most of it the final validation),
    # then average both (seconds)
    python -m training.train --max_steps 8 --save_steps 4 --output_dir runs/avg-demo
    python -m training.average runs/avg-demo --last 2 --output_dir runs/avg-demo-avg2

Only complete checkpoints count (those with the completion marker `checkpoint_complete.json` that training writes
last). The method, as fairseq's `scripts/average_checkpoints.py`: the element-wise mean of every floating-point
tensor over the N checkpoints, accumulated in float64 and rounded once to the stored dtype (float32 for this
project's runs), so the result is the mean rounded once (N = 1 gives the checkpoint back bit for bit). Integer and
bool tensors are not averaged: the newest checkpoint's are kept (with a warning if they differ). The embedding
matrix shared by the encoder input, decoder input and pre-softmax linear (§3.4) is stored once in
`model.safetensors`, so it is averaged once, and the averaged model keeps the three-way tie.

Before any tensor is read: every folder must be a complete checkpoint whose weights and config are intact (the
sizes and hashes its marker recorded, training/checkpoints/complete.py), the checkpoints must be of the same model
(config.json fields, `model_type` included, bookkeeping such as `transformers_version` aside), trained with the
same tokenizer (the same token for every id: averaging rows of the embedding matrix that stand for different tokens
makes a meaningless model), with identical tensor names, shapes and dtypes; each mismatch is reported with the two
checkpoints and the first difference. Any bad input ends with one line `error: ...` and exit status 2.

The output folder loads with `AutoModelForSeq2SeqLM.from_pretrained(OUT)` (or `trust_remote_code=True` without
this package): `model.safetensors`, `config.json` (with `auto_map`), the code files, `generation_config.json`
and the tokenizer of the newest checkpoint, `averaging.json` (the averaged checkpoints, their steps, the method),
and the run's `run_summary.json` and `training_curves.png` when present.
"""

# no `from __future__ import annotations`: run as __main__, the dataclass's annotations must be types (HfArgumentParser)
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from training.checkpoints.averaging import (
    CheckpointError,
    average_checkpoints,
    checkpoint_step,
    prepare_output_dir,
    run_folder_of,
    select_checkpoints,
    write_averaged_model,
)
from training.common.arguments import command_parser, parse_command
from training.common.errors import run_command


@dataclass
class AverageArguments:
    output_dir: Path = field(metadata={"help": "the averaged model folder to write"})
    last: int | None = field(
        default=None, metadata={"help": "average the newest N complete checkpoints of RUN (default 5, §6.1)"}
    )
    checkpoints: list[Path] | None = field(default=None, metadata={"help": "average these checkpoint folders instead"})
    overwrite: bool = field(default=False, metadata={"help": "replace a non-empty --output_dir"})
    quiet: bool = field(default=False, metadata={"help": "no progress bar"})


def build_parser() -> HfArgumentParser:
    parser = command_parser("python -m training.average", __doc__, [AverageArguments])
    # RUN is positional, as documented (`average RUN --last 5`): a dataclass field can only be a --flag
    parser.add_argument("run", nargs="?", type=Path, help="run folder (python -m training.train --output_dir RUN)")
    return parser


def main(argv: list[str] | None = None) -> Path:
    parser = build_parser()
    args, positional = parse_command(parser, argv)
    run = positional.run
    if args.checkpoints and args.last is not None:
        parser.error("give either --last N (with RUN) or --checkpoints, not both")
    if not args.checkpoints and run is None:
        parser.error("give a run folder (RUN, with --last N) or --checkpoints")
    try:
        folders = select_checkpoints(run, 5 if args.last is None else args.last, args.checkpoints)
        run_dir = run if run is not None else run_folder_of(folders)
        prepare_output_dir(args.output_dir, args.overwrite, [*folders, *([run_dir] if run_dir else [])])
        averaged = average_checkpoints(folders, progress=not args.quiet)
        out = write_averaged_model(folders, args.output_dir, averaged, run_dir, overwrite=args.overwrite)
    except CheckpointError as e:
        raise SystemExit(f"error: {e}") from None
    steps = ", ".join(str(checkpoint_step(f)) for f in folders)
    print(f"averaged {len(folders)} checkpoint(s) (steps {steps}) into {out}")
    return out


if __name__ == "__main__":
    run_command(main)
