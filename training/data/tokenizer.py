"""The paper's shared source/target BPE vocabulary, trained with the `tokenizers` library (§5.1: "a shared
source-target vocabulary of about 37000 tokens"; smaller for small corpora).

    from training.data.tokenizer import train_tokenizer
    tok = train_tokenizer(["Ich habe fünf Äpfel gekauft.", "I bought five apples."] * 50, vocab_size=200)
    tok("fünf Äpfel").input_ids                     # ends with </s> (id 2)
    tok.decode(tok("fünf Äpfel").input_ids, skip_special_tokens=True)  # "fünf Äpfel"

The pipeline: NFKC normalization; Metaspace pre-tokenization (spaces become "▁" and start a new piece), with
punctuation and digits split off one by one, so that "Uhr." and "Uhr" share a token and numbers are spelled from ten
digit tokens instead of arbitrary merged chunks (the decoder joins the pieces back exactly); BPE with
`<unk>` for characters never seen in training; a post-processor that appends `</s>` to every sequence (source and
target alike: the model's labels end with `</s>`, and the decoder starts from `<s>`, added by the model). The
Metaspace decoder gives back the normal text: spaces, punctuation, umlauts and ß exactly as they were (after NFKC).
Special ids follow fairseq and the model config: `<s>` 0, `<pad>` 1, `</s>` 2, `<unk>` 3.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator

import datasets
import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")  # ids 0, 1, 2, 3
# The BPE learns from at most this many training pairs (both sides: twice as many sentences), drawn at random
# without replacement when the corpus is larger. Merges are decided by the frequent pairs of pieces, which a
# million sentence pairs already rank as the whole corpus would; WMT14 en-de has 4.5M, en-fr 36M.
BPE_MAX_PAIRS = 1_000_000
BPE_CACHE_VERSION = "1"  # bumped when the pipeline (_bpe_tokenizer, special tokens, post-processor) changes
BOS, PAD, EOS, UNK = SPECIAL_TOKENS
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 1


def _bpe_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"),
            pre_tokenizers.Punctuation(behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tokenizer


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    min_frequency: int = 2,
    *,
    model_max_length: int = 1024,
    length: int | None = None,
    show_progress: bool = True,
) -> PreTrainedTokenizerFast:
    """Train a BPE tokenizer on `texts` (both languages, for the shared vocabulary) and wrap it for transformers.

    `vocab_size` counts the four special tokens; the result may be smaller when the texts have fewer pieces to
    merge. `length` (the number of texts) only sizes the progress bar. `model_max_length` is what transformers
    truncates to when asked to truncate; the data pipeline drops longer pairs instead (see `training.data.parallel`).
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be at least {MIN_VOCAB_SIZE} (4 special tokens + 1), got {vocab_size}")
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")
    tokenizer = _bpe_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=show_progress,
    )
    seen = 0

    def counted(texts: Iterable[str]) -> Iterator[str]:
        nonlocal seen
        for text in texts:
            if text:
                seen += 1
                yield text

    tokenizer.train_from_iterator(counted(texts), trainer=trainer, length=length)
    if not seen:
        raise ValueError("train_tokenizer got no non-empty text to learn from")
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != expected_id:
            raise AssertionError(f"{token} got id {tokenizer.token_to_id(token)}, expected {expected_id}")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, SPECIAL_TOKENS.index(EOS))]
    )
    return wrap_tokenizer(tokenizer, model_max_length=model_max_length)


def wrap_tokenizer(tokenizer: Tokenizer, *, model_max_length: int = 1024) -> PreTrainedTokenizerFast:
    """A `tokenizers.Tokenizer` with our special tokens as a transformers tokenizer (pads right, keeps spaces)."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=model_max_length,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )


def iter_pair_texts(
    ds: datasets.Dataset,
    source_lang: str,
    target_lang: str,
    batch_size: int = 1000,
    indices: np.ndarray | None = None,
) -> Iterator[list[str]]:
    """Batches of texts from both sides of a `{"translation": {...}}` dataset, source then target per batch, read
    from its Arrow columns one batch at a time (only `indices`, sorted, where given): the corpus is never a Python
    list. A dataset that is exactly one Arrow file on disk (`_plain_file`) is read with plain reads, not through its
    memory map (the same batches)."""
    path = _plain_file(ds)
    tables = _file_tables(path, indices) if path is not None else _mapped_tables(ds, indices)
    for table in _rebatched(tables, batch_size):
        pairs = table.column("translation").combine_chunks()
        yield [t for t in pairs.field(source_lang).to_pylist() if t] + [
            t for t in pairs.field(target_lang).to_pylist() if t
        ]


# transforms datasets may have replayed on a memory-mapped table that leave its rows and its columns' contents alone
_ROW_KEEPING_REPLAYS = frozenset({"replace_schema_metadata", "select", "drop", "drop_columns"})


def _plain_file(ds: datasets.Dataset) -> str | None:
    """The Arrow file `ds` is, row for row, or None: a memory-mapped table with no indices mapping and no transform
    replayed on it but _ROW_KEEPING_REPLAYS (none that slices, casts, renames ...), as
    `training.data.parallel.load_parallel` gives for Moses files.

    Why: reading rows through the memory map maps each page read into this process for as long as the dataset
    lives, and a sample scattered over the corpus touches every page: for WMT14 en-de's 4.5M pairs, 0.6 GiB of RSS
    in the main process through tokenization and after (measured by benchmarks/data.py). A plain read
    leaves those pages in the kernel's page cache, outside the process."""
    from datasets.table import MemoryMappedTable

    table = ds.data
    if ds._indices is not None or not isinstance(table, MemoryMappedTable):
        return None
    if any(name not in _ROW_KEEPING_REPLAYS for name, _, _ in table.replays):
        return None
    return table.path


def _file_tables(path: str, indices: np.ndarray | None) -> Iterator[pa.Table]:
    """The file's record batches (only the rows at `indices`, sorted), one at a time, read with read(): datasets
    writes its Arrow files in the IPC stream format."""
    start = 0
    with pa.OSFile(path, "rb") as source:
        for batch in pa.ipc.open_stream(source):
            stop = start + batch.num_rows
            if indices is not None:
                lo, hi = np.searchsorted(indices, [start, stop])
                batch = batch.take(pa.array(indices[lo:hi] - start)) if hi > lo else None
            if batch is not None and batch.num_rows:
                yield pa.Table.from_batches([batch]).select(["translation"])
            start = stop
    if indices is not None and len(indices) and indices[-1] >= start:
        raise IndexError(f"row {indices[-1]} is past the {start} rows of {path}")


def _mapped_tables(ds: datasets.Dataset, indices: np.ndarray | None) -> Iterator[pa.Table]:
    part = ds.select_columns(["translation"])
    if indices is not None:
        part = part.select(indices)
    yield from part.with_format("arrow").iter(batch_size=100_000)


def _rebatched(tables: Iterable[pa.Table], size: int) -> Iterator[pa.Table]:
    """The rows of `tables`, in order, as tables of `size` rows (the last one shorter)."""
    held: list[pa.Table] = []
    rows = 0
    for table in tables:
        while table.num_rows:
            take = min(size - rows, table.num_rows)
            held.append(table.slice(0, take))
            rows += take
            table = table.slice(take)
            if rows == size:
                yield pa.concat_tables(held)
                held, rows = [], 0
    if held:
        yield pa.concat_tables(held)


def _check_train_split(ds: datasets.DatasetDict | datasets.Dataset, source_lang: str, target_lang: str):
    train = ds["train"] if isinstance(ds, datasets.DatasetDict) else ds
    if "translation" not in train.column_names:
        raise ValueError(f"the dataset has no 'translation' column (columns: {train.column_names})")
    feature = train.features["translation"]
    languages = sorted(getattr(feature, "languages", None) or feature)
    for lang in (source_lang, target_lang):
        if lang not in languages:
            raise ValueError(f"language {lang!r} is not in the dataset's translations; available: {languages}")
    return train


def bpe_sample(rows: int, max_pairs: int | None, seed: int = 0) -> np.ndarray | None:
    """The sorted rows the BPE learns from: None (all) when `rows` <= `max_pairs` or `max_pairs` is None, else
    `max_pairs` rows drawn without replacement with `seed`."""
    if max_pairs is None or rows <= max_pairs:
        return None
    if max_pairs < 1:
        raise ValueError(f"the BPE sample must be at least 1 pair, got {max_pairs}")
    return np.sort(np.random.default_rng([seed, rows]).choice(rows, size=max_pairs, replace=False))


def train_tokenizer_for(
    ds: datasets.DatasetDict | datasets.Dataset,
    source_lang: str,
    target_lang: str,
    vocab_size: int,
    min_frequency: int = 2,
    *,
    model_max_length: int = 1024,
    batch_size: int = 1000,
    show_progress: bool = True,
    max_pairs: int | None = None,
    seed: int = 0,
) -> PreTrainedTokenizerFast:
    """The shared BPE of the train split of `ds` (or of `ds` itself when it is one `Dataset`), both sides, streamed
    from the Arrow columns; with `max_pairs`, from a random sample of that many pairs when there are more."""
    train = _check_train_split(ds, source_lang, target_lang)
    indices = bpe_sample(len(train), max_pairs, seed)
    batches = iter_pair_texts(train, source_lang, target_lang, batch_size, indices)
    texts = (text for batch in batches for text in batch)
    return train_tokenizer(
        texts,
        vocab_size,
        min_frequency,
        model_max_length=model_max_length,
        length=2 * (len(train) if indices is None else len(indices)),
        show_progress=show_progress,
    )


def shared_bpe(
    train: datasets.Dataset,
    source_lang: str,
    target_lang: str,
    vocab_size: int,
    min_frequency: int = 2,
    *,
    max_pairs: int | None = BPE_MAX_PAIRS,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    show_progress: bool = True,
) -> tuple[PreTrainedTokenizerFast, dict]:
    """`train_tokenizer_for`, cached: a split stored on disk (its datasets fingerprint is then a key of its content)
    gets its BPE saved under `cache_dir/vaswani_bpe/<key>` (default: datasets' cache), keyed by that fingerprint, the
    languages, `vocab_size`, `min_frequency`, the sample (`max_pairs`, `seed`) and BPE_CACHE_VERSION, and loaded from
    there by any later call with the same ones. Returns the tokenizer and what happened, for run_summary.json:
    `{"pairs": rows, "pairs_used": ..., "sampled": bool, "cached": bool, "seconds": ..., "key": ...}`."""
    from transformers import AutoTokenizer

    train = _check_train_split(train, source_lang, target_lang)
    rows = len(train)
    indices = bpe_sample(rows, max_pairs, seed)
    info = {
        "pairs": rows,
        "pairs_used": rows if indices is None else len(indices),
        "sampled": indices is not None,
        "max_pairs": max_pairs,
        "sample_seed": seed,
        "cached": False,
    }
    started = time.perf_counter()
    folder = None
    if train.cache_files:  # in-memory data (the generated default corpus) has no stable fingerprint to key on
        settings = [train._fingerprint, source_lang, target_lang, vocab_size, min_frequency]
        settings += [max_pairs if indices is not None else None, seed if indices is not None else None]
        info["key"], folder = bpe_cache_folder(settings, cache_dir)
        if (folder / "tokenizer.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(folder)
            info.update(cached=True, seconds=round(time.perf_counter() - started, 2))
            logger.info("shared BPE: loaded from the cache %s (%s)", folder, _sample_text(info))
            return tokenizer, info
    if indices is not None:
        logger.warning(
            "shared BPE: the training split has %d pairs; learning from a random sample of %d (max_pairs, seed %d)",
            rows, len(indices), seed,
        )  # fmt: skip
    tokenizer = train_tokenizer_for(
        train,
        source_lang,
        target_lang,
        vocab_size,
        min_frequency,
        show_progress=show_progress,
        max_pairs=max_pairs,
        seed=seed,
    )
    info["seconds"] = round(time.perf_counter() - started, 2)
    logger.info("shared BPE: %d tokens learned in %.1f s (%s)", len(tokenizer), info["seconds"], _sample_text(info))
    if folder is not None:
        save_cached_bpe(tokenizer, folder)
    return tokenizer, info


def bpe_cache_folder(settings: list, cache_dir: str | os.PathLike | None = None) -> tuple[str, os.PathLike]:
    """The key of a BPE made with `settings` (a JSON list: what it was learnt from and how) and its cache folder."""
    from training.data.parallel import cache_root

    key = hashlib.sha256(json.dumps([BPE_CACHE_VERSION, *settings]).encode()).hexdigest()[:32]
    return key, cache_root(None if cache_dir is None else str(cache_dir)) / "vaswani_bpe" / key


def save_cached_bpe(tokenizer: PreTrainedTokenizerFast, folder) -> None:
    """Save into the cache `folder` atomically; another process that got there first wins, with the same BPE."""
    tmp = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def _sample_text(info: dict) -> str:
    if info["sampled"]:
        return f"from a random sample of {info['pairs_used']:,} of {info['pairs']:,} pairs"
    return f"from all {info['pairs']:,} pairs"
