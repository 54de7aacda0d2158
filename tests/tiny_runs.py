"""Inputs for tests that run training/train.py for real: default-corpus splits as JSON lines and a tiny model."""

import json
from pathlib import Path

from training.corpus import default_corpus

REPO = Path(__file__).resolve().parent.parent
# a shared BPE of 300 tokens and 600 source + 600 target tokens a step: a few milliseconds per step on a CPU
TINY_TRAIN_ARGS = ["--vocab_size", "300", "--max_tokens_per_step", "600"]


def write_inputs(
    root: Path, *, train_size: int, validation_size: int = 0, test_size: int = 0, seed: int = 1, **model: object
) -> dict[str, Path]:
    """`root/{train,validation,test}.jsonl` (splits of size 0 are left out) and `root/model.json`: the tiny
    preset at d_model 32 and d_ff 64, with `model` overriding any field. Returns the paths by name."""
    corpus = default_corpus(seed=seed, train_size=train_size, validation_size=validation_size, test_size=test_size)
    files = {}
    for split, ds in corpus.items():
        if len(ds):
            files[split] = root / f"{split}.jsonl"
            files[split].write_text("".join(json.dumps({"translation": row}) + "\n" for row in ds["translation"]))
    tiny = json.loads((REPO / "configuration" / "tiny.json").read_text())
    files["model"] = root / "model.json"
    files["model"].write_text(json.dumps({**tiny, "d_model": 32, "d_ff": 64, **model}))
    return files
