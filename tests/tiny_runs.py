"""Small things several test modules need: tiny training inputs, CPU Trainer arguments, a model whose LayerNorms
and biases are not at their initial 1 and 0 (which would hide a swapped norm or a dropped bias)."""

import json
from pathlib import Path

import torch
from transformers import Seq2SeqTrainingArguments

from training.data.corpus import default_corpus

REPO = Path(__file__).resolve().parent.parent
# a shared BPE of 300 tokens and 600 source + 600 target tokens a step: a few milliseconds per step on a CPU
TINY_TRAIN_ARGS = ["--vocab_size", "300", "--max_tokens_per_step", "600"]


def tiny_train_argv(
    files: dict[str, Path], out: Path, *extra: str, splits: tuple[str, ...] = ("validation",), model: str = "model"
) -> list[str]:
    """training.train's command line for a tiny run on `write_inputs`' files: the model preset `files[model]`, the
    training file and the `splits` named, TINY_TRAIN_ARGS, 10 warmup steps, no validation during training (it comes
    at the end), `out` as the output folder, then `extra`."""
    data = [arg for split in ("train", *splits) for arg in (f"--{split}_file", str(files[split]))]
    return [
        "--model_config", str(files[model]), *data, *TINY_TRAIN_ARGS,
        "--warmup_steps", "10", "--eval_steps", "1000", "--output_dir", str(out), *extra,
    ]  # fmt: skip


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


def cpu_trainer_args(tmp_path: Path, **overrides: object) -> Seq2SeqTrainingArguments:
    """Seq2SeqTrainer on the CPU, quiet: no reports, no checkpoints, a log line every step; `overrides` win."""
    settings = {
        "output_dir": str(tmp_path),
        "use_cpu": True,
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "dataloader_pin_memory": False,
        "weight_decay": 0.0,
        **overrides,
    }
    return Seq2SeqTrainingArguments(**settings)


def randomise_norms_and_biases(model: torch.nn.Module) -> torch.nn.Module:
    """LayerNorm weights ~ N(1, 0.2) and every bias ~ N(0, 0.2), in place, from torch's current seed."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.normal_(1.0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.2)
    return model


def train_to_reverse(model: torch.nn.Module, *, lr: float, vocab: int, length: int, eos: int = 2, steps: int):
    """Teaches `model` to reverse random sequences of ids 3..vocab-1 of `length` tokens (then </s>): Adam, batches
    of 32 from a seeded generator. Yields the step number after each optimizer step, so a caller can stop early."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    model.train()
    for step in range(1, steps + 1):
        src = torch.randint(3, vocab, (32, length), generator=g)  # (B, T)
        labels = torch.cat([src.flip(1), torch.full((32, 1), eos)], dim=1)  # (B, T + 1)
        loss = model(input_ids=src, attention_mask=torch.ones_like(src), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        yield step
