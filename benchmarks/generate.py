"""Decoding speed: this model vs its transformers Marian twin vs CTranslate2, all decoding the same weights.

Every system produces exactly `--new_tokens` tokens per sentence (min = max new tokens), from the same random
sources of `--source_len` tokens, so they all do the same work; new tokens/s = batch × new_tokens / median time.
The Marian twin is `MarianMTModel` with our weights copied (benchmarks/twins.py); CTranslate2 (the optional
`bench` extra) is converted from that twin, in float32 and int8 on CPU, in bfloat16 / int8_bfloat16 on GPU.
Our model runs as loaded (sdpa; on CPU the oneDNN linear kernel) and, on CPU, with the opt-in int8 kernel and
with torch's default kernel ("aten") to show what the kernel choice buys. Ratios are taken within one run.

    # a few seconds on CPU (tiny model): the CI smoke run
    python -m benchmarks.generate --smoke --out_dir /tmp/bench
    # the CPU benchmark: base model, vocab 37,000, fp32, 2 threads, batch 32, 32-token sources, 32 new tokens
    python -m benchmarks.generate --device cpu --threads 2
    # the GPU benchmark: bf16, beam 4 at batch 128 and greedy at batch 256, 32-token sources, 48 new tokens
    python -m benchmarks.generate --device cuda
    # int8 quality on a trained model: BLEU of fp32 and int8 decoding, ours and CTranslate2's (beam 4, α = 0.6)
    python -m benchmarks.generate --device cpu --threads 2 --skip_speed --bleu_model runs/multi30k \\
        --bleu_test_file ../shared/data/multi30k/test_2016_flickr --source_lang en --target_lang de
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from benchmarks.common import (
    emit,
    environment,
    markdown_table,
    pick_device,
    positive_int,
    save_results,
    set_threads,
    time_it,
)
from benchmarks.twins import ctranslate2_translator, id_tokens, marian_twin, token_ids
from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from training.runtime import keep_freed_memory_for_reuse

CONFIGS = Path(__file__).resolve().parent.parent / "configuration"
CPU_SYSTEMS = ("ours", "ours-int8", "ours-aten", "marian", "ct2-float32", "ct2-int8")
GPU_SYSTEMS = ("ours", "ours-static", "marian", "marian-static", "ct2-bfloat16", "ct2-int8_bfloat16")
# "-static": generate(cache_implementation="static"); on CUDA transformers then compiles each decoding step
# (CUDA graphs). Both systems get it. On CPU they run uncompiled: allowed there only to test the path.
EXTRA_CPU = ("ours-static", "marian-static")
COLUMNS = ["mode", "system", "batch", "new_tokens", "median_s", "new_tokens_per_s", "vs_marian", "vs_ct2"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when present)")
    parser.add_argument("--preset", default="base", help="a configuration/<preset>.json name or a config path")
    parser.add_argument("--vocab_size", type=positive_int, default=37000, help="vocabulary (the paper's en-de BPE)")
    parser.add_argument("--source_len", type=positive_int, default=32, help="tokens per source sentence")
    parser.add_argument("--new_tokens", type=positive_int, help="tokens generated per sentence (CPU 32, GPU 48)")
    parser.add_argument("--beam_batch", type=positive_int, help="sentences per batch, beam 4 (CPU 32, GPU 128)")
    parser.add_argument("--greedy_batch", type=positive_int, help="sentences per batch, greedy (CPU 32, GPU 256)")
    parser.add_argument("--modes", default="beam4,greedy", help="comma list of beam4, greedy")
    parser.add_argument(
        "--systems", help=f"comma list (CPU default {','.join(CPU_SYSTEMS)}; GPU {','.join(GPU_SYSTEMS)})"
    )
    parser.add_argument("--threads", type=positive_int, help="CPU threads for torch and CTranslate2 (default: torch's)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls before timing")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed calls; the median is reported")
    parser.add_argument("--skip_speed", action="store_true", help="only the BLEU part (needs --bleu_model)")
    parser.add_argument("--bleu_model", help="a trained model folder: BLEU of fp32 vs int8, ours and CTranslate2")
    parser.add_argument("--bleu_test_file", help="test data for --bleu_model (Moses prefix, JSONL or TSV)")
    parser.add_argument("--source_lang", default="en", help="source language of --bleu_test_file")
    parser.add_argument("--target_lang", default="de", help="target language of --bleu_test_file")
    parser.add_argument("--bleu_samples", type=positive_int, help="only the first N test sentences")
    parser.add_argument(
        "--plain_malloc",
        action="store_true",
        help="leave glibc malloc as it is (default: keep freed large blocks for reuse, training/runtime.py; "
        "it applies to every system in the process alike)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny model and sizes: seconds on CPU, for CI")
    parser.add_argument("--out_dir", help="results folder (default benchmarks/results)")
    return parser


def check_arguments(args: argparse.Namespace, device: torch.device) -> None:
    """Every bad input named before any model is built."""
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - {"beam4", "greedy"}:
        raise SystemExit(f"--modes takes beam4 and/or greedy, got {args.modes!r}")
    default = CPU_SYSTEMS if device.type == "cpu" else GPU_SYSTEMS
    allowed = CPU_SYSTEMS + EXTRA_CPU if device.type == "cpu" else GPU_SYSTEMS
    systems = [s for s in (args.systems or ",".join(default)).split(",") if s]
    if not systems or set(systems) - set(allowed):
        raise SystemExit(f"--systems on {device.type} takes {', '.join(allowed)}, got {args.systems!r}")
    if args.warmup < 0:
        raise SystemExit(f"--warmup must be ≥ 0, got {args.warmup}")
    if args.skip_speed and not args.bleu_model:
        raise SystemExit("--skip_speed leaves nothing to do without --bleu_model")
    if bool(args.bleu_model) != bool(args.bleu_test_file):
        raise SystemExit("--bleu_model and --bleu_test_file go together: give both")
    if args.bleu_model and not (Path(args.bleu_model) / "config.json").is_file():
        raise SystemExit(f"--bleu_model {args.bleu_model}: not a model folder (no config.json)")
    args.modes, args.systems = modes, systems


def load_config(args: argparse.Namespace) -> VaswaniConfig:
    preset = "tiny" if args.smoke else args.preset
    path = Path(preset) if preset.endswith(".json") else CONFIGS / f"{preset}.json"
    if not path.is_file():
        raise SystemExit(f"--preset {preset}: no such configuration ({path})")
    fields = {k: v for k, v in json.loads(path.read_text()).items() if k not in ("model_type", "architectures")}
    if not args.smoke:
        fields["vocab_size"] = args.vocab_size
    return VaswaniConfig(**fields)


def sizes(args: argparse.Namespace, device: torch.device) -> dict[str, int]:
    gpu = device.type == "cuda"
    if args.smoke:
        return {"new_tokens": 4, "beam4": 2, "greedy": 2, "source_len": 6}
    return {
        "new_tokens": args.new_tokens or (48 if gpu else 32),
        "beam4": args.beam_batch or (128 if gpu else 32),
        "greedy": args.greedy_batch or (256 if gpu else 32),
        "source_len": args.source_len,
    }


def hf_decode(model, src: torch.Tensor, beams: int, new_tokens: int, static: bool = False):
    """transformers generate with a fixed output length (min = max new tokens), no sampling."""
    extra = {"cache_implementation": "static"} if static else {}
    return lambda: model.generate(
        src,
        attention_mask=torch.ones_like(src),
        num_beams=beams,
        do_sample=False,
        min_new_tokens=new_tokens,
        max_new_tokens=new_tokens,
        length_penalty=1.0,
        early_stopping=True,
        **extra,
    )


def ct2_decode(translator, src: torch.Tensor, beams: int, new_tokens: int):
    tokens = [id_tokens(row.tolist()) for row in src.cpu()]
    return lambda: translator.translate_batch(
        tokens,
        beam_size=beams,
        min_decoding_length=new_tokens,
        max_decoding_length=new_tokens,
        max_batch_size=len(tokens),
        length_penalty=1.0,
    )


def speed_rows(args, device, env) -> list[dict]:
    config = load_config(args)
    size = sizes(args, device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    ours = VaswaniForConditionalGeneration(config).eval()
    twin = marian_twin(ours).eval()  # copied while both are fp32 on the CPU
    ours, twin = ours.to(device=device, dtype=dtype), twin.to(device=device, dtype=dtype)
    translators = {}
    for system in args.systems:
        if system.startswith("ct2-"):
            translators[system] = ctranslate2_translator(
                twin, system[4:], threads=args.threads or 0, device="cuda" if device.type == "cuda" else "cpu"
            )
            if translators[system] is None:
                print(f"ctranslate2 is not installed: {system} skipped (pip install -e '.[bench]')", file=sys.stderr)
    rows = []
    jobs = [(mode, system) for mode in args.modes for system in args.systems if translators.get(system, 1)]
    for mode, system in tqdm(jobs, desc="generate benchmark", unit="run", file=sys.stderr):
        beams, batch = (4 if mode == "beam4" else 1), size[mode]
        g = torch.Generator().manual_seed(1)
        src = torch.randint(4, config.vocab_size, (batch, size["source_len"]), generator=g).to(device)
        if system.startswith("ct2-"):
            run = ct2_decode(translators[system], src, beams, size["new_tokens"])
        else:
            model = twin if system.startswith("marian") else ours
            if system.startswith("ours") and device.type == "cpu":
                model.set_cpu_kernel({"ours-int8": "int8", "ours-aten": "aten"}.get(system, "onednn"))
            run = hf_decode(model, src, beams, size["new_tokens"], static=system.endswith("-static"))
        with torch.inference_mode():
            timing = time_it(run, device, args.warmup, args.repeats)
        rows.append(
            emit(
                {
                    "benchmark": "generate",
                    "mode": mode,
                    "system": system,
                    "batch": batch,
                    "beams": beams,
                    "source_len": size["source_len"],
                    "new_tokens": size["new_tokens"],
                    "dtype": str(dtype).replace("torch.", ""),
                    "preset": "tiny" if args.smoke else args.preset,
                    "vocab_size": config.vocab_size,
                    **timing,
                    "new_tokens_per_s": batch * size["new_tokens"] / timing["median_s"],
                }
            )
        )
    for row in rows:  # ratios within this run
        for key, other in (
            ("vs_marian", "marian"),
            ("vs_ct2", "ct2-float32" if device.type == "cpu" else "ct2-bfloat16"),
        ):
            ref = next((r for r in rows if r["mode"] == row["mode"] and r["system"] == other), None)
            row[key] = row["new_tokens_per_s"] / ref["new_tokens_per_s"] if ref else None
        if device.type == "cpu" and row["system"] == "ours-int8":
            ref = next((r for r in rows if r["mode"] == row["mode"] and r["system"] == "ct2-int8"), None)
            row["vs_ct2_int8"] = row["new_tokens_per_s"] / ref["new_tokens_per_s"] if ref else None
    return rows


def bleu_rows(args, device) -> list[dict]:
    """BLEU of the trained `--bleu_model` decoded in fp32 and int8: ours (paper decoding) and CTranslate2's."""
    from training.data import load_parallel
    from training.evaluate import evaluate_model, load_model
    from training.metrics import compute_bleu_chrf

    model, tokenizer = load_model(args.bleu_model, device)
    data = load_parallel(test_file=args.bleu_test_file, source_lang=args.source_lang, target_lang=args.target_lang)
    rows_in = data["test"]["translation"][: args.bleu_samples]
    sources = [r[args.source_lang] for r in rows_in]
    references = [r[args.target_lang] for r in rows_in]
    rows = []
    kernels = ["onednn", "int8"] if device.type == "cpu" else [None]
    for kernel in kernels:
        if kernel:
            model.set_cpu_kernel(kernel)
        result = evaluate_model(model, tokenizer, sources, references, progress=True)
        rows.append(
            emit(
                {
                    "benchmark": "bleu",
                    "system": "ours" + ("-int8" if kernel == "int8" else ""),
                    "bleu": result["bleu"],
                    "chrf": result["chrf"],
                    "signature": result["signature"],
                    "sentences": len(sources),
                    "wall_s": result["wall_seconds"],
                    "decoding": "beam 4, GNMT α=0.6, |src|+50",
                }
            )
        )
    twin = marian_twin(model.float().cpu())
    encoded = [id_tokens(ids) for ids in tokenizer(sources)["input_ids"]]
    for quantization in ["float32", "int8"] if device.type == "cpu" else ["bfloat16", "int8_bfloat16"]:
        translator = ctranslate2_translator(twin, quantization, threads=args.threads or 0, device=device.type)
        if translator is None:
            break
        start = time.perf_counter()
        results = translator.translate_batch(
            encoded, beam_size=4, length_penalty=0.6, max_batch_size=64, max_decoding_length=256
        )
        seconds = time.perf_counter() - start
        hypotheses = [tokenizer.decode(token_ids(r.hypotheses[0]), skip_special_tokens=True) for r in results]
        scores = compute_bleu_chrf(hypotheses, references)
        rows.append(
            emit(
                {
                    "benchmark": "bleu",
                    "system": f"ct2-{quantization}",
                    "bleu": scores["bleu"],
                    "chrf": scores["chrf"],
                    "signature": scores["signature"],
                    "sentences": len(sources),
                    "wall_s": round(seconds, 3),
                    "decoding": "beam 4, CTranslate2 length_penalty 0.6, ≤ 256 tokens",
                }
            )
        )
    base = {r["system"].split("-")[0]: r["bleu"] for r in rows if r["system"] in ("ours", "ct2-float32")}
    for row in rows:
        if row["system"] in ("ours-int8", "ct2-int8"):
            row["bleu_change_vs_fp32"] = row["bleu"] - base.get(row["system"].split("-")[0], float("nan"))
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    device = pick_device(args.device)
    check_arguments(args, device)
    set_threads(args.threads)
    env = environment(device)
    env["malloc_keeps_freed_blocks"] = False if args.plain_malloc else keep_freed_memory_for_reuse()
    rows = [] if args.skip_speed else speed_rows(args, device, env)
    table = markdown_table(rows, COLUMNS + (["vs_ct2_int8"] if device.type == "cpu" else [])) if rows else ""
    if args.bleu_model:
        bleu = bleu_rows(args, device)
        rows += bleu
        table += "\n\n" + markdown_table(bleu, ["system", "bleu", "chrf", "bleu_change_vs_fp32", "sentences", "wall_s"])
    print(table)
    jsonl, md = save_results("generate", env, rows, table, args.out_dir)
    print(f"results: {jsonl} and {md}", file=sys.stderr)
    return rows


if __name__ == "__main__":
    main()
