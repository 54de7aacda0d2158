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

import json
import logging
from collections import OrderedDict
from collections.abc import Iterator, Mapping
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
    features = datasets.Features({"translation": datasets.Translation(languages=[source_lang, target_lang])})
    if train_file is not None:
        source: _FileSource = _resolve_file(split, Path(train_file), source_lang, target_lang)
        kwargs = {"paths": [str(p) for p in source.paths], "kind": source.kind}
        kwargs |= {"source_lang": source_lang, "target_lang": target_lang}
        if source.kind == "tsv":
            kwargs |= {"columns": source.tsv_columns, "header": source.tsv_header}
        # gen_kwargs lists are shards to datasets: the two Moses files are one shard, so wrap them once more
        kwargs["paths"] = [kwargs["paths"]]
        return datasets.IterableDataset.from_generator(_one_shard, gen_kwargs={"shard": [kwargs]}, features=features)
    try:
        ds = datasets.load_dataset(dataset_name, dataset_config, split=split, streaming=True)
    except (ValueError, OSError) as e:
        raise ValueError(f"could not stream dataset {dataset_name!r} ({dataset_config}): {e}") from e
    check_translation_features(ds.features, source_lang, target_lang, f"dataset {dataset_name!r}")
    return ds.select_columns(["translation"])


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


class TokenBudgetStream(torch.utils.data.IterableDataset):
    """Token-budget batches (lists of tokenized pairs) from a raw `IterableDataset`, forever; see the module doc.

    `rank`/`world_size`: this process's share of the pairs (split_dataset_by_node). `position`: a dict from
    `position_after` (a resumed run) to start from. `pad_to_multiple_of` as the collator pads."""

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
        self.pad_to_multiple_of = pad_to_multiple_of
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
        stream = self._shard()
        if pairs_before:
            stream = stream.skip(pairs_before)  # read, not tokenized
        rows: list[dict] = []
        for row in stream:
            rows.append(row["translation"])
            if len(rows) == self.chunk_pairs:
                yield pairs_before, rows
                pairs_before, rows = pairs_before + len(rows), []
        if rows:
            yield pairs_before, rows

    def _batches(self, rows: list[dict], epoch: int, chunk: int) -> tuple[list[list[dict]], np.ndarray]:
        pairs = pa.array(rows, type=pa.struct([(self.source_lang, pa.string()), (self.target_lang, pa.string())]))
        table = _encode_table(
            pa.table({"translation": pairs}), self.tokenizer, self.source_lang, self.target_lang, self.max_length, False
        )
        keep = table.column("_keep").to_numpy(zero_copy_only=False)
        empty = int(table.column("_empty").to_numpy(zero_copy_only=False).sum())
        kept = int(keep.sum())
        for key, value in (("pairs", len(rows)), ("empty", empty), ("too_long", len(rows) - kept - empty)):
            self.stats[key] += value
        self.stats["kept"] += kept
        if not kept:
            return [], np.zeros(0, np.int64)
        table = table.filter(pa.array(keep)).drop_columns(["_keep", "_empty"])
        src, tgt = table.column("src_len").to_numpy(), table.column("tgt_len").to_numpy()
        sampler = TokenBudgetBatchSampler(
            src, tgt, self.max_tokens, shuffle=False, seed=self.seed, pad_to_multiple_of=self.pad_to_multiple_of
        )
        features = table.select(["input_ids", "attention_mask", "labels"]).to_pylist()
        batches = [[features[i] for i in batch] for batch in sampler]
        order = np.random.default_rng([_CHUNK_STREAM, self.seed, epoch, chunk]).permutation(len(batches))
        return batches, order

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        epoch, chunk, skip, pairs_before = (self.start[k] for k in ("epoch", "chunk", "batch", "pairs_before"))
        while True:
            produced = False
            for before, rows in self._chunks(epoch, pairs_before):
                batches, order = self._batches(rows, epoch, chunk)
                for k in range(skip, len(batches)):
                    self._remember({"epoch": epoch, "chunk": chunk, "batch": k, "pairs_before": before, "consumed": -1})
                    produced = True
                    yield batches[order[k]]
                chunk, skip = chunk + 1, 0
            if not produced and pairs_before == 0:
                raise ValueError("the training stream has no pair left after filtering (all empty or too long)")
            epoch, chunk, pairs_before = epoch + 1, 0, 0

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
