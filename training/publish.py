"""Publish a model folder to the Hugging Face Hub: weights, config with `auto_map`, the code files, tokenizer,
generation config, the model card (README.md, rendered from model_card.md) and the training-curve plot.

The upload folder is built first, in full, and checked: model.safetensors (re-saved through
`save_pretrained`, tensors checked equal to the folder's), config.json with `auto_map` and `custom_pipelines`,
the `*_vaswani.py` code files of this checkout, `modeling_vaswani.code_files()` (so the Hub copy loads with
`trust_remote_code=True` where this package is not installed), generation_config.json (the folder's, unchanged),
the tokenizer (tokenizer.json, tokenizer_config.json), README.md and training_curves.png. Nothing else: no
checkpoints, no TensorBoard logs, no optimizer state, and never a pickle file (.bin, .pt, .pth, .pkl, ...).
`--dry_run` writes exactly that folder and lists it; otherwise it goes up with `HfApi.create_repo` and
`HfApi.upload_folder` (files already in the Hub repository and not in the upload stay there).

    # tiny CPU example (a few minutes on 2 cores): 8 steps with a checkpoint every 4, their average, 20 test
    # sentences greedy, then the folder that would be uploaded
    python -m training.train --max_steps 8 --save_steps 4 --max_eval_samples 20 --output_dir runs/pub-demo
    python -m training.average runs/pub-demo --last 2 --output_dir runs/pub-demo-avg
    python -m training.evaluate --model runs/pub-demo-avg --dataset_name default --max_samples 20 --num_beams 1 \\
        --output_dir runs/pub-demo-avg/eval-test
    python -m training.publish runs/pub-demo-avg --repo_id user/pub-demo --dry_run \\
        --scores test=runs/pub-demo-avg/eval-test/scores.json          # writes and lists runs/pub-demo-avg/hub-upload
    # the paper's way: average the last 5 checkpoints, score the test set with beam 4 / α 0.6, upload
    python -m training.average runs/base --last 5 --output_dir runs/base-avg5
    python -m training.evaluate --model runs/base-avg5 --dataset_name wmt14 --dataset_config de-en \\
        --output_dir runs/base-avg5/eval-newstest2014
    python -m training.publish runs/base-avg5 --repo_id user/vaswani-base-en-de --private \\
        --scores newstest2014=runs/base-avg5/eval-newstest2014/scores.json   # token: `hf auth login`, $HF_TOKEN or --token

Bad input stops before any work, with the reason: a repo id the Hub would refuse, a folder that is not a model
folder of this package (no config.json, no safetensors weights, no tokenizer, another model_type), a scores file
without BLEU, an output folder that exists (without `--overwrite`), offline mode (HF_HUB_OFFLINE) without
`--dry_run`. A Hub that cannot be reached, or that refuses the upload, is named in one line (exit status 2, as for
every bad input; `--debug` shows the traceback).
"""

# no `from __future__ import annotations`: run as __main__, the dataclass's annotations must be types (HfArgumentParser)
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import HfArgumentParser

from training.common.arguments import command_parser, parse_command
from training.common.errors import run_command
from training.common.files import output_problem
from training.hub.model_card import TEMPLATE, CardError, parse_scores_args, render_card
from training.hub.upload import (
    DEFAULT_STAGING,
    PublishError,
    build_upload_folder,
    check_model_folder,
    check_repo_id,
    hub_offline,
    list_folder,
    push,
)


@dataclass
class PublishArguments:
    repo_id: str = field(metadata={"help": "Hub model repository, 'name' or 'namespace/name'"})
    private: bool = field(default=False, metadata={"help": "create the repository as private"})
    dry_run: bool = field(default=False, metadata={"help": "write and list the upload folder; upload nothing"})
    scores: list[str] = field(
        default_factory=list,
        metadata={
            # "extend": `--scores A --scores B` (repeated, as documented) and `--scores A B` both keep A and B
            "action": "extend",
            "metavar": "NAME=PATH",
            "help": "a scores.json of training.evaluate and the name of its evaluation set, e.g. "
            "test_2016=runs/x/eval-test/scores.json; repeat for several (the card's results and model-index)",
        },
    )
    output_dir: Path | None = field(
        default=None,
        metadata={
            "help": f"where to build the upload folder (default: FOLDER/{DEFAULT_STAGING} with --dry_run, "
            "else a temporary folder removed after the upload)"
        },
    )
    overwrite: bool = field(default=False, metadata={"help": "replace an existing, non-empty --output_dir"})
    template: Path = field(default=TEMPLATE, metadata={"help": "model card template (default: model_card.md)"})
    token: str | None = field(
        default=None, metadata={"help": "Hugging Face token (default: $HF_TOKEN or the one saved by `hf auth login`)"}
    )
    commit_message: str | None = field(default=None, metadata={"help": "the upload's commit message"})


def build_parser() -> HfArgumentParser:
    parser = command_parser("python -m training.publish", __doc__, [PublishArguments])
    # FOLDER is positional, as documented (`publish FOLDER --repo_id ...`): a dataclass field can only be a --flag
    parser.add_argument("folder", type=Path, help="the model folder: a run, or an averaged model from training.average")
    return parser


def staging_dir(args: PublishArguments, folder: Path) -> Path | None:
    """The upload folder to write, checked: never the model folder or a folder holding it, never a non-empty
    folder without --overwrite. None: a temporary folder (a real upload without --output_dir)."""
    out = args.output_dir
    if out is None:
        if not args.dry_run:
            return None
        out = folder / DEFAULT_STAGING
    resolved = out.resolve()
    if resolved == folder.resolve() or resolved in folder.resolve().parents:
        raise PublishError(f"--output_dir {out} is the model folder or holds it: choose another folder")
    if problem := output_problem(out, "--output_dir", args.overwrite):
        raise PublishError(problem)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args, positional = parse_command(build_parser(), argv)
    folder = positional.folder
    try:  # every check before any work
        check_repo_id(args.repo_id)
        check_model_folder(folder)
        if not args.template.is_file():
            raise PublishError(f"--template {args.template}: no such file")
        scores = parse_scores_args(args.scores)
        if not args.dry_run and hub_offline():
            raise PublishError("HF_HUB_OFFLINE is set: nothing can be uploaded (use --dry_run to build the folder)")
        out = staging_dir(args, folder)
        card = render_card(folder, args.template, scores=scores, repo_id=args.repo_id)  # reads small files only
    except (PublishError, CardError) as error:  # one line, no usage block: the command line itself was fine
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None

    temporary = None
    if out is None:
        temporary = tempfile.TemporaryDirectory(prefix="vaswani-upload-")
        out = Path(temporary.name)
    elif out.exists():
        shutil.rmtree(out)  # empty, or --overwrite was given
    try:
        try:
            files = build_upload_folder(folder, out, card)
        except BaseException as error:
            if temporary is None:  # no half-written upload folder is left behind
                shutil.rmtree(out, ignore_errors=True)
            if isinstance(error, PublishError | CardError):
                raise SystemExit(f"publish: {error}") from error
            raise
        print(f"upload folder {out}:\n{list_folder(out, files)}", flush=True)
        result: dict[str, Any] = {"folder": out, "files": [p.relative_to(out) for p in files], "url": None}
        if args.dry_run:
            visibility = "private" if args.private else "public"
            print(f"dry run: nothing uploaded; without --dry_run this goes to {args.repo_id} ({visibility})")
        else:
            message = args.commit_message or f"Upload {folder.resolve().name} with training.publish"
            try:
                result["url"] = push(out, args.repo_id, args.private, args.token, message)
            except PublishError as error:
                raise SystemExit(f"publish: {error}") from error
            print(f"uploaded to https://huggingface.co/{args.repo_id}: {result['url']}")
        sys.stdout.flush()
        return result
    finally:
        if temporary is not None:
            temporary.cleanup()


if __name__ == "__main__":
    run_command(main)
