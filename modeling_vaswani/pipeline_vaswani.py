"""The translation pipeline that travels with the model as remote code (transformers 5 has none of its own).

`config.json` names it in `custom_pipelines` (`TRANSLATION_PIPELINE`); folders saved before this file existed name
it `modeling_vaswani.VaswaniTranslationPipeline`, which `modeling_vaswani.py` still provides (tests/test_save_load.py
loads both).
"""

import torch
from transformers import Pipeline


class VaswaniTranslationPipeline(Pipeline):
    """`pipeline("translation", model=folder_or_repo, trust_remote_code=True)`: texts in, translations out.

    transformers 5 removed its own "translation" pipeline; this one travels with the model as remote code
    (`custom_pipelines` in config.json) and decodes with the model's generation config unless told otherwise.
    """

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __call__(self, inputs: str | list[str], **kwargs) -> list[dict[str, str]]:
        """One {"translation_text": ...} per input; a single string gives a list of one, as transformers 4 did."""
        result = super().__call__(inputs, **kwargs)
        return [result] if isinstance(inputs, str) else result

    def _sanitize_parameters(self, **generate_kwargs):
        return {}, generate_kwargs, {}

    def preprocess(self, text: str) -> dict[str, torch.Tensor]:
        if not isinstance(text, str):
            raise ValueError(f"the translation pipeline takes a string or a list of strings, got {type(text).__name__}")
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
