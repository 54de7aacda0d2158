"""The original Transformer (Vaswani et al., 2017) as a native transformers model.

Importing this package registers the model with transformers' Auto classes:
`AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM` resolve `model_type = "vaswani"`.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .configuration_vaswani import VaswaniConfig
from .modeling_vaswani import (
    VaswaniForConditionalGeneration,
    VaswaniModel,
    VaswaniPreTrainedModel,
    VaswaniSeq2SeqLMOutput,
    VaswaniTranslationPipeline,
    gnmt_length_penalty,
    label_smoothed_nll_loss,
    sinusoids,
)

AutoConfig.register("vaswani", VaswaniConfig, exist_ok=True)
AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)
# save_pretrained writes `auto_map` and copies the two code files, so the Hub can load them as remote code.
VaswaniConfig.register_for_auto_class()
VaswaniModel.register_for_auto_class("AutoModel")
VaswaniForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")

__all__ = [
    "VaswaniConfig",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "VaswaniSeq2SeqLMOutput",
    "VaswaniTranslationPipeline",
    "gnmt_length_penalty",
    "label_smoothed_nll_loss",
    "sinusoids",
]
