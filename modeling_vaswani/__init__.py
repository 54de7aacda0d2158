"""The original Transformer (Vaswani et al., 2017) as a native transformers model.

Importing this package registers the model with transformers' Auto classes:
`AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM` resolve `model_type = "vaswani"`.
"""

from pathlib import Path

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.dynamic_module_utils import get_relative_import_files

from .configuration_vaswani import VaswaniConfig
from .generation_vaswani import gnmt_length_penalty
from .kernels_vaswani import CPU_KERNELS, set_cpu_kernel
from .loss_vaswani import fused_label_smoothed_nll_loss, label_smoothed_nll_loss
from .modeling_vaswani import (
    VaswaniForConditionalGeneration,
    VaswaniModel,
    VaswaniPreTrainedModel,
    VaswaniSeq2SeqLMOutput,
    sinusoids,
)
from .pipeline_vaswani import VaswaniTranslationPipeline

AutoConfig.register("vaswani", VaswaniConfig, exist_ok=True)
AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)
# save_pretrained writes `auto_map` and copies the code files (`code_files()`), so the Hub can load them as remote code.
VaswaniConfig.register_for_auto_class()
VaswaniModel.register_for_auto_class("AutoModel")
VaswaniForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")


def code_files() -> tuple[str, ...]:
    """The files that travel with a saved model as remote code: `modeling_vaswani.py` and every file it imports
    relatively, transitively, by the rule `save_pretrained` copies them with (transformers'
    `get_relative_import_files`). tests/test_save_load.py checks that a saved folder holds exactly these."""
    modeling = Path(__file__).with_name("modeling_vaswani.py")
    return (modeling.name, *sorted(Path(f).name for f in get_relative_import_files(modeling)))


__all__ = [
    "CPU_KERNELS",
    "VaswaniConfig",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "VaswaniSeq2SeqLMOutput",
    "VaswaniTranslationPipeline",
    "code_files",
    "fused_label_smoothed_nll_loss",
    "gnmt_length_penalty",
    "label_smoothed_nll_loss",
    "set_cpu_kernel",
    "sinusoids",
]
