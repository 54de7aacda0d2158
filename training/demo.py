"""Build a model from a named configuration, save it, reload it through the Auto classes and decode.

The smallest end-to-end check that the package works where it is installed: no data, no network.

    python -m training.demo                                  # tiny preset, CPU, a few seconds
    python -m training.demo --config configuration/base.json --output_dir runs/base-untrained
"""

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM

import modeling_vaswani
from training.common.arguments import command_parser, parse_command
from training.common.errors import run_command
from training.common.files import output_problem, project_file


@dataclass
class DemoArguments:
    config: str = field(default="configuration/tiny.json", metadata={"help": "a named configuration JSON"})
    output_dir: Path = field(default=Path("runs/demo"), metadata={"help": "where the model folder is written"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing, non-empty output_dir"})
    seed: int = field(default=0, metadata={"help": "seed for the random initial weights and inputs"})


def main(argv: list[str] | None = None) -> None:
    args, _ = parse_command(command_parser("python -m training.demo", __doc__, [DemoArguments]), argv)
    out = args.output_dir
    if problem := output_problem(out, "--output_dir", args.overwrite):
        raise SystemExit(f"error: {problem}")

    torch.manual_seed(args.seed)
    config = modeling_vaswani.VaswaniConfig.from_json_file(project_file(args.config))  # checkout or install
    model = modeling_vaswani.VaswaniForConditionalGeneration(config).use_paper_decoding().eval()
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"built {args.config}: d_model={config.d_model} N={config.encoder_layers} h={config.h} "
        f"d_ff={config.d_ff} vocab={config.vocab_size}, {n_params:,} parameters"
    )

    model.save_pretrained(out)
    print(f"saved to {out}: {sorted(p.name for p in out.iterdir())}")

    reloaded = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    source = torch.randint(3, config.vocab_size, (2, 6))
    source[1, 4:] = config.pad_token_id
    mask = source.ne(config.pad_token_id).long()
    start = time.perf_counter()
    with torch.no_grad():
        ours, theirs = (
            model.generate(input_ids=source, attention_mask=mask),
            reloaded.generate(input_ids=source, attention_mask=mask),
        )
    if not torch.equal(ours, theirs):
        raise SystemExit("the reloaded model decodes differently from the saved one")
    print(
        f"reloaded with AutoModelForSeq2SeqLM ({type(reloaded).__name__}); beam-4 decoding of 2 random sources "
        f"took {time.perf_counter() - start:.2f}s and matches:"
    )
    for row in theirs.tolist():
        print("  ", row)


if __name__ == "__main__":
    run_command(main)
