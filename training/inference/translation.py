"""Load a model folder and translate text in token-budget batches: the one translation path of `train`'s examples,
`evaluate`, `translate` and the benchmarks.

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

DEFAULT_MAX_TOKENS = 4000
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
    """Indices cut into batches of similar length: sorted longest first (ties by index), each batch holding at most
    `max_tokens` tokens with padding counted (n · longest ≤ max_tokens); a longer sentence gets a batch of its own.
    Deterministic, so a repeat run decodes the same batches."""
    if problem := positive_integer_problem("max_tokens", max_tokens):
        raise EvaluationError(problem)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def one_line(text: str) -> str:
    """A translation on one line: any line break the tokenizer may decode (\\n, \\r, U+2028, ...) becomes a space."""
    return " ".join(text.splitlines())


def translate_batched(
    model,
    tokenizer,
    texts: Sequence[str],
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    generate_kwargs: Mapping[str, Any] | None = None,
    max_source_tokens: int | None = None,
    progress: bool = True,
    stats: dict[str, int] | None = None,
) -> list[str]:
    """Translate `texts` in token-budget batches; one output per text, in the order given.

    A blank (empty or whitespace-only) text gives "" and is not sent to the model. Texts are stripped; with
    `max_source_tokens` each is truncated to that many tokens (`</s>` included). The progress bar goes to stderr.
    `stats`, if given, receives `source_tokens` and `generated_tokens` (special tokens and padding excluded).
    """
    outputs = [""] * len(texts)
    keep = [i for i, text in enumerate(texts) if text.strip()]
    if not keep:
        return outputs
    import torch
    from tqdm.auto import tqdm

    truncate = {"truncation": True, "max_length": max_source_tokens} if max_source_tokens else {}
    encoded = tokenizer([texts[i].strip() for i in keep], **truncate)["input_ids"]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.config.pad_token_id
    special = torch.tensor(sorted({*tokenizer.all_special_ids, pad}))
    device = next(model.parameters()).device
    source_tokens = generated_tokens = 0
    batches = token_batches([len(ids) for ids in encoded], max_tokens)
    bar = tqdm(total=len(keep), desc="Translating", unit="sent", file=sys.stderr, disable=not progress)
    with torch.inference_mode():
        for batch in batches:
            longest = max(len(encoded[j]) for j in batch)
            input_ids = torch.full((len(batch), longest), pad, dtype=torch.long)
            attention_mask = torch.zeros((len(batch), longest), dtype=torch.long)
            for row, j in enumerate(batch):
                input_ids[row, : len(encoded[j])] = torch.tensor(encoded[j])
                attention_mask[row, : len(encoded[j])] = 1
            out = model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), **(generate_kwargs or {})
            ).cpu()
            for row, text in enumerate(tokenizer.batch_decode(out, skip_special_tokens=True)):
                outputs[keep[batch[row]]] = one_line(text)
            source_tokens += int(attention_mask.sum())
            generated_tokens += int((~torch.isin(out, special)).sum())
            bar.update(len(batch))
    bar.close()
    if stats is not None:
        stats.update(source_tokens=source_tokens, generated_tokens=generated_tokens)
    return outputs


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
