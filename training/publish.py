"""Publish a model folder to the Hugging Face Hub: weights, config with `auto_map`, the three code files, tokenizer,
generation config, the model card (README.md, rendered from model_card.md) and the training-curve plot.

The upload folder is built first, in full, and checked: model.safetensors (re-saved through
`save_pretrained`, tensors checked equal to the folder's), config.json with `auto_map` and `custom_pipelines`,
the three `*_vaswani.py` code files of this checkout (so the Hub copy loads with
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

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from huggingface_hub import constants
from huggingface_hub.utils import HFValidationError, validate_repo_id

from training.errors import add_debug_flag, is_network_error, run_command
from training.files import follow_umask_in
from training.model_card import TEMPLATE, CardError, parse_scores_args, render_card, weight_files

if TYPE_CHECKING:  # torch and transformers load only once the arguments are parsed (a fast --help)
    from huggingface_hub import ModelCard

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy", ".npz")
CODE_FILES = ("modeling_vaswani.py", "configuration_vaswani.py", "generation_vaswani.py")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
AUTO_MAP_KEYS = ("AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM")
CURVES = "training_curves.png"
DEFAULT_STAGING = "hub-upload"


class PublishError(ValueError):
    """Input that cannot be published, or an upload folder that failed its checks; the message says which."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training.publish", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("folder", type=Path, help="the model folder: a run, or an averaged model from training.average")
    p.add_argument("--repo_id", required=True, help="Hub model repository, 'name' or 'namespace/name'")
    p.add_argument("--private", action="store_true", help="create the repository as private")
    p.add_argument("--dry_run", action="store_true", help="write and list the upload folder; upload nothing")
    p.add_argument(
        "--scores",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a scores.json of training.evaluate and the name of its evaluation set, e.g. "
        "test_2016=runs/x/eval-test/scores.json; repeat for several (the card's results and model-index)",
    )
    p.add_argument(
        "--output_dir",
        type=Path,
        help=f"where to build the upload folder (default: FOLDER/{DEFAULT_STAGING} with --dry_run, "
        "else a temporary folder removed after the upload)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing, non-empty --output_dir")
    p.add_argument("--template", type=Path, default=TEMPLATE, help="model card template (default: model_card.md)")
    p.add_argument("--token", help="Hugging Face token (default: $HF_TOKEN or the one saved by `hf auth login`)")
    p.add_argument("--commit_message", help="the upload's commit message")
    add_debug_flag(p)
    return p


def hub_offline() -> bool:
    return bool(constants.HF_HUB_OFFLINE)


def check_repo_id(repo_id: str) -> None:
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise PublishError(f"--repo_id {repo_id!r} is not a valid Hub repository id: {error}") from error


def check_model_folder(folder: Path) -> dict[str, Any]:
    """The folder holds config.json (model_type vaswani), safetensors weights and a tokenizer; returns the config."""
    if not folder.is_dir():
        raise PublishError(f"{folder}: no such folder")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise PublishError(f"{folder} is not a model folder: no config.json")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PublishError(f"{config_path} is not valid JSON: {error}") from error
    if not isinstance(config, dict) or config.get("model_type") != "vaswani":
        found = config.get("model_type") if isinstance(config, dict) else None
        raise PublishError(f"{config_path}: model_type is {found!r}, not 'vaswani': not a model of this package")
    if not weight_files(folder):
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
        hint = f" (only pickle files: {', '.join(pickles)}; these are never published)" if pickles else ""
        raise PublishError(f"{folder} is not a model folder: no model.safetensors{hint}")
    missing = [p.name for p in weight_files(folder) if not p.is_file()]
    if missing:
        raise PublishError(f"{folder}: weight shards listed in model.safetensors.index.json are missing: {missing}")
    from safetensors import SafetensorError, safe_open

    for path in weight_files(folder):
        try:
            with safe_open(path, framework="pt") as f:  # the header, and that it covers the file exactly
                list(f.keys())
        except SafetensorError as error:
            raise PublishError(f"{path}: unreadable safetensors file ({error})") from error
    from modeling_vaswani import VaswaniConfig

    try:
        VaswaniConfig.from_json_file(config_path)
    except ValueError as error:  # a field of the wrong type or value
        raise PublishError(f"{config_path}: {error}") from error
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise PublishError(f"{folder} is not a model folder: no tokenizer ({' or '.join(TOKENIZER_FILES)})")
    return config


def staging_dir(args: argparse.Namespace) -> Path | None:
    """The upload folder to write, checked: never the model folder or a folder holding it, never a non-empty
    folder without --overwrite. None: a temporary folder (a real upload without --output_dir)."""
    out = args.output_dir
    if out is None:
        if not args.dry_run:
            return None
        out = args.folder / DEFAULT_STAGING
    resolved, folder = out.resolve(), args.folder.resolve()
    if resolved == folder or resolved in folder.parents:
        raise PublishError(f"--output_dir {out} is the model folder or holds it: choose another folder")
    if out.exists() and not out.is_dir():
        raise PublishError(f"--output_dir {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise PublishError(f"--output_dir {out} exists and is not empty: pass --overwrite to replace it")
    return out


def find_pickles(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in PICKLE_SUFFIXES)


def _same_tensors(source: Path, staged: Path) -> None:
    """Every tensor of the staged weights equals the same-named tensor of the folder's weights."""
    import torch
    from safetensors import safe_open

    def tensors(folder: Path) -> dict[str, Any]:
        out = {}
        for path in weight_files(folder):
            with safe_open(path, framework="pt") as f:
                out.update({k: f.get_tensor(k) for k in f.keys()})
        return out

    original, written = tensors(source), tensors(staged)
    only = sorted(set(written) - set(original))
    if only:
        raise PublishError(f"the re-saved weights hold tensors the folder's do not: {only[:5]}")
    for key, value in written.items():
        if value.dtype != original[key].dtype or not torch.equal(value, original[key]):
            raise PublishError(f"the re-saved tensor {key} differs from the folder's")


def build_upload_folder(folder: Path, staging: Path, card: ModelCard) -> list[Path]:
    """Write the upload folder (README.md: `card`) and check it; returns its files."""
    from safetensors import SafetensorError
    from transformers import AutoTokenizer

    import modeling_vaswani

    staging.mkdir(parents=True, exist_ok=True)
    try:
        model, info = modeling_vaswani.VaswaniForConditionalGeneration.from_pretrained(
            folder, dtype="auto", output_loading_info=True
        )
    except SafetensorError as e:
        raise PublishError(f"{', '.join(map(str, weight_files(folder)))}: unreadable safetensors weights ({e})") from e
    except ValueError as e:  # a bad field of config.json
        raise PublishError(f"{folder / 'config.json'}: {e}") from e
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise PublishError(f"{folder}: the weights do not fit the config: {bad}")
    model.save_pretrained(staging)  # safetensors, config.json with auto_map + custom_pipelines, the code files
    if (folder / "generation_config.json").is_file():  # the run's decoding settings, byte for byte
        shutil.copyfile(folder / "generation_config.json", staging / "generation_config.json")
    AutoTokenizer.from_pretrained(folder).save_pretrained(staging)
    if (folder / CURVES).is_file():
        shutil.copyfile(folder / CURVES, staging / CURVES)
    card.save(staging / "README.md")
    follow_umask_in(staging)  # safetensors writes 0600
    check_upload_folder(folder, staging)
    return sorted(p for p in staging.rglob("*") if p.is_file())


def check_upload_folder(folder: Path, staging: Path) -> None:
    """What the Hub copy needs to load as remote code is there, the code is this checkout's, no pickle."""
    import modeling_vaswani

    pickles = find_pickles(staging)
    if pickles:
        raise PublishError(f"the upload folder would hold pickle files, which are never published: {pickles}")
    config = json.loads((staging / "config.json").read_text(encoding="utf-8"))
    auto_map = config.get("auto_map") or {}
    missing = [key for key in AUTO_MAP_KEYS if key not in auto_map]
    if missing:
        raise PublishError(f"{staging / 'config.json'}: auto_map lacks {missing}")
    if "translation" not in (config.get("custom_pipelines") or {}):
        raise PublishError(f"{staging / 'config.json'}: no custom_pipelines entry for 'translation'")
    package = Path(modeling_vaswani.__file__).resolve().parent
    for name in CODE_FILES:
        if not (staging / name).is_file():
            raise PublishError(f"the upload folder lacks {name}: the model would not load as remote code")
        if not filecmp.cmp(staging / name, package / name, shallow=False):
            raise PublishError(f"{staging / name} is not this checkout's {package / name}")
    if not weight_files(staging):
        raise PublishError("the upload folder lacks model.safetensors")
    for name in ("generation_config.json", "README.md", *TOKENIZER_FILES):
        if not (staging / name).is_file():
            raise PublishError(f"the upload folder lacks {name}")
    _same_tensors(folder, staging)


def list_folder(staging: Path, files: list[Path]) -> str:
    width = max(len(str(p.relative_to(staging))) for p in files)
    lines = [f"  {str(p.relative_to(staging)):<{width}}  {p.stat().st_size:>12,} bytes" for p in files]
    total = sum(p.stat().st_size for p in files)
    return "\n".join([*lines, f"  {'total':<{width}}  {total:>12,} bytes in {len(files)} files"])


def push(staging: Path, repo_id: str, private: bool, token: str | None, commit_message: str) -> str:
    """Create the repository if needed and upload the folder; returns the commit URL. PublishError in one line if
    the Hub cannot be reached or refuses (no token, no write access, ...)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(
            folder_path=str(staging), repo_id=repo_id, repo_type="model", commit_message=commit_message
        )
    except (HfHubHTTPError, LocalTokenNotFoundError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise PublishError(f"the Hub ({constants.ENDPOINT}) refused {repo_id}: {first}") from error
    except Exception as error:
        if not is_network_error(error):
            raise
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise PublishError(
            f"cannot reach the Hub at {constants.ENDPOINT} ({reason}): nothing was uploaded; check the network "
            "(the upload folder can be built offline with --dry_run)"
        ) from error
    return str(getattr(commit, "commit_url", commit))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # every check before any work
        check_repo_id(args.repo_id)
        check_model_folder(args.folder)
        if not args.template.is_file():
            raise PublishError(f"--template {args.template}: no such file")
        scores = parse_scores_args(args.scores)
        if not args.dry_run and hub_offline():
            raise PublishError("HF_HUB_OFFLINE is set: nothing can be uploaded (use --dry_run to build the folder)")
        out = staging_dir(args)
        card = render_card(args.folder, args.template, scores=scores, repo_id=args.repo_id)  # reads small files only
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
            files = build_upload_folder(args.folder, out, card)
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
            message = args.commit_message or f"Upload {args.folder.resolve().name} with training.publish"
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
