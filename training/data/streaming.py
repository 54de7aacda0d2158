"""`--streaming`: training data read as a `datasets.IterableDataset` and tokenized on the fly, for corpora larger
than RAM or than the disk cache. Nothing is prepared ahead; memory holds one chunk of pairs.

    from training.data.streaming import stream_parallel, TokenBudgetStream
    raw = stream_parallel(train_file="data/train")                        # Moses prefix, JSON lines or TSV
    raw = stream_parallel(dataset_name="wmt14", dataset_config="de-en")   # a Hub dataset datasets can stream
    stream = TokenBudgetStream(raw, tokenizer, "en", "de", max_length=128, max_tokens=3125, seed=0)
    for features in stream: ...        # lists of tokenized pairs, one token-budget batch each, forever

Batches (fairseq's approach adapted to a stream): the stream is read in chunks of `chunk_pairs` pairs; each chunk is
tokenized in one batched call, filtered like the map-style path (a blank side or more than `max_length` tokens:
dropped, counted), sorted by length and cut into token-budget batches exactly as `TokenBudgetBatchSampler` does,
and its batches are yielded in a random order drawn from (seed, epoch, chunk). At the end of the data the next epoch
starts, so the stream never ends; training stops at `max_steps`.

Prefetching: the first chunk is prepared in the training process, which has nothing else to do before the first
step; every later chunk is read, tokenized, filtered and cut into batches by a DataLoader worker process (one, at
lowered CPU priority: it runs on what training leaves idle), which prepares the next chunk while training steps
through the current one. Where training leaves no CPU idle (training on the CPU with a torch thread per core),
`prefetch_pays` says no and training.train prepares every chunk in the training process: cheaper there. The
training process only turns each batch's rows into Python lists when it is asked for that batch. Only the first chunk keeps training waiting: the stream's share of the preparation that the map-style
path does before training. The batches and their order are the same as when everything runs in the training process
(`prefetch=False`, also what a stream iterated inside a DataLoader worker does).

Exact resume: every batch has a position (epoch, chunk, batch within the chunk, pairs read before the chunk).
`position_after(n)` is where batch n + 1 starts; the trainer saves it with each checkpoint (`stream_position.json`,
one per process) and a resumed stream skips the raw pairs before that chunk without tokenizing them, rebuilds the
chunk (the same pairs, the same seed: the same batches) and continues at that batch: the batches an uninterrupted
run would have seen. Trainer's own batch skipping is turned off (`ignore_data_skip`).

DDP: `datasets.distributed.split_dataset_by_node(strategy="examples")`: process r of P keeps pairs r, r + P, ...;
each process makes its own batches from its pairs and, since the stream never ends, every process can take every
step. The data loader is not passed through `accelerator.prepare` (that would shard the batches a second time).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import torch

from training.common.checks import require_positive_integer
from training.data.parallel import _encode_table, _FileSource, _resolve_file, check_translation_features
from training.trainer.batching import TokenBudgetBatchSampler

logger = logging.getLogger(__name__)

POSITION_FILE = "stream_position.json"
CHUNK_PAIRS = 100_000
PREFETCH_NICENESS = 10  # added to a prefetching worker's nice value (_lower_priority)
_CHUNK_STREAM = 3  # first word of the chunk-order seeds (training.trainer.batching uses 1 and 2)


def _file_rows(paths: list[str], kind: str, source_lang: str, target_lang: str, columns=(0, 1), header=False):
    from training.data.parallel import _open_text

    if kind == "moses":
        with _open_text(Path(paths[0])) as src, _open_text(Path(paths[1])) as tgt:
            for s, t in zip(src, tgt, strict=True):
                yield {"translation": {source_lang: s.rstrip("\r\n"), target_lang: t.rstrip("\r\n")}}
        return
    with _open_text(Path(paths[0])) as f:
        for lineno, line in enumerate(f, 1):
            if kind == "json":
                if line.strip():
                    row = json.loads(line).get("translation") or {}
                    yield {"translation": {source_lang: row.get(source_lang), target_lang: row.get(target_lang)}}
                continue
            if lineno == 1 and header:
                continue
            fields = line.rstrip("\r\n").split("\t") if line.strip("\r\n") else ["", ""]
            if len(fields) != 2:
                raise ValueError(f"{paths[0]}, line {lineno}: expected 2 tab-separated fields, got {len(fields)}")
            yield {"translation": {source_lang: fields[columns[0]], target_lang: fields[columns[1]]}}


def stream_parallel(
    dataset_name: str | None = None,
    dataset_config: str | None = None,
    *,
    train_file: str | Path | None = None,
    source_lang: str = "en",
    target_lang: str = "de",
    split: str = "train",
) -> datasets.IterableDataset:
    """One split as an `IterableDataset` of `{"translation": {source_lang, target_lang}}` rows, read lazily.

    Local files (`train_file`: a Moses prefix, `.jsonl` or `.tsv`, optionally `.gz`) are checked as
    `training.data.parallel.load_parallel` checks them (existence, alignment, fields) before anything is streamed; a named
    dataset goes to `datasets.load_dataset(..., streaming=True)` (Hub datasets with data files, e.g. parquet)."""
    if (train_file is None) == (dataset_name is None):
        raise ValueError("streaming needs either a train_file or a dataset_name")
    if train_file is not None:
        source: _FileSource = _resolve_file(split, Path(train_file), source_lang, target_lang)
        kwargs = {"paths": [str(p) for p in source.paths], "kind": source.kind}
        kwargs |= {"source_lang": source_lang, "target_lang": target_lang}
        if source.kind == "tsv":
            kwargs |= {"columns": source.tsv_columns, "header": source.tsv_header}
        # gen_kwargs lists are shards to datasets: the two Moses files are one shard, so wrap them once more
        kwargs["paths"] = [kwargs["paths"]]
        # no `features`: datasets would encode and decode every row through them (3 s per 100,000 pairs, every skip
        # of a resume included), and the rows are already what they would make
        return datasets.IterableDataset.from_generator(_one_shard, gen_kwargs={"shard": [kwargs]})
    try:
        ds = datasets.load_dataset(dataset_name, dataset_config, split=split, streaming=True)
    except (ValueError, OSError) as e:
        raise ValueError(f"could not stream dataset {dataset_name!r} ({dataset_config}): {e}") from e
    check_translation_features(ds.features, source_lang, target_lang, f"dataset {dataset_name!r}")
    return ds.select_columns(["translation"])


def files_digest(train_file: str | Path, source_lang: str, target_lang: str) -> str:
    """A BLAKE2b digest of the content of the file(s) `stream_parallel(train_file=...)` reads: a cache key."""
    from training.data.parallel import _count_and_digest

    source = _resolve_file("train", Path(train_file), source_lang, target_lang)
    digests = source.digests or tuple(_count_and_digest(p)[1] for p in source.paths)
    return hashlib.blake2b(json.dumps([source.kind, *digests]).encode(), digest_size=16).hexdigest()


def _one_shard(shard: list[dict]):
    for kwargs in shard:
        yield from _file_rows(**{**kwargs, "paths": kwargs["paths"][0]})


def iter_stream_texts(raw: datasets.IterableDataset, source_lang: str, target_lang: str, pairs: int, batch=1000):
    """Batches of texts (source then target) from the first `pairs` pairs of the stream, for the BPE."""
    texts: list[str] = []
    for i, row in enumerate(raw):
        if i >= pairs:
            break
        pair = row["translation"]
        texts += [t for t in (pair.get(source_lang), pair.get(target_lang)) if t]
        if len(texts) >= 2 * batch:
            yield texts
            texts = []
    if texts:
        yield texts


@dataclass
class _Chunk:
    """One chunk, prepared: its kept pairs' features in batch order (batch b is rows offsets[b]:offsets[b + 1] of
    `table`), the order its batches are yielded in, and its pairs counted by what the filter did with them."""

    epoch: int
    chunk: int
    pairs_before: int
    table: pa.Table | None
    offsets: np.ndarray
    order: np.ndarray
    stats: dict[str, int]

    def batch(self, k: int) -> list[dict[str, Any]]:
        """The k-th batch yielded: lists of input_ids, attention_mask and labels, one dict per pair."""
        b = int(self.order[k])
        start, stop = int(self.offsets[b]), int(self.offsets[b + 1])
        return self.table.slice(start, stop - start).to_pylist()


class _Prepared(torch.utils.data.IterableDataset):
    """A stream's prepared chunks from a start (epoch, chunk, pairs before it), for a DataLoader worker to make."""

    def __init__(self, stream: TokenBudgetStream, epoch: int, chunk: int, pairs_before: int):
        super().__init__()
        self.stream, self.start = stream, (epoch, chunk, pairs_before)

    def __iter__(self) -> Iterator[_Chunk]:
        return self.stream._prepared_chunks(*self.start)


def _as_is(chunk: _Chunk) -> _Chunk:
    return chunk


def _lower_priority(worker_id: int) -> None:
    """A prefetching worker yields the CPU to training: it runs on what the training process leaves idle, and at full
    speed only when training waits for it (a chunk not ready yet)."""
    try:
        os.nice(PREFETCH_NICENESS)
    except OSError:  # not allowed here: run at the training process's priority
        pass


def prefetch_pays(on_cpu: bool, processes: int = 1) -> bool:
    """Whether a background worker should prepare the chunks after the first (`TokenBudgetStream(prefetch=...)`).

    Yes when training leaves CPU idle (a GPU run, or fewer torch threads than cores): the worker's preparation then
    costs training nothing. No when training runs on the CPU with torch's threads (times `processes` on this machine)
    taking every available core: the worker then only takes its CPU from training's threads, one second of training
    per second of its CPU, single-threaded and interleaved, while the training process prepares a chunk with every
    core at once. Measured on 2 cores (tiny model, 100,000-pair chunks of a 1M-pair corpus, the same 89 steps):
    the worker's chunk made those steps 18.6 s slower (its CPU: 18.7 s); the training process prepares a chunk in
    8.5 s."""
    if not on_cpu:
        return True
    from training.data.parallel import available_cores

    return available_cores() > torch.get_num_threads() * max(processes, 1)


class TokenBudgetStream(torch.utils.data.IterableDataset):
    """Token-budget batches (lists of tokenized pairs) from a raw `IterableDataset`, forever; see the module doc.

    `rank`/`world_size`: this process's share of the pairs (split_dataset_by_node). `position`: a dict from
    `position_after` (a resumed run) to start from. `pad_to_multiple_of` as the collator pads. `prefetch`: prepare
    chunks in a worker process, the next one while the current one is trained on (the same batches either way)."""

    def __init__(
        self,
        raw: datasets.IterableDataset,
        tokenizer,
        source_lang: str,
        target_lang: str,
        max_length: int,
        max_tokens: int,
        *,
        seed: int = 0,
        chunk_pairs: int = CHUNK_PAIRS,
        rank: int = 0,
        world_size: int = 1,
        pad_to_multiple_of: int = 1,
        position: Mapping[str, int] | None = None,
        prefetch: bool = True,
    ):
        super().__init__()
        require_positive_integer("chunk_pairs", chunk_pairs)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size} process(es)")
        if max_tokens < max_length:
            raise ValueError(f"max_tokens ({max_tokens}) is smaller than max_length ({max_length})")
        self.raw, self.tokenizer = raw, tokenizer
        self.source_lang, self.target_lang = source_lang, target_lang
        self.max_length, self.max_tokens, self.seed = max_length, max_tokens, seed
        self.chunk_pairs, self.rank, self.world_size = chunk_pairs, rank, world_size
        self.pad_to_multiple_of, self.prefetch = pad_to_multiple_of, prefetch
        self.start = dict(position) if position else {"epoch": 0, "chunk": 0, "batch": 0, "pairs_before": 0}
        self.start.setdefault("consumed", 0)
        missing = {"epoch", "chunk", "batch", "pairs_before"} - set(self.start)
        if missing:
            raise ValueError(f"a stream position needs {sorted(missing)} too, got {self.start}")
        self.yielded = 0  # batches yielded since the start position (which follows start["consumed"] batches)
        self._positions: OrderedDict[int, dict[str, int]] = OrderedDict()  # batch number → where it starts
        self.stats = {"pairs": 0, "empty": 0, "too_long": 0, "kept": 0}

    def _shard(self) -> datasets.IterableDataset:
        if self.world_size == 1:
            return self.raw
        from datasets.distributed import split_dataset_by_node

        return split_dataset_by_node(self.raw, self.rank, self.world_size, strategy="examples")

    def _chunks(self, epoch: int, pairs_before: int) -> Iterator[tuple[int, list[dict]]]:
        """(pairs read before the chunk, the chunk's raw rows) of one epoch, starting `pairs_before` pairs in."""
        # the pairs before are read, not tokenized; not by IterableDataset.skip, which in a DataLoader worker skips
        # pairs of the whole stream, before split_dataset_by_node takes this process's share (datasets 5.2)
        rows: list[dict] = []
        for row in itertools.islice(self._shard(), pairs_before, None):
            rows.append(row["translation"])
            if len(rows) == self.chunk_pairs:
                yield pairs_before, rows
                pairs_before, rows = pairs_before + len(rows), []
        if rows:
            yield pairs_before, rows

    def _prepare(self, rows: list[dict], epoch: int, chunk: int, pairs_before: int) -> _Chunk:
        """Tokenize, filter, sort by length and cut into token-budget batches; the order the batches go out in."""
        pairs = pa.array(rows, type=pa.struct([(self.source_lang, pa.string()), (self.target_lang, pa.string())]))
        table = _encode_table(
            pa.table({"translation": pairs}), self.tokenizer, self.source_lang, self.target_lang, self.max_length, False
        )
        keep = table.column("_keep").to_numpy(zero_copy_only=False)
        empty = int(table.column("_empty").to_numpy(zero_copy_only=False).sum())
        kept = int(keep.sum())
        stats = {"pairs": len(rows), "empty": empty, "too_long": len(rows) - kept - empty, "kept": kept}
        none = np.zeros(0, np.int64)
        if not kept:
            return _Chunk(epoch, chunk, pairs_before, None, np.zeros(1, np.int64), none, stats)
        table = table.filter(pa.array(keep)).drop_columns(["_keep", "_empty"])
        src, tgt = table.column("src_len").to_numpy(), table.column("tgt_len").to_numpy()
        sampler = TokenBudgetBatchSampler(
            src, tgt, self.max_tokens, shuffle=False, seed=self.seed, pad_to_multiple_of=self.pad_to_multiple_of
        )
        batches = list(sampler)
        offsets = np.cumsum([0] + [len(batch) for batch in batches])
        rows_in_batch_order = pa.array(np.concatenate(batches).astype(np.int64))
        table = table.select(["input_ids", "attention_mask", "labels"]).take(rows_in_batch_order)
        order = np.random.default_rng([_CHUNK_STREAM, self.seed, epoch, chunk]).permutation(len(batches))
        return _Chunk(epoch, chunk, pairs_before, table.combine_chunks(), offsets, order, stats)

    def _prepared_chunks(self, epoch: int, chunk: int, pairs_before: int) -> Iterator[_Chunk]:
        """Every chunk from the given one on, epoch after epoch, forever."""
        while True:
            kept, whole_epoch = 0, pairs_before == 0
            for before, rows in self._chunks(epoch, pairs_before):
                prepared = self._prepare(rows, epoch, chunk, before)
                kept += prepared.stats["kept"]
                yield prepared
                chunk += 1
            if whole_epoch and not kept:
                raise ValueError("the training stream has no pair left after filtering (all empty or too long)")
            epoch, chunk, pairs_before = epoch + 1, 0, 0

    def _chunk_source(self, epoch: int, chunk: int, pairs_before: int) -> Iterator[_Chunk]:
        """The prepared chunks: the first one here (training waits for it whatever happens, and this process's
        tokenizer may use every core), the others by a worker process that keeps one chunk ahead of training."""
        here = self._prepared_chunks(epoch, chunk, pairs_before)
        if not self.prefetch or torch.utils.data.get_worker_info() is not None:  # no workers inside a worker
            yield from here
            return
        first = next(here)
        here.close()
        loader = torch.utils.data.DataLoader(
            _Prepared(self, first.epoch, first.chunk + 1, first.pairs_before + first.stats["pairs"]),
            batch_size=None,
            collate_fn=_as_is,
            num_workers=1,
            prefetch_factor=1,  # with the chunk being trained on: two chunks in memory, a third being read
            worker_init_fn=_lower_priority,
            generator=torch.Generator().manual_seed(self.seed),  # not the global RNG (it drives dropout)
        )
        chunks = iter(loader)  # the worker starts on the next chunk now
        try:
            yield first
            yield from chunks
        finally:
            shutdown = getattr(chunks, "_shutdown_workers", None)
            if shutdown is not None:  # the worker ends with the stream's iterator, not when it is collected
                shutdown()

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        epoch, chunk, skip, pairs_before = (self.start[k] for k in ("epoch", "chunk", "batch", "pairs_before"))
        for prepared in self._chunk_source(epoch, chunk, pairs_before):
            for key, value in prepared.stats.items():
                self.stats[key] += value
            for k in range(skip, len(prepared.order)):
                position = {"epoch": prepared.epoch, "chunk": prepared.chunk, "batch": k}
                self._remember({**position, "pairs_before": prepared.pairs_before, "consumed": -1})
                yield prepared.batch(k)
            skip = 0

    def _remember(self, position: dict[str, int]) -> None:
        position["consumed"] = self.start["consumed"] + self.yielded  # batches before this one, since training began
        self._positions[position["consumed"]] = position
        self.yielded += 1
        while len(self._positions) > 1000:
            self._positions.popitem(last=False)

    def position_after(self, consumed: int) -> dict[str, int]:
        """Where the stream must restart so that its next batch is the one after `consumed` batches (counted since
        training began, resumed runs included): `consumed` = optimizer steps × gradient accumulation steps."""
        if consumed in self._positions:
            return dict(self._positions[consumed])
        if consumed == self.start["consumed"]:
            return dict(self.start)
        if consumed == self.start["consumed"] + self.yielded:  # the next batch, not made yet: after the last one
            last = self._positions[consumed - 1]  # (past a chunk's last batch, the resumed stream skips to the next)
            return {**last, "batch": last["batch"] + 1, "consumed": consumed}
        raise ValueError(
            f"the position after {consumed} batches is not known (batches {min(self._positions, default=0)}.."
            f"{self.start['consumed'] + self.yielded - 1} are): the data loader ran too far ahead"
        )


def save_position(folder: Path, rank: int, position: dict[str, int]) -> Path:
    path = folder / (POSITION_FILE if rank == 0 else f"stream_position_{rank}.json")
    path.write_text(json.dumps(position))
    return path


def load_position(folder: Path, rank: int) -> dict[str, int] | None:
    path = folder / (POSITION_FILE if rank == 0 else f"stream_position_{rank}.json")
    return json.loads(path.read_text()) if path.is_file() else None
