"""Decoding speed: this model vs its transformers Marian twin vs CTranslate2, all decoding the same weights.

Every system produces exactly `--new_tokens` tokens per sentence (min = max new tokens), from the same random
sources of `--source_len` tokens, so they all do the same work; new tokens/s = batch × new_tokens / median time.
The Marian twin is `MarianMTModel` with our weights copied (benchmarks/twins.py); CTranslate2 (the optional
`bench` extra) gets the same weights through training/serving/ctranslate2_conversion.py, in float32 and int8 on CPU, in
bfloat16 / int8_bfloat16 on GPU. On CPU, `--systems ...,onnx-float32,onnx-int8` (the `export` extra) adds this
model exported to ONNX by training/serving/programs.py and run by ONNX Runtime, int8 by its dynamic quantization, inside the
same generate() loop (greedy and beam 4; with --model too).
Our model runs as loaded (sdpa; on CPU the oneDNN linear kernel) and, on CPU, with the opt-in int8 kernel and
with torch's default kernel ("aten") to show what the kernel choice buys. Ratios are taken within one run.

    # a few seconds on CPU (tiny model): the CI smoke run
    python -m benchmarks.generate --smoke --out_dir /tmp/bench
    # the CPU benchmark: base model, vocab 37,000, fp32, 2 threads, batch 32, 32-token sources, 32 new tokens
    python -m benchmarks.generate --device cpu --threads 2
    # the GPU benchmark: bf16, beam 4 at batch 128 and greedy at batch 256, 32-token sources, 48 new tokens
    python -m benchmarks.generate --device cuda
    # real data: a trained model folder and a Moses-style test set, every system on the same sentences in the same
    # batches, beam 4, natural stopping (wall time, new tokens/s, decoder calls and rows per sentence, BLEU)
    python -m benchmarks.generate --device cpu --threads 2 --model runs/multi30k \
        --test_file ../shared/data/multi30k/test_2016_flickr --source_lang en --target_lang de
    # int8 quality on a trained model: BLEU of fp32 and int8 decoding, ours and CTranslate2's (beam 4, α = 0.6)
    python -m benchmarks.generate --device cpu --threads 2 --skip_speed --bleu_model runs/multi30k \\
        --bleu_test_file ../shared/data/multi30k/test_2016_flickr --source_lang en --target_lang de
"""

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from benchmarks.common import (
    apply_isa,
    benchmark_parser,
    ctranslate2_dispatch,
    emit,
    environment,
    isa_choices,
    markdown_table,
    pick_device,
    positive,
    report,
    save_results,
    set_threads,
    synchronize,
    time_it,
)
from benchmarks.twins import ctranslate2_translator, id_tokens, marian_twin, token_ids
from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from modeling_vaswani.kernels_vaswani import cpu_kernel_table
from training.common.runtime import keep_freed_memory_for_reuse

CONFIGS = Path(__file__).resolve().parent.parent / "configuration"
CPU_SYSTEMS = ("ours", "ours-int8", "ours-aten", "marian", "ct2-float32", "ct2-int8")
GPU_SYSTEMS = ("ours", "ours-static", "marian", "marian-static", "ct2-bfloat16", "ct2-int8_bfloat16")
# "-static": generate(cache_implementation="static"); on CUDA transformers then compiles each decoding step
# (CUDA graphs). Both systems get it. On CPU they run uncompiled: allowed there only to test the path.
# the CPU kernel of each of our systems ("auto": per shape, the faster of oneDNN and aten, calibrated at first use)
OURS_KERNELS = {"ours": "auto", "ours-int8": "int8", "ours-aten": "aten", "ours-onednn": "onednn"}
EXTRA_CPU = ("ours-onednn", "ours-static", "marian-static", "onnx-float32", "onnx-int8")
REAL_SYSTEMS = ("ours", "ours-int8", "marian", "ct2-float32", "ct2-int8")
REAL_EXTRA = ("onnx-float32", "onnx-int8", "ours-early")  # opt-in: onnx-* (the `export` extra) our generate() on
# ONNX Runtime programs; ours-early the paper's decoding but for early_stopping=True (a sentence leaves once it has
# 4 finished hypotheses, transformers' default, near CTranslate2's rule): what the paper's exact stopping rule costs
REAL_COLUMNS = ["system", "wall_s", "new_tokens_per_s", "vs_ct2", "forward_calls", "rows_per_sentence",
                "rows_per_new_token", "bleu"]  # fmt: skip
COLUMNS = ["mode", "system", "batch", "new_tokens", "median_s", "new_tokens_per_s", "vs_marian", "vs_ct2"]


def build_parser() -> argparse.ArgumentParser:
    parser = benchmark_parser("generate", __doc__)
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when present)")
    parser.add_argument("--preset", default="base", help="a configuration/<preset>.json name or a config path")
    parser.add_argument("--vocab_size", type=positive, default=37000, help="vocabulary (the paper's en-de BPE)")
    parser.add_argument("--source_len", type=positive, default=32, help="tokens per source sentence")
    parser.add_argument("--new_tokens", type=positive, help="tokens generated per sentence (CPU 32, GPU 48)")
    parser.add_argument("--beam_batch", type=positive, help="sentences per batch, beam 4 (CPU 32, GPU 128)")
    parser.add_argument("--greedy_batch", type=positive, help="sentences per batch, greedy (CPU 32, GPU 256)")
    parser.add_argument("--modes", default="beam4,greedy", help="comma list of beam4, greedy")
    parser.add_argument(
        "--systems", help=f"comma list (CPU default {','.join(CPU_SYSTEMS)}; GPU {','.join(GPU_SYSTEMS)})"
    )
    parser.add_argument("--threads", type=positive, help="CPU threads for torch and CTranslate2 (default: torch's)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls before timing")
    parser.add_argument("--repeats", type=positive, default=3, help="timed calls; the median is reported")
    parser.add_argument("--skip_speed", action="store_true", help="only the BLEU part (needs --bleu_model)")
    parser.add_argument("--model", help="real-data mode: a trained model folder (with --test_file)")
    parser.add_argument("--test_file", help="real-data mode: test data (Moses prefix, JSONL or TSV)")
    parser.add_argument("--samples", type=positive, help="real-data mode: only the first N test sentences")
    parser.add_argument(
        "--batch_tokens",
        type=positive,
        help="real-data mode: source tokens per batch, padded (default: evaluate's)",
    )
    parser.add_argument("--bleu_model", help="a trained model folder: BLEU of fp32 vs int8, ours and CTranslate2")
    parser.add_argument("--bleu_test_file", help="test data for --bleu_model (Moses prefix, JSONL or TSV)")
    parser.add_argument("--source_lang", default="en", help="source language of --bleu_test_file")
    parser.add_argument("--target_lang", default="de", help="target language of --bleu_test_file")
    parser.add_argument("--bleu_samples", type=positive, help="only the first N test sentences")
    parser.add_argument(
        "--plain_malloc",
        action="store_true",
        help="leave glibc malloc as it is (default: keep freed large blocks for reuse, training/common/runtime.py; "
        "it applies to every system in the process alike)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny model and sizes: seconds on CPU, for CI")
    parser.add_argument("--out_dir", help="results folder (default benchmarks/results)")
    parser.add_argument(
        "--isa",
        choices=isa_choices(),
        help="cap oneDNN, ATen, fbgemm, MKL and CTranslate2 at this instruction set (ONEDNN_MAX_CPU_ISA, "
        "ATEN_CPU_CAPABILITY ...; the script restarts with them set) to measure that CPU class here; default native",
    )
    return parser


def check_arguments(args: argparse.Namespace, device: torch.device) -> None:
    """Every bad input named before any model is built."""
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - {"beam4", "greedy"}:
        raise SystemExit(f"--modes takes beam4 and/or greedy, got {args.modes!r}")
    default = CPU_SYSTEMS if device.type == "cpu" else GPU_SYSTEMS
    allowed = CPU_SYSTEMS + EXTRA_CPU if device.type == "cpu" else GPU_SYSTEMS
    systems = [s for s in (args.systems or ",".join(default)).split(",") if s]
    if not args.model and (not systems or set(systems) - set(allowed)):  # real-data systems: checked below
        raise SystemExit(f"--systems on {device.type} takes {', '.join(allowed)}, got {args.systems!r}")
    if args.warmup < 0:
        raise SystemExit(f"--warmup must be ≥ 0, got {args.warmup}")
    if args.skip_speed and not args.bleu_model:
        raise SystemExit("--skip_speed leaves nothing to do without --bleu_model")
    if bool(args.bleu_model) != bool(args.bleu_test_file):
        raise SystemExit("--bleu_model and --bleu_test_file go together: give both")
    if args.bleu_model and not (Path(args.bleu_model) / "config.json").is_file():
        raise SystemExit(f"--bleu_model {args.bleu_model}: not a model folder (no config.json)")
    if bool(args.model) != bool(args.test_file):
        raise SystemExit("--model and --test_file go together: give both")
    if args.model and not (Path(args.model) / "config.json").is_file():
        raise SystemExit(f"--model {args.model}: not a model folder (no config.json)")
    if args.model:
        real = [s for s in (args.systems or ",".join(REAL_SYSTEMS)).split(",") if s]
        if not real or set(real) - set(REAL_SYSTEMS + REAL_EXTRA):
            raise SystemExit(
                f"--systems with --model takes {', '.join(REAL_SYSTEMS + REAL_EXTRA)}, got {args.systems!r}"
            )
        args.real_systems = real
        return
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


def onnx_model(ours, quantization: str, threads: int | None):
    """`ours` exported to ONNX (training/serving/programs.py; int8: onnxruntime dynamic quantization), its generate() running
    the programs in ONNX Runtime with `threads` intra-op threads; None when the `export` extra is missing."""
    from training.serving.formats import ExportError, check_format
    from training.serving.programs import ExportedForGeneration, export_programs

    quantization = None if quantization == "float32" else quantization
    try:
        check_format("onnx", quantization)
    except ExportError as e:
        print(f"{e}: skipped", file=sys.stderr)
        return None
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    exported = export_programs(ours, "onnx", quantization, log=lambda message: None)
    return ExportedForGeneration.from_export(exported.to(session_options=options))


def kernel_record(system: str, device: torch.device) -> dict:
    """Ours on CPU: the kernel asked for and, under "auto", what the calibration chose per shape so far."""
    if system not in OURS_KERNELS or device.type != "cpu":
        return {}
    kernel = OURS_KERNELS[system]
    return {"cpu_kernel": kernel, **({"cpu_kernel_choices": cpu_kernel_table()} if kernel == "auto" else {})}


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
            make = functools.partial(
                ctranslate2_translator,
                twin, system[4:], threads=args.threads or 0, device="cuda" if device.type == "cuda" else "cpu",
            )  # fmt: skip
            translators[system], dispatch = ctranslate2_dispatch(make)
            env.update(dispatch)  # CTranslate2's ISA and GEMM backends, as its log names them (first load only)
            if translators[system] is None:
                print(f"ctranslate2 is not installed: {system} skipped (pip install -e '.[bench]')", file=sys.stderr)
        if system.startswith("onnx-"):
            translators[system] = onnx_model(ours, system[5:], args.threads)
    rows = []
    jobs = [(mode, system) for mode in args.modes for system in args.systems if translators.get(system, 1)]
    # CTranslate2 last, after every mode of the torch systems: once CTranslate2 has run in a process (its own
    # OpenMP runtime, libgomp bundled with it), each of torch's parallel regions costs ~50-100 µs more for the rest
    # of the process (measured on the AMX Xeon: a 32-row int8 product 55 → 160 µs, torch.cat 18 → 68 µs), which
    # made our greedy rows after beam 4's CTranslate2 rows up to 1.8× slower; CTranslate2's own times do not move
    jobs.sort(key=lambda job: job[1].startswith("ct2-"))  # stable: the order within each group is kept
    for mode, system in tqdm(jobs, desc="generate benchmark", unit="run", file=sys.stderr):
        beams, batch = (4 if mode == "beam4" else 1), size[mode]
        g = torch.Generator().manual_seed(1)
        src = torch.randint(4, config.vocab_size, (batch, size["source_len"]), generator=g).to(device)
        if system.startswith("ct2-"):
            run = ct2_decode(translators[system], src, beams, size["new_tokens"])
        elif system.startswith("onnx-"):
            run = hf_decode(translators[system], src, beams, size["new_tokens"])
        else:
            model = twin if system.startswith("marian") else ours
            if system in OURS_KERNELS and device.type == "cpu":
                model.set_cpu_kernel(OURS_KERNELS[system])
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
                    **kernel_record(system, device),
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
    from training.data.parallel import load_parallel
    from training.evaluation.metrics import compute_bleu_chrf
    from training.evaluation.scoring import evaluate_model
    from training.inference.translation import load_model

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


class DecoderRows:
    """Counts decoder forward calls and the rows (sentences × beams) they compute: a pre-hook on the decoder."""

    def __init__(self, decoder: torch.nn.Module):
        self.calls = self.rows = 0
        self.handle = decoder.register_forward_pre_hook(self.count, with_kwargs=True)

    def count(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids")
        embeds = kwargs.get("inputs_embeds")
        self.calls += 1
        self.rows += (ids if ids is not None else embeds).shape[0]


def real_rows(args, device) -> list[dict]:
    """Real data, natural stopping: every system decodes the same sentences in the same length-sorted batches
    (training/evaluate.py's token budget), beam 4, length penalty 0.6, at most |source| + 50 tokens. Ours: the
    paper's decoding (GNMT penalty; finished sentences leave the batch). Marian: transformers' beam search with
    its |Y|^α rule, early_stopping="never", the batch's longest source + 50. CTranslate2: its beam search,
    length_penalty 0.6, the batch's longest source + 50. wall_s is the best of --repeats passes over the set."""
    from training.data.parallel import load_parallel
    from training.evaluation.metrics import compute_bleu_chrf
    from training.inference.translation import DEFAULT_MAX_TOKENS, load_model, token_batches

    model, tokenizer = load_model(args.model, device)
    data = load_parallel(test_file=args.test_file, source_lang=args.source_lang, target_lang=args.target_lang)
    pairs = data["test"]["translation"][: args.samples]
    sources = [p[args.source_lang] for p in pairs]
    references = [p[args.target_lang] for p in pairs]
    encoded = tokenizer(sources)["input_ids"]  # </s> included
    budget = args.batch_tokens or DEFAULT_MAX_TOKENS
    batches = token_batches([len(e) for e in encoded], budget)
    pad = tokenizer.pad_token_id
    tensors = []
    for batch in batches:
        longest = max(len(encoded[i]) for i in batch)
        ids = torch.full((len(batch), longest), pad, dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, : len(encoded[i])] = torch.tensor(encoded[i])
        tensors.append((batch, ids.to(device), ids.ne(pad).long().to(device)))
    twin = marian_twin(model.float().cpu()).eval().to(device)
    special = set(tokenizer.all_special_ids)

    def hf_pass(m, kwargs_for):
        out = [None] * len(sources)
        for batch, ids, mask in tensors:
            result = m.generate(ids, attention_mask=mask, **kwargs_for(mask))
            for row, i in enumerate(batch):
                out[i] = [t for t in result[row].tolist() if t not in special]
        return out

    def ct2_pass(translator):
        out = [None] * len(sources)
        for batch, _ids, mask in tensors:
            results = translator.translate_batch(
                [id_tokens(encoded[i]) for i in batch],
                beam_size=4,
                length_penalty=0.6,
                max_decoding_length=int(mask.sum(-1).max()) + 50,
                max_batch_size=len(batch),
            )
            for r, i in zip(results, batch, strict=True):
                out[i] = [t for t in token_ids(r.hypotheses[0]) if t not in special]
        return out

    def marian_settings(mask):
        longest = int(mask.sum(-1).max())
        return dict(num_beams=4, length_penalty=0.6, early_stopping="never", max_new_tokens=longest + 50)

    rows = []
    for system in tqdm(args.real_systems, desc="real-data benchmark", unit="system", file=sys.stderr):
        counter = None
        if system.startswith("ct2-"):
            translator = ctranslate2_translator(twin, system[4:], threads=args.threads or 0, device=device.type)
            if translator is None:
                print(f"ctranslate2 is not installed: {system} skipped (pip install -e '.[bench]')", file=sys.stderr)
                continue
            run = functools.partial(ct2_pass, translator)
        elif system == "marian":
            counter = DecoderRows(twin.model.decoder)
            run = functools.partial(hf_pass, twin, marian_settings)
        elif system.startswith("onnx-"):  # the paper's decoding (the model's generation config), ONNX Runtime calls
            exported = onnx_model(model, system[5:], args.threads)
            if exported is None:
                continue
            run = functools.partial(hf_pass, exported, lambda mask: {})
        else:
            if device.type == "cpu":
                model.set_cpu_kernel("int8" if system == "ours-int8" else "auto")
            counter = DecoderRows(model.model.decoder)
            settings = {"early_stopping": True} if system == "ours-early" else {}  # else the model's own config
            run = functools.partial(hf_pass, model, lambda mask, settings=settings: settings)
        times, hypotheses = [], None
        for _ in range(args.repeats):
            if counter is not None:
                counter.calls = counter.rows = 0
            synchronize(device)
            start = time.perf_counter()
            with torch.inference_mode():
                hypotheses = run()
            synchronize(device)
            times.append(time.perf_counter() - start)
        if counter is not None:
            counter.handle.remove()
        new_tokens = sum(len(h) for h in hypotheses)
        texts = [tokenizer.decode(h, skip_special_tokens=True) for h in hypotheses]
        scores = compute_bleu_chrf(texts, references)
        rows.append(
            emit(
                {
                    "benchmark": "generate-real",
                    "system": system,
                    "model": str(args.model),
                    "test_file": str(args.test_file),
                    "sentences": len(sources),
                    "batches": len(batches),
                    "batch_tokens": budget,
                    "wall_s": round(min(times), 4),
                    "times_s": [round(t, 4) for t in times],
                    "new_tokens": new_tokens,
                    "new_tokens_per_s": round(new_tokens / min(times), 1),
                    "forward_calls": counter.calls if counter else None,
                    "rows_per_sentence": round(counter.rows / len(sources), 2) if counter else None,
                    "rows_per_new_token": round(counter.rows / max(new_tokens, 1), 3) if counter else None,
                    "bleu": scores["bleu"],
                    "chrf": scores["chrf"],
                    "signature": scores["signature"],
                }
            )
        )
    for row in rows:  # ratios within this run: wall time over CTranslate2's of the same precision
        other = "ct2-int8" if row["system"].endswith("int8") else "ct2-float32"
        ref = next((r for r in rows if r["system"] == other), None)
        row["vs_ct2"] = row["wall_s"] / ref["wall_s"] if ref else None
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    apply_isa(args.isa, "benchmarks.generate", argv)  # first: may start this script again with the caps set
    device = pick_device(args.device)
    check_arguments(args, device)
    set_threads(args.threads)
    env = environment(device)
    env["malloc_keeps_freed_blocks"] = False if args.plain_malloc else keep_freed_memory_for_reuse()
    if args.model:
        rows = real_rows(args, device)
        report("generate-real", env, rows, REAL_COLUMNS, args.out_dir)
        return rows
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
