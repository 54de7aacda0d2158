"""The model card: `model_card.md` (the one template) rendered with the facts of one model folder.

Every value comes from the folder's own files: config.json (architecture), model.safetensors (parameter count:
each stored tensor once, the tied embedding once), generation_config.json (decoding), run_summary.json (data,
recipe, steps, throughput, scores during training), averaging.json (averaged checkpoints, when the folder came
from `training.average`), training_curves.png, and the scores.json files of `training.evaluate` given by name.
A fact these files do not hold is written as "not recorded"; nothing is filled in from defaults or guesses.
The YAML metadata (license, languages, library_name, pipeline_tag, tags, datasets, model-index with the
sacreBLEU signatures) is built with huggingface_hub's `ModelCardData` / `EvalResult`. To preview a card, run
`python -m training.publish FOLDER --repo_id user/name --dry_run --output_dir DIR` and read DIR/README.md.

    from training.hub.model_card import load_scores, render_card
    card = render_card("runs/pub-demo-avg", scores={"test": load_scores("runs/pub-demo-avg/eval-test/scores.json")})
    card.data.to_dict()["model-index"]
"""

from __future__ import annotations

import filecmp
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.utils import HFValidationError, validate_repo_id
from safetensors import safe_open

from training.common.files import project_file, weight_files

TEMPLATE = project_file("model_card.md", given_first=False)  # the checkout's or the installed copy
NOT_RECORDED = "not recorded"
LICENSE = "apache-2.0"
TAGS = ["translation", "transformer", "vaswani2017", "custom_code"]
# the decoder input, encoder input and output matrices that tie to `model.shared.weight` (§3.4)
TIED_ALIASES = ("lm_head.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
SHARED_KEY = "model.shared.weight"
# one example source sentence per language for the card's code snippet (text only: no number in it)
EXAMPLE_SOURCES = {
    "en": "I bought forty-five books on Monday.",
    "de": "Ich habe am Montag fünfundvierzig Bücher gekauft.",
}
DEFAULT_CORPUS = "default"


class CardError(ValueError):
    """A model folder or scores file the card cannot be written from; the message names the file."""


# --------------------------------------------------------------------------------------------------------------
# reading the run's files


def _read_json(path: Path, required: bool = False) -> dict[str, Any] | None:
    if not path.is_file():
        if required:
            raise CardError(f"{path}: no such file")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CardError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise CardError(f"{path} holds a {type(data).__name__}, expected a JSON object")
    return data


def count_parameters(folder: str | Path, tied: bool = True) -> int:
    """Parameters stored in the folder's safetensors: each tensor once; with `tied`, the tied aliases of
    `model.shared.weight` are not counted again when a file stores them as well."""
    total, names = 0, set()
    files = weight_files(Path(folder))
    if not files:
        raise CardError(f"{folder}: no model.safetensors (or model.safetensors.index.json)")
    shapes: dict[str, list[int]] = {}
    for path in files:
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                shapes[key] = list(f.get_slice(key).get_shape())
    names = set(shapes)
    for key, shape in shapes.items():
        if tied and key in TIED_ALIASES and SHARED_KEY in names:
            continue
        total += math.prod(shape)
    return total


class RunFacts:
    """The files of one model folder, read once."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise CardError(f"{self.folder}: not a folder")
        self.config = _read_json(self.folder / "config.json", required=True) or {}
        self.generation = _read_json(self.folder / "generation_config.json") or {}
        self.summary = _read_json(self.folder / "run_summary.json")
        self.averaging = _read_json(self.folder / "averaging.json")
        self.parameters = count_parameters(self.folder, tied=bool(self.config.get("tie_word_embeddings", True)))
        self.curves = (self.folder / "training_curves.png").is_file()

    @property
    def settings(self) -> dict[str, Any] | None:
        return None if self.summary is None else self.summary.get("settings") or {}

    def setting(self, key: str) -> Any:
        return None if self.settings is None else self.settings.get(key)

    @property
    def languages(self) -> tuple[str | None, str | None]:
        return self.setting("source_lang"), self.setting("target_lang")


def load_scores(path: str | Path) -> dict[str, Any]:
    """A scores.json of `training.evaluate`; it must hold a numeric `bleu`."""
    data = _read_json(Path(path), required=True) or {}
    if not isinstance(data.get("bleu"), int | float) or isinstance(data.get("bleu"), bool):
        raise CardError(f"{path}: no numeric 'bleu' (is it a scores.json of training.evaluate?)")
    return data


def parse_scores_args(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`NAME=PATH` pairs (`--scores test=runs/x/eval-test/scores.json`) -> {NAME: scores}; names must differ."""
    scores: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, path = item.partition("=")
        name = name.strip()
        if not sep or not name or not path:
            raise CardError(f"--scores {item!r}: expected NAME=PATH, e.g. test=runs/x/eval-test/scores.json")
        if not re.fullmatch(r"[\w.-]+", name):
            raise CardError(f"--scores {item!r}: the name may hold letters, digits, '_', '-' and '.' only")
        if name in scores:
            raise CardError(f"--scores: the name {name!r} is given twice")
        scores[name] = load_scores(path)
    return scores


# --------------------------------------------------------------------------------------------------------------
# formatting: numbers exactly as the files hold them (integers with thousands separators)


def fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return NOT_RECORDED
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        text = f"{value:,}"
    elif isinstance(value, float):
        text = f"{value:,}" if value.is_integer() and abs(value) >= 1000 else repr(value)
    else:
        text = str(value)
    return f"{text}{unit}"


def fmt_score(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) and not isinstance(value, bool) else NOT_RECORDED


def is_hub_dataset(name: str | None) -> bool:
    """A Hub dataset id (not the offline default corpus, not a local folder)."""
    if not name or name == DEFAULT_CORPUS or Path(name).exists():
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _file_name(path: Any) -> str:
    return f"`{Path(str(path)).name}`"


def describe_data(facts: RunFacts) -> tuple[str, str]:
    """(what the data is, what text the model knows) from the run's settings."""
    if facts.summary is None:
        return f"{NOT_RECORDED} (no run_summary.json)", "see the training data above"
    name, config = facts.setting("dataset_name"), facts.setting("dataset_config")
    if name == DEFAULT_CORPUS:
        return (
            "the offline default corpus of this package (`training.data.corpus`): numbers, dates, times and short "
            "sentences in English and German, generated by a seeded grammar",
            "numbers, dates, times and short sentences from a generated corpus; it does not translate general text",
        )
    if name:
        where = f"[{name}](https://huggingface.co/datasets/{name})" if is_hub_dataset(name) else f"`{name}`"
        text = f"{where}, configuration `{config}`" if config else where
        return text, f"{name}"
    files = [(split, facts.setting(f"{split}_file")) for split in ("train", "validation", "test")]
    files = [(split, path) for split, path in files if path]
    if files:
        text = "local files: " + ", ".join(f"{split} {_file_name(path)}" for split, path in files)
        return text, "the text of " + _file_name(files[0][1])
    return NOT_RECORDED, "see the training data above"


def _splits(values: Mapping[str, Any] | None, render) -> str:
    if not values:
        return NOT_RECORDED
    return "; ".join(f"{split}: {render(value)}" for split, value in values.items())


def _dropped(stats: Any) -> str:
    if not isinstance(stats, Mapping):
        return fmt(stats)
    return f"{fmt(stats.get('empty'))} empty, {fmt(stats.get('too_long'))} too long (of {fmt(stats.get('pairs'))})"


def describe_averaging(facts: RunFacts) -> str:
    """The averaged checkpoints as averaging.json (written by `training.average`) lists them."""
    record = facts.averaging
    if record is None:
        return "none recorded (no averaging.json in the model folder)"
    checkpoints = record.get("checkpoints") or []
    names = [c.get("name") or Path(str(c.get("path"))).name for c in checkpoints if isinstance(c, Mapping)]
    names += [Path(c).name for c in checkpoints if isinstance(c, str)]
    steps = record.get("steps") or [c.get("step") for c in checkpoints if isinstance(c, Mapping)]
    count = record.get("num_checkpoints", len(names) or len(steps) or None)
    if count is None:
        return f"{NOT_RECORDED} (averaging.json lists no checkpoints)"
    parts = [f"{fmt(count)}, parameters averaged element-wise"]
    if steps and all(s is not None for s in steps):
        parts.append("steps " + ", ".join(fmt(s) for s in steps))
    if names:
        parts.append(", ".join(f"`{n}`" for n in names))
    return "; ".join(parts) + " (averaging.json)"


def _decoding(settings: Mapping[str, Any] | None) -> str:
    """The decoding settings a scores.json records (training.evaluate's `decoding`)."""
    if not isinstance(settings, Mapping) or not settings:
        return NOT_RECORDED
    parts = [f"beam {fmt(settings.get('num_beams'))}", f"α {fmt(settings.get('length_penalty'))}"]
    if settings.get("length_penalty_rule"):
        parts.append(f"{settings['length_penalty_rule']} rule")
    if settings.get("output_limit"):
        parts.append(f"at most {settings['output_limit']}")
    return ", ".join(parts)


def _dataset_label(name: str) -> str:
    if name == DEFAULT_CORPUS:
        return "the default corpus (`training.data.corpus`)"
    return f"[{name}](https://huggingface.co/datasets/{name})" if is_hub_dataset(name) else f"`{name}`"


def describe_scores_data(scores: Mapping[str, Any]) -> str:
    """The test data a scores.json records (training.evaluate's `data`), local files by name only."""
    data = scores.get("data")
    if not isinstance(data, Mapping) or not data:
        return NOT_RECORDED
    parts = []
    if data.get("dataset_name"):
        parts.append(_dataset_label(str(data["dataset_name"])))
    if data.get("dataset_config"):
        parts.append(f"configuration `{data['dataset_config']}`")
    if data.get("split"):
        parts.append(f"split `{data['split']}`")
    for key in ("test_file", "source_file", "reference_file"):
        if data.get(key):
            parts.append(f"{key.replace('_', ' ')} {_file_name(data[key])}")
    if data.get("max_samples"):
        parts.append(f"first {fmt(data['max_samples'])} sentences")
    return ", ".join(parts) or NOT_RECORDED


def check_scores_model(folder: Path, name: str, scores: Mapping[str, Any]) -> None:
    """A scores.json names the model it scored (`model`); when that is a local folder, it must be `folder` or hold
    the same weights, so that the card never reports another model's scores as this one's."""
    scored = scores.get("model")
    if not scored or not Path(str(scored)).is_dir():
        return  # a Hub id, or a folder that is not here: nothing to compare
    scored_dir = Path(str(scored))
    if scored_dir.resolve() == folder.resolve():
        return
    ours, theirs = weight_files(folder), weight_files(scored_dir)
    same = len(ours) == len(theirs) and all(filecmp.cmp(a, b, shallow=False) for a, b in zip(ours, theirs, strict=True))
    if not same:
        raise CardError(
            f"--scores {name}: these are the scores of {scored_dir}, whose weights are not those of {folder}"
        )


def _cell(text: str) -> str:
    """Text for a markdown table cell: a "|" (as in |source|) would end the cell."""
    return text.replace("|", "\\|")


def results_section(scores: Mapping[str, Mapping[str, Any]]) -> str:
    if not scores:
        return (
            "No evaluation of this model folder was given when the card was written (publish's `--scores`): "
            "no score recorded."
        )
    rows = [
        "Scored with `training.evaluate` (sacreBLEU and chrF through `evaluate`, detokenized output against the "
        "raw references):",
        "",
        "| evaluation | test data | sentences | BLEU | chrF | decoding |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    signatures = []
    for name, s in scores.items():
        rows.append(
            f"| {name} | {_cell(describe_scores_data(s))} | {fmt(s.get('n_sentences'))} | {fmt_score(s.get('bleu'))} "
            f"| {fmt_score(s.get('chrf'))} | {_cell(_decoding(s.get('decoding')))} |"
        )
        signatures.append(f"- {name}: BLEU `{s.get('signature') or NOT_RECORDED}`,")
        signatures.append(f"  chrF `{s.get('chrf_signature') or NOT_RECORDED}`")
    return "\n".join([*rows, "", "sacreBLEU signatures:", "", *signatures])


def training_scores_section(facts: RunFacts) -> str:
    summary = facts.summary
    if summary is None:
        return "Scores during training: not recorded (no run_summary.json)."
    validation, test = summary.get("validation") or {}, summary.get("test") or {}
    step = f"step {fmt(summary.get('steps'))}"
    if facts.averaging is not None:
        step += "; before averaging, so not this model's weights"
    lines = [
        f"During training, `training.train` scored the weights at the end of training ({step}) against references "
        "decoded from the tokenized data (run_summary.json):",
        "",
        "| split | BLEU | chrF |",
        "| --- | --- | --- |",
        f"| validation | {fmt_score(validation.get('eval_bleu'))} | {fmt_score(validation.get('eval_chrf'))} |",
        f"| test | {fmt_score(test.get('test_bleu'))} | {fmt_score(test.get('test_chrf'))} |",
        "",
        f"Best validation BLEU during training: {fmt_score(summary.get('best_validation_bleu'))}. "
        f"sacreBLEU signature: `{(summary.get('signatures') or {}).get('bleu') or NOT_RECORDED}`.",
    ]
    return "\n".join(lines)


def _max_output_length(generation: Mapping[str, Any]) -> str:
    if generation.get("max_length_over_source") is not None:
        return f"|source| + {fmt(generation['max_length_over_source'])} tokens"
    for key in ("max_new_tokens", "max_length"):
        if generation.get(key) is not None:
            return f"{fmt(generation[key])} tokens ({key})"
    return NOT_RECORDED


# --------------------------------------------------------------------------------------------------------------
# the card


def model_name_for(folder: Path, repo_id: str | None) -> str:
    return repo_id.split("/")[-1] if repo_id else folder.resolve().name


def _eval_dataset(name: str, scores: Mapping[str, Any]) -> tuple[str, str | None, str]:
    """(dataset type, config, split) of a scores.json for the model-index: a Hub dataset by its id, the default
    corpus as `training.data.corpus`, local files by file name; the split as recorded, else the evaluation's name."""
    data = scores.get("data") if isinstance(scores.get("data"), Mapping) else {}
    dataset = data.get("dataset_name")
    if dataset and is_hub_dataset(str(dataset)):
        kind, config = str(dataset), data.get("dataset_config")
    elif dataset == DEFAULT_CORPUS:
        kind, config = "training.data.corpus", None
    elif dataset:
        kind, config = Path(str(dataset)).name, None
    else:
        files = [data.get(key) for key in ("test_file", "source_file") if data.get(key)]
        kind, config = (Path(str(files[0])).name if files else name), None
    return kind, config, str(data.get("split") or name)


def eval_results(facts: RunFacts, scores: Mapping[str, Mapping[str, Any]]) -> list[EvalResult]:
    """model-index entries: BLEU and chrF of each named scores.json, each with its sacreBLEU signature as the
    metric's `config` (the signature is sacreBLEU's record of the metric's configuration)."""
    source, target = facts.languages
    datasets = {name: _eval_dataset(name, s) for name, s in scores.items()}
    counts: dict[tuple, int] = {}
    for key in datasets.values():
        counts[key] = counts.get(key, 0) + 1
    results = []
    for name, s in scores.items():
        kind, config, split = datasets[name]
        if counts[(kind, config, split)] > 1:  # the model-index groups by dataset: keep evaluations apart
            split = name
        common = {
            "task_type": "translation",
            "task_name": f"Translation {source}-{target}" if source and target else "Translation",
            "dataset_type": kind,
            "dataset_name": name,
            "dataset_config": config,
            "dataset_split": split,
        }
        for metric, shown, signature in (("bleu", "sacreBLEU", "signature"), ("chrf", "chrF", "chrf_signature")):
            value = s.get(metric)  # BLEU is always there (load_scores checks it), chrF only in newer scores.json
            if isinstance(value, int | float) and not isinstance(value, bool):
                results.append(
                    EvalResult(
                        **common,
                        metric_type=metric,
                        metric_value=round(float(value), 2),
                        metric_name=shown,
                        metric_config=s.get(signature),
                    )
                )
    return results


def card_data(facts: RunFacts, scores: Mapping[str, Mapping[str, Any]], model_name: str) -> ModelCardData:
    source, target = facts.languages
    dataset = facts.setting("dataset_name")
    return ModelCardData(
        license=LICENSE,
        language=[lang for lang in (source, target) if lang] or None,
        library_name="transformers",
        pipeline_tag="translation",
        tags=list(TAGS),
        datasets=[dataset] if is_hub_dataset(dataset) else None,
        metrics=["bleu", "chrf"] if scores else None,
        model_name=model_name,
        eval_results=eval_results(facts, scores) or None,
    )


def card_values(
    facts: RunFacts,
    scores: Mapping[str, Mapping[str, Any]],
    repo_id: str | None,
    model_name: str,
    example_source: str | None = None,
) -> dict[str, str]:
    """The template's values, each from the run's files (or "not recorded")."""
    c, g, summary = facts.config, facts.generation, facts.summary or {}
    source, target = facts.languages
    data, data_limitation = describe_data(facts)
    d_model, vocab = c.get("d_model"), c.get("vocab_size")
    settings = facts.settings
    tokens = facts.setting("max_tokens_per_step")
    if settings is None:
        precision = NOT_RECORDED
    else:
        precision = "bf16 mixed" if settings.get("bf16") else "fp16 mixed" if settings.get("fp16") else "fp32"
    example = example_source or EXAMPLE_SOURCES.get(source or "", None)
    adam = [facts.setting(k) for k in ("adam_beta1", "adam_beta2", "adam_epsilon")]
    max_train = facts.setting("max_train_samples")
    label_smoothing = facts.setting("label_smoothing_factor")  # the recipe's ε_ls; config.json's is the loss's
    if label_smoothing is None:  # the key's name in run summaries written before it took Trainer's name
        label_smoothing = facts.setting("label_smoothing")
    return {
        "model_name": model_name,
        "repo_id": repo_id or "path/to/this/model",
        "source_language": source or NOT_RECORDED,
        "target_language": target or NOT_RECORDED,
        "encoder_layers": fmt(c.get("encoder_layers")),
        "decoder_layers": fmt(c.get("decoder_layers")),
        "d_model": fmt(d_model),
        "d_ff": fmt(c.get("d_ff")),
        "h": fmt(c.get("h")),
        "vocab_size": fmt(vocab),
        "tied_embeddings": "yes" if c.get("tie_word_embeddings", True) else "",
        "p_drop": fmt(c.get("p_drop")),
        "activation_function": fmt(c.get("activation_function")),
        "parameters": f"{fmt(facts.parameters)} (counted in model.safetensors, the shared matrix once)",
        "data_description": data,
        "data_limitation": data_limitation,
        "data_sizes": _splits(summary.get("data_sizes"), fmt),
        "dropped_pairs": _splits(summary.get("dropped_pairs"), _dropped),
        "max_length": fmt(facts.setting("max_length")),
        "max_train_samples": (
            NOT_RECORDED if settings is None else f"the first {fmt(max_train)}" if max_train else "none"
        ),
        "steps": fmt(summary.get("steps")),
        "tokens_per_step": (
            NOT_RECORDED
            if tokens is None
            else f"at most {fmt(tokens)} source and {fmt(tokens)} target tokens, padding included, all devices"
        ),
        "tokens_seen": fmt(summary.get("tokens_seen_src_plus_tgt")),
        "gradient_accumulation_steps": fmt(facts.setting("gradient_accumulation_steps")),
        "adam": " / ".join(fmt(v) for v in adam),
        "warmup_steps": fmt(facts.setting("warmup_steps")),
        "lr_scale": fmt(facts.setting("lr_scale")),
        "label_smoothing": fmt(label_smoothing),
        "max_grad_norm": fmt(facts.setting("max_grad_norm")),
        "precision": precision,
        "devices": fmt(summary.get("devices")),
        "train_seconds": fmt(summary.get("train_seconds"), " s"),
        "tokens_per_second": fmt(summary.get("tokens_per_second"), " tokens/s (source + target)"),
        "seed": fmt(facts.setting("seed")),
        "averaged_checkpoints": describe_averaging(facts),
        "training_curves": (
            "![Training curves: losses, validation BLEU/chrF and learning rate against the step](training_curves.png)"
            if facts.curves
            else f"Training curves: {NOT_RECORDED} (no training_curves.png)."
        ),
        "num_beams": fmt(g.get("num_beams")),
        "length_penalty": fmt(g.get("length_penalty")),
        "length_penalty_rule": fmt(g.get("length_penalty_rule")),
        "max_output_length": _max_output_length(g),
        "results": results_section(scores),
        "training_scores": training_scores_section(facts),
        "example_source": json.dumps(example, ensure_ascii=False) if example else '"..."',
    }


def render_card(
    folder: str | Path,
    template: str | Path = TEMPLATE,
    scores: Mapping[str, Mapping[str, Any]] | None = None,
    repo_id: str | None = None,
    model_name: str | None = None,
    example_source: str | None = None,
) -> ModelCard:
    """The model card of `folder`: `template` filled from the folder's files and the named `scores`."""
    template_path = Path(template)
    if not template_path.is_file():
        raise CardError(f"template {template_path}: no such file")
    if repo_id is not None:
        try:
            validate_repo_id(repo_id)
        except HFValidationError as error:
            raise CardError(f"repo id {repo_id!r} is not valid: {error}") from error
    scores = dict(scores or {})
    facts = RunFacts(folder)
    for scores_name, scores_values in scores.items():
        check_scores_model(facts.folder, scores_name, scores_values)
    name = model_name or model_name_for(facts.folder, repo_id)
    data = card_data(facts, scores, name)
    values = card_values(facts, scores, repo_id, name, example_source)
    template_str = template_path.read_text(encoding="utf-8")
    wanted = jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(template_str))
    missing = sorted(wanted - set(values) - {"card_data"})
    if missing:
        raise CardError(f"template {template_path} names values the card has none for: {', '.join(missing)}")
    card = ModelCard.from_template(data, template_str=template_str, **values)
    if not card.text.endswith("\n"):  # jinja drops the template's final newline
        card.text += "\n"
    left = re.findall(r"\{\{.*?\}\}|\{%.*?%\}", card.content)
    if left:
        raise CardError(f"the rendered card still holds template syntax: {left[:3]}")
    return card
