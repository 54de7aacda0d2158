"""The Hub side of publishing: the upload folder (weights re-saved and compared, config with `auto_map`, the code
files, tokenizer, generation config, card, curves; never a pickle), its checks, and the upload. The command is
`python -m training.publish` (training/publish.py), whose help describes the folder.
"""

from __future__ import annotations

import filecmp
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from huggingface_hub import constants
from huggingface_hub.utils import HFValidationError, validate_repo_id

from training.common.errors import is_network_error
from training.common.files import FAST_TOKENIZER_FILES, follow_umask_in, weight_files

if TYPE_CHECKING:  # torch and transformers load only once the arguments are parsed (a fast --help)
    from huggingface_hub import ModelCard

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy", ".npz")
AUTO_MAP_KEYS = ("AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM")
CURVES = "training_curves.png"
DEFAULT_STAGING = "hub-upload"


class PublishError(ValueError):
    """Input that cannot be published, or an upload folder that failed its checks; the message says which."""


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
    if not any((folder / name).is_file() for name in FAST_TOKENIZER_FILES):
        raise PublishError(f"{folder} is not a model folder: no tokenizer ({' or '.join(FAST_TOKENIZER_FILES)})")
    return config


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
    for name in modeling_vaswani.code_files():  # modeling_vaswani.py and what it imports, as save_pretrained copies
        if not (staging / name).is_file():
            raise PublishError(f"the upload folder lacks {name}: the model would not load as remote code")
        if not filecmp.cmp(staging / name, package / name, shallow=False):
            raise PublishError(f"{staging / name} is not this checkout's {package / name}")
    if not weight_files(staging):
        raise PublishError("the upload folder lacks model.safetensors")
    for name in ("generation_config.json", "README.md", *FAST_TOKENIZER_FILES):
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
