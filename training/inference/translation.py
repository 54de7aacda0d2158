"""Load a model folder and translate text in token-budget batches, for the commands: the batching itself is
`modeling_vaswani.pipeline_vaswani.translate_batched`, the one translation path of `evaluate`, `translate`, the
benchmarks and the model's own pipeline; this module adds loading with named errors and a progress bar.

    from training.inference.translation import load_model, translate_batched
    model, tokenizer = load_model("runs/tiny")
    translate_batched(model, tokenizer, ["I bought five apples.", "See you at 7:30 pm."], progress=False)
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from training.common.checks import positive_integer_problem

# torch and transformers load inside the functions that use them: commands answer `--help` and a bad command line
# without them (tests/test_cli_errors.py)

DEFAULT_MAX_TOKENS = 4000  # = modeling_vaswani.pipeline_vaswani.DEFAULT_MAX_TOKENS (which loads torch to import)
DECODING_FIELDS = ("num_beams", "length_penalty", "length_penalty_rule", "max_length_over_source", "max_new_tokens",
                   "max_length", "early_stopping", "do_sample")  # fmt: skip


class EvaluationError(ValueError):
    """Bad input to evaluation or translation: reported before any decoding."""


def load_model(name_or_path: str, device: str | None = None, cpu_kernel: str | None = None):
    """(model, tokenizer) of a model folder or Hub id, in eval mode on `device` (default: cuda if present).

    `cpu_kernel` picks the linear-layer kernel of CPU inference ("auto", the default; "onednn"; "int8"; "aten").

    Raises EvaluationError naming the problem and the file: a missing folder, a folder without config.json, a
    config.json with a bad field, unreadable weights, or a Hub id that cannot be loaded (offline, only cached
    models load).
    """
    import torch
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

    import modeling_vaswani  # noqa: F401  (registers model_type "vaswani" with the Auto classes)

    path = Path(name_or_path).expanduser()
    looks_local = path.exists() or name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
    if looks_local:
        if not path.is_dir():
            raise EvaluationError(f"--model {name_or_path}: no such model folder")
        if not (path / "config.json").is_file():
            raise EvaluationError(f"--model {name_or_path}: not a model folder (no config.json)")
        if not (path / "tokenizer_config.json").is_file() and not (path / "tokenizer.json").is_file():
            raise EvaluationError(f"--model {name_or_path}: the folder has no tokenizer (tokenizer_config.json)")
    where = "model folder" if looks_local else "model folder or Hub model"
    config_file = path / "config.json" if looks_local else f"{name_or_path} (config.json)"
    try:
        config = AutoConfig.from_pretrained(name_or_path)
    except ValueError as e:  # a bad field (type or value) of config.json
        raise EvaluationError(f"--model {config_file}: {e}") from e
    except OSError as e:
        raise EvaluationError(f"--model {name_or_path}: could not load it as a {where}: {e}") from e
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForSeq2SeqLM.from_pretrained(name_or_path, config=config)
    except SafetensorError as e:  # a truncated or overwritten weights file: say which
        files = sorted(str(p) for p in path.glob("*.safetensors")) if looks_local else [name_or_path]
        raise EvaluationError(f"--model {', '.join(files)}: unreadable safetensors weights ({e})") from e
    except (OSError, ValueError) as e:
        raise EvaluationError(f"--model {name_or_path}: could not load it as a {where}: {e}") from e
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if cpu_kernel is not None:
        if not hasattr(model, "set_cpu_kernel"):
            raise EvaluationError(f"--cpu_kernel: {type(model).__name__} has no choice of CPU kernels")
        try:
            model.set_cpu_kernel(cpu_kernel)
        except ValueError as e:
            raise EvaluationError(f"--cpu_kernel: {e}") from e
    return model.to(device).eval(), tokenizer


def token_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """`modeling_vaswani.pipeline_vaswani.token_batches` (sorted by length, at most `max_tokens` tokens a batch,
    padding counted), with a bad budget reported as EvaluationError, a bad input of the commands."""
    if problem := positive_integer_problem("max_tokens", max_tokens):
        raise EvaluationError(problem)
    from modeling_vaswani.pipeline_vaswani import token_batches as batches_of

    return batches_of(lengths, max_tokens)


def translate_batched(
    model, tokenizer, texts: Sequence[str], *, max_tokens: int = DEFAULT_MAX_TOKENS, progress: bool = True, **options
) -> list[str]:
    """`modeling_vaswani.pipeline_vaswani.translate_batched` (the one translation path, shared with the model's
    pipeline: one output per text in order, blanks give "", token-budget batches padded by the tokenizer; `options`:
    `generate_kwargs`, `max_source_tokens`, `stats`) with a progress bar on stderr and a bad budget reported as
    EvaluationError."""
    if problem := positive_integer_problem("max_tokens", max_tokens):
        raise EvaluationError(problem)
    from tqdm.auto import tqdm

    from modeling_vaswani.pipeline_vaswani import translate_batched as translate

    nonblank = sum(1 for text in texts if text.strip())
    with tqdm(total=nonblank, desc="Translating", unit="sent", file=sys.stderr, disable=not progress) as bar:
        return translate(model, tokenizer, texts, max_tokens=max_tokens, on_batch=bar.update, **options)


def decoding_settings(model, generate_kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The decoding settings `model.generate(**generate_kwargs)` uses: the generation config with the overrides."""
    config = copy.deepcopy(model.generation_config)
    config.update(**dict(generate_kwargs or {}))
    settings = {field: getattr(config, field, None) for field in DECODING_FIELDS}
    if settings["max_new_tokens"] is not None:
        settings["output_limit"] = f"{settings['max_new_tokens']} new tokens"
    elif settings["max_length"] is not None:
        settings["output_limit"] = f"{settings['max_length']} tokens"
    elif settings["max_length_over_source"] is not None:
        settings["output_limit"] = f"|source| + {settings['max_length_over_source']} tokens"
    return settings
