"""The export formats, the packages each needs, the quantizations each takes, and the one error of exporting. Imports
neither torch nor transformers, so `python -m training.export --help` and a bad format are answered at once."""

from __future__ import annotations

import importlib.util

# format → (the modules it needs, the transformers exporter and config classes)
EXPORTERS = {
    "onnx": (("onnx", "onnxscript", "onnxruntime"), "OnnxExporter", "OnnxConfig"),
    "executorch": (("executorch",), "ExecutorchExporter", "ExecutorchConfig"),
    "openvino": (("openvino",), "OpenVINOExporter", "OpenVINOConfig"),
    "dynamo": ((), "DynamoExporter", "DynamoConfig"),
}
FORMATS = (*EXPORTERS, "ctranslate2")
CT2_QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
QUANTIZATIONS = {"onnx": ("int8",), "ctranslate2": CT2_QUANTIZATIONS}  # onnx int8: onnxruntime dynamic quantization


CACHE_IMPLEMENTATIONS = ("dynamic", "static")  # the decoder programs' cache (generate()'s `cache_implementation`)
# the generate() call the programs are traced on holds a 2-token decoder prompt and 3 new tokens
MIN_MAX_CACHE_LEN = 5


class ExportError(ValueError):
    """A bad setting or a missing package, reported before any work."""


def check_format(fmt: str, quantization: str | None) -> None:
    """The format exists, its packages import, and it takes `quantization`; else an ExportError naming the pip extra."""
    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if quantization is not None and quantization not in QUANTIZATIONS.get(fmt, ()):
        allowed = QUANTIZATIONS.get(fmt)
        raise ExportError(
            f"--format {fmt} takes --quantization {' | '.join(allowed)}, not {quantization!r}"
            if allowed
            else f"--format {fmt} takes no --quantization (got {quantization!r})"
        )
    needed = EXPORTERS[fmt][0] if fmt in EXPORTERS else ("ctranslate2",)
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(
            f"--format {fmt} needs {', '.join(missing)}, not installed: pip install -e '.[export]' "
            f"(or pip install {' '.join(missing)})"
        )


def check_cache(fmt: str, cache_implementation: str, max_cache_len: int | None) -> None:
    """A static cache needs `max_cache_len` (the decoder programs' fixed self-attention length) and an exporter
    format; a dynamic cache takes no `max_cache_len`; else an ExportError."""
    if cache_implementation not in CACHE_IMPLEMENTATIONS:
        raise ExportError(
            f"--cache_implementation must be one of {', '.join(CACHE_IMPLEMENTATIONS)}, got {cache_implementation!r}"
        )
    if cache_implementation == "dynamic":
        if max_cache_len is not None:
            raise ExportError("--max_cache_len sizes a static cache: add --cache_implementation static")
        return
    if fmt not in EXPORTERS:
        raise ExportError(
            f"--cache_implementation static is for the exporters' formats ({', '.join(EXPORTERS)}), not {fmt}"
        )
    if max_cache_len is None or max_cache_len < MIN_MAX_CACHE_LEN:
        raise ExportError(
            f"--cache_implementation static needs --max_cache_len N ≥ {MIN_MAX_CACHE_LEN} (got {max_cache_len}): the "
            "self-attention cache's fixed length, at least 1 + the longest output (|source| + 50 under the paper's rule)"
        )
