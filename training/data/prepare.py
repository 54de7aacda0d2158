"""A run's data, from its settings to the tokenized splits: load the corpus (`load_data`), learn or reuse the shared
BPE in the run folder, tokenize and filter (`prepare_data`); under `--streaming` the training split stays a stream,
tokenized as it is read (`streaming`).

`s` is the settings dict of `training.train.parse_settings` (recipe values overridden by flags, checked). Only the
standard library at import time: the command imports this module before it parses its arguments.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any


def micro_batch_tokens(s: dict[str, Any], world_size: int) -> int:
    """Source (and target) tokens of one micro-batch of one process: the step's budget shared by the processes and
    the accumulation steps. A longest allowed pair must fit (train checks that before any work)."""
    return s["max_tokens_per_step"] // (world_size * s["gradient_accumulation_steps"])


def load_data(s: dict[str, Any]):
    """The splits as `training.data.parallel.load_parallel` loads them (every file checked and read before anything
    is written); under --streaming the train split is a `datasets.IterableDataset` (training/data/streaming.py) and
    only the validation and test splits are loaded ahead."""
    import datasets

    from training.data.parallel import load_parallel

    common = {"source_lang": s["source_lang"], "target_lang": s["target_lang"]}
    if not s.get("streaming"):
        return load_parallel(
            dataset_name=s.get("dataset_name"),
            dataset_config=s.get("dataset_config"),
            train_file=s.get("train_file"),
            validation_file=s.get("validation_file"),
            test_file=s.get("test_file"),
            **common,
        )
    from training.data.streaming import stream_parallel

    if s.get("train_file"):
        files = {k: s[f"{k}_file"] for k in ("validation", "test") if s.get(f"{k}_file")}
        raw = load_parallel(data_files=files, **common) if files else datasets.DatasetDict()
    else:
        builder = datasets.load_dataset_builder(s["dataset_name"], s.get("dataset_config"))
        splits = [k for k in ("validation", "test") if k in (builder.info.splits or {})]
        raw = load_parallel(s["dataset_name"], s.get("dataset_config"), splits=splits, **common) if splits else None
        raw = raw or datasets.DatasetDict()
    raw["train"] = stream_parallel(
        s.get("dataset_name"), s.get("dataset_config"), train_file=s.get("train_file"), **common
    )
    return raw


def describe_data(s: dict[str, Any], splits: list[str]) -> str:
    """The files of `splits`, or the dataset's name: for messages about them."""
    files = [str(s[f"{split}_file"]) for split in splits if s.get(f"{split}_file")]
    return ", ".join(files) if files else f"dataset {s.get('dataset_name')!r}"


def stream_bpe(stream, s: dict[str, Any]):
    """The shared BPE of a streamed training set: from its first `bpe_max_pairs` pairs (a stream cannot be sampled
    without reading it all); logged, and recorded in run_summary.json. From local files it is cached as the
    map-style BPE is (training.data.tokenizer.shared_bpe), keyed by the files' content, the languages, the
    vocabulary size and the pairs it learns from; a Hub stream has no content key to go by and is learnt each time."""
    from transformers import AutoTokenizer

    from training.data.streaming import files_digest, iter_stream_texts
    from training.data.tokenizer import BPE_MAX_PAIRS, bpe_cache_folder, save_cached_bpe, train_tokenizer

    pairs, src, tgt = s.get("bpe_max_pairs", BPE_MAX_PAIRS), s["source_lang"], s["target_lang"]
    started = time.perf_counter()
    info: dict[str, Any] = {"first_pairs_of_stream": pairs, "sampled": True, "cached": False}
    folder = None
    if s.get("train_file"):
        settings = ["stream", files_digest(s["train_file"], src, tgt), src, tgt, s["vocab_size"], 2, pairs]
        info["key"], folder = bpe_cache_folder(settings)
        if (folder / "tokenizer.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(folder)
            return tokenizer, {**info, "cached": True, "seconds": round(time.perf_counter() - started, 2)}
    logging.getLogger("training.data.tokenizer").warning(
        "shared BPE of a stream: learning from its first %d pairs at most (--bpe_max_pairs)", pairs
    )
    batches = iter_stream_texts(stream, src, tgt, pairs)
    tokenizer = train_tokenizer((t for batch in batches for t in batch), s["vocab_size"])
    if folder is not None:
        save_cached_bpe(tokenizer, folder)
    return tokenizer, {**info, "seconds": round(time.perf_counter() - started, 2)}


def prepare_data(s: dict[str, Any], state, raw, out: Path, checkpoint: Path | None = None):
    """The tokenizer (learnt into out/tokenizer, or read from there when a run or the caller put one) and the
    tokenized, filtered splits of `raw` (`load_data`), prepared by the main process first (`state`: Accelerate's
    PartialState) so that the others read its caches. Under --streaming the train split becomes a
    `TokenBudgetStream`, resumed at `checkpoint`'s position. Returns (data, tokenizer, drop statistics, how the
    preparation went: the BPE's record and the seconds taken, for run_summary.json). SystemExit when no training
    pair is left."""
    from transformers import AutoTokenizer

    from training.data.parallel import tokenize_pairs
    from training.data.tokenizer import BPE_MAX_PAIRS, shared_bpe

    src, tgt = s["source_lang"], s["target_lang"]
    tokenizer_dir = out / "tokenizer"
    preparation = {}
    started = time.perf_counter()
    stream = raw.pop("train") if s.get("streaming") else None
    with state.main_process_first():  # one process trains the BPE and maps the data; the others read the caches
        if not (tokenizer_dir / "tokenizer.json").is_file():
            if stream is not None:
                bpe, preparation["bpe"] = stream_bpe(stream, s)
            else:
                bpe, preparation["bpe"] = shared_bpe(
                    raw["train"], src, tgt, s["vocab_size"], max_pairs=s.get("bpe_max_pairs", BPE_MAX_PAIRS)
                )
            bpe.save_pretrained(tokenizer_dir)
        else:
            preparation["bpe"] = {"from": str(tokenizer_dir)}
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        tokenized = time.perf_counter()
        data = tokenize_pairs(raw, tokenizer, src, tgt, s["max_length"], s.get("num_proc"))
        drop_stats = data.stats
    if stream is not None:
        from training.data.streaming import CHUNK_PAIRS, TokenBudgetStream, load_position, prefetch_pays

        position = load_position(checkpoint, state.process_index) if checkpoint is not None else None
        if checkpoint is not None and position is None:
            raise SystemExit(f"--resume --streaming: {checkpoint} has no stream position (was it a streaming run?)")
        data["train"] = TokenBudgetStream(
            stream,
            tokenizer,
            src,
            tgt,
            s["max_length"],
            micro_batch_tokens(s, state.num_processes),
            seed=s["seed"],
            chunk_pairs=s.get("stream_chunk_pairs", CHUNK_PAIRS),
            rank=state.process_index,
            world_size=state.num_processes,
            position=position,
            prefetch=prefetch_pays(state.device.type == "cpu", state.num_processes),
        )
        preparation["stream_prefetch"] = data["train"].prefetch
        logging.getLogger("training.data.streaming").info(
            "--streaming: the chunks after the first are prepared %s",
            "by a background worker"
            if data["train"].prefetch
            else "in the training process (no idle core for a worker)",
        )
        drop_stats = {**drop_stats, "train": data["train"].stats}  # filled as the stream is read
    preparation["tokenize_seconds"] = round(time.perf_counter() - tokenized, 2)
    preparation["bpe_and_tokenize_seconds"] = round(time.perf_counter() - started, 2)
    if stream is None and len(data["train"]) == 0:
        raise SystemExit(
            f"no training pair left: all {drop_stats['train']['pairs']:,} are empty or longer than max_length "
            f"{s['max_length']} tokens"
        )
    if s.get("max_train_samples"):
        data["train"] = data["train"].select(range(min(s["max_train_samples"], len(data["train"]))))
    if "validation" in data and s.get("max_eval_samples"):
        data["validation"] = data["validation"].select(range(min(s["max_eval_samples"], len(data["validation"]))))
    return data, tokenizer, drop_stats, preparation
