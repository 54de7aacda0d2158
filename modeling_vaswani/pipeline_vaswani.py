"""Batched translation, and the translation pipeline that travels with the model as remote code (transformers 5 has
none of its own).

`translate_batched` is the one translation path: the pipeline, `python -m training.evaluate`, `training.translate`
and the benchmarks all decode through it (training/inference/translation.py adds the progress bar and the
command-line errors). It lives here, not in `training/`, because the pipeline ships as remote code and cannot
import `training`.

`config.json` names the pipeline in `custom_pipelines` (`TRANSLATION_PIPELINE`); folders saved before this file
existed name it `modeling_vaswani.VaswaniTranslationPipeline`, which `modeling_vaswani.py` still provides
(tests/test_save_load.py loads both).
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers import Pipeline

DEFAULT_MAX_TOKENS = 4000  # source tokens per batch, padding counted


def token_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices cut into batches of similar length: sorted longest first (ties by index), each batch holding at most
    `max_tokens` tokens with padding counted (n · longest ≤ max_tokens); a longer sentence gets a batch of its own.
    Deterministic, so a repeat run decodes the same batches."""
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
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
    on_batch: Callable[[int], None] | None = None,
    stats: dict[str, int] | None = None,
) -> list[str]:
    """Translate `texts` in token-budget batches (`token_batches`); one output per text, in the order given, each on
    one line.

    A blank (empty or whitespace-only) text gives "" and is not sent to the model. Texts are stripped; with
    `max_source_tokens` each is truncated to that many tokens (`</s>` included). Each batch is padded by the
    tokenizer (`tokenizer.pad`, its pad token and side). `on_batch(n)` is called after each batch of n texts (a
    progress bar). `stats`, if given, receives `source_tokens` and `generated_tokens` (special tokens and padding
    excluded). Batching does not change a translation: tests/test_evaluate.py decodes in one batch and in many.
    """
    if tokenizer.pad_token_id is None:  # tokenizer.pad would fail at the first batch; say why before any work
        raise ValueError(
            f"the tokenizer ({type(tokenizer).__name__}) has no pad token: batches cannot be padded; set "
            f"tokenizer.pad_token (the model pads with id {model.config.pad_token_id})"
        )
    outputs = [""] * len(texts)
    keep = [i for i, text in enumerate(texts) if text.strip()]
    if not keep:
        return outputs
    truncate = {"truncation": True, "max_length": max_source_tokens} if max_source_tokens else {}
    encoded = tokenizer([texts[i].strip() for i in keep], **truncate)["input_ids"]
    special = torch.tensor(sorted({*tokenizer.all_special_ids, tokenizer.pad_token_id}))  # (not counted as generated)
    device = next(model.parameters()).device
    source_tokens = generated_tokens = 0
    with torch.inference_mode():
        for batch in token_batches([len(ids) for ids in encoded], max_tokens):
            inputs = tokenizer.pad({"input_ids": [encoded[j] for j in batch]}, return_tensors="pt")
            out = model.generate(**inputs.to(device), **(generate_kwargs or {})).cpu()
            for row, text in enumerate(tokenizer.batch_decode(out, skip_special_tokens=True)):
                outputs[keep[batch[row]]] = one_line(text)
            source_tokens += int(inputs["attention_mask"].sum())
            generated_tokens += int((~torch.isin(out, special)).sum())
            if on_batch is not None:
                on_batch(len(batch))
    if stats is not None:
        stats.update(source_tokens=source_tokens, generated_tokens=generated_tokens)
    return outputs


class VaswaniTranslationPipeline(Pipeline):
    """`pipeline("translation", model=folder_or_repo, trust_remote_code=True)`: texts in, translations out.

    transformers 5 removed its own "translation" pipeline; this one travels with the model as remote code
    (`custom_pipelines` in config.json) and decodes with the model's generation config unless told otherwise.
    """

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __call__(self, inputs: str | Sequence[str], **kwargs) -> list[dict[str, str]]:
        """One {"translation_text": ...} per input, in order; a single string gives a list of one, as transformers 4
        did. The texts go through `translate_batched` (`max_tokens` sets its budget); other keyword arguments go
        to `generate`."""
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        bad = [type(text).__name__ for text in texts if not isinstance(text, str)]
        if bad:
            raise ValueError(f"the translation pipeline takes a string or a list of strings, got {bad[0]}")
        max_tokens = kwargs.pop("max_tokens", DEFAULT_MAX_TOKENS)
        translations = translate_batched(
            self.model, self.tokenizer, texts, max_tokens=max_tokens, generate_kwargs=kwargs
        )
        return [{"translation_text": text} for text in translations]

    # Pipeline's steps, for its other entry points (one text at a time); __call__ does not use them
    def _sanitize_parameters(self, **generate_kwargs):
        return {}, generate_kwargs, {}

    def preprocess(self, text: str) -> dict[str, torch.Tensor]:
        return self.tokenizer(text, return_tensors="pt")

    def _forward(self, model_inputs: dict[str, torch.Tensor], **generate_kwargs) -> dict[str, torch.Tensor]:
        return {"output_ids": self.model.generate(**model_inputs, **generate_kwargs)}

    def postprocess(self, model_outputs: dict[str, torch.Tensor]) -> dict[str, str]:
        return {"translation_text": self.tokenizer.decode(model_outputs["output_ids"][0], skip_special_tokens=True)}


TRANSLATION_PIPELINE = {
    "impl": "pipeline_vaswani.VaswaniTranslationPipeline",
    "pt": ["AutoModelForSeq2SeqLM"],
    "type": "text",
}
