"""Serving: a model folder as transformers' exported programs (`programs`: torch.export, ONNX, ExecuTorch, OpenVINO;
`ExportedForGeneration` runs `generate()` on them) or as a CTranslate2 model (`ctranslate2_conversion`); the formats,
their packages and quantizations (`formats`). The command is `python -m training.export`."""
