"""--streaming (training/data/streaming.py): token-budget batches from length-sorted chunks of a stream, an exact resume
position (the stream resumed there yields the uninterrupted stream's batches), a resumed training run that ends with
the uninterrupted run's weights, DDP shards that split the pairs."""

import json
import shutil
from pathlib import Path

import pytest

from training.data.corpus import default_corpus
from training.data.streaming import TokenBudgetStream, load_position, prefetch_pays, stream_parallel
from training.data.tokenizer import train_tokenizer

PAIRS = 700


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rows = default_corpus(3, PAIRS, 0, 0)["train"]["translation"]
    prefix = tmp_path_factory.mktemp("stream") / "train"
    Path(f"{prefix}.en").write_text("".join(r["en"] + "\n" for r in rows), encoding="utf-8")
    Path(f"{prefix}.de").write_text("".join(r["de"] + "\n" for r in rows), encoding="utf-8")
    return prefix


@pytest.fixture(scope="module")
def tok():
    rows = default_corpus(0, 2000, 0, 0)["train"]["translation"]
    return train_tokenizer([r[k] for r in rows for k in ("en", "de")], vocab_size=400, show_progress=False)


def make(corpus, tok, **kwargs) -> TokenBudgetStream:
    options = {"max_length": 32, "max_tokens": 256, "seed": 1, "chunk_pairs": 150, **kwargs}
    return TokenBudgetStream(stream_parallel(train_file=corpus), tok, "en", "de", **options)


def take(stream: TokenBudgetStream, n: int) -> list[list[tuple[int, ...]]]:
    batches, it = [], iter(stream)
    for _ in range(n):
        batches.append([pair(f) for f in next(it)])
    return batches


def one_epoch(stream: TokenBudgetStream) -> list[list[dict]]:
    """The batches of the stream's first epoch (reading on until the first batch of the second)."""
    batches = []
    for batch in stream:
        if next(reversed(stream._positions.values()))["epoch"] > 0:
            return batches
        batches.append(batch)
    raise AssertionError("the stream ended")


def pair(feature: dict) -> tuple[int, ...]:
    return (*feature["input_ids"], -1, *feature["labels"])


def test_batches_hold_the_budget_and_one_epoch_holds_every_kept_pair_once(corpus, tok):
    stream = make(corpus, tok)
    batches = one_epoch(stream)
    for batch in batches:
        n = len(batch)
        assert n * max(len(f["input_ids"]) for f in batch) <= 256 and n * max(len(f["labels"]) for f in batch) <= 256
    seen = [pair(f) for batch in batches for f in batch]
    en, de = (Path(f"{corpus}.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "de"))
    expected = [(*tok(e).input_ids, -1, *tok(d).input_ids) for e, d in zip(en, de, strict=True)]
    expected = [p for p in expected if p.index(-1) <= 32 and len(p) - p.index(-1) - 1 <= 32]
    assert PAIRS // 2 < len(expected) < PAIRS  # the length filter dropped some, kept most
    assert sorted(seen) == sorted(expected)  # every kept pair exactly once in the epoch
    firsts = [len(batch[0]["input_ids"]) for batch in batches]
    assert firsts != sorted(firsts)  # batches come shuffled within a chunk, not shortest first


def test_resume_position_gives_the_batches_the_uninterrupted_stream_gives(corpus, tok):
    straight = take(make(corpus, tok), 100)  # several chunks and into the second epoch
    for consumed in (0, 7, 13, 40, 60, 97):
        first = make(corpus, tok)
        take(first, consumed + 2)  # the loader may run ahead of what was trained on
        position = first.position_after(consumed)
        resumed = make(corpus, tok, position=position)
        assert take(resumed, 100 - consumed) == straight[consumed:], consumed
    reached = make(corpus, tok)
    take(reached, 100)
    assert reached.position_after(40)["chunk"] > 0  # a resume inside a later chunk
    assert reached.position_after(97)["epoch"] == 1  # and one in the second epoch


def test_prefetching_gives_the_batches_and_positions_of_preparing_every_chunk_here(corpus, tok):
    """The worker process that prepares chunks ahead changes nothing a run sees: the same batches in the same order,
    the same resume positions and counts, across chunks and epochs; its process ends with the stream's iterator."""
    import psutil

    here, ahead = make(corpus, tok, prefetch=False), make(corpus, tok, prefetch=True)
    assert take(ahead, 100) == take(here, 100)  # several chunks and into the second epoch
    assert [ahead.position_after(n) for n in range(100)] == [here.position_after(n) for n in range(100)]
    assert ahead.stats == here.stats and ahead.stats["kept"] > PAIRS
    assert psutil.Process().children(recursive=True) == []  # the worker did not outlive the iterator
    resumed = make(corpus, tok, prefetch=True, position=here.position_after(45))
    assert take(resumed, 30) == take(make(corpus, tok, prefetch=False), 75)[45:]
    shard = {"rank": 1, "world_size": 2}  # a DDP process's share, read on past its first chunk by the worker
    assert take(make(corpus, tok, prefetch=True, **shard), 60) == take(make(corpus, tok, prefetch=False, **shard), 60)


def test_chunks_are_prepared_ahead_by_a_worker_only_where_training_leaves_a_core_idle(monkeypatch):
    """On the CPU with a torch thread per core (times the processes), the worker's chunk would take its CPU from
    training: the training process prepares every chunk; with a core to spare, or on a GPU, the worker does."""
    import torch

    import training.data.parallel as parallel

    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert not prefetch_pays(on_cpu=True) and prefetch_pays(on_cpu=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert prefetch_pays(on_cpu=True) and not prefetch_pays(on_cpu=True, processes=2)


def test_a_stream_resumed_after_the_last_batch_of_a_one_chunk_epoch_goes_on_with_the_next_epoch(corpus, tok):
    """A position past the last batch of a chunk that is the whole epoch: the resumed stream starts the next epoch."""
    batches = len(one_epoch(make(corpus, tok, chunk_pairs=1000)))
    straight = take(make(corpus, tok, chunk_pairs=1000), batches + 5)
    first = make(corpus, tok, chunk_pairs=1000)
    take(first, batches)
    position = first.position_after(batches)
    assert (position["epoch"], position["chunk"], position["batch"]) == (0, 0, batches)
    assert take(make(corpus, tok, chunk_pairs=1000, position=position), 5) == straight[batches:]


def test_a_resumed_streaming_run_ends_with_the_uninterrupted_weights(tmp_path, corpus):
    """training.train --streaming: 12 steps straight, and the same run resumed from its step-6 checkpoint: the same
    parameters. Dropout is on, so the RNG state must come back at the point the uninterrupted run had it (the data
    loader of a stream must not draw its base seed from the global RNG after Trainer restored it), and the stream
    position too. Tolerance as the map-style test in test_train_script.py; Adam's ε is 1e-3 as in its DDP test."""
    import torch
    from safetensors.torch import load_file

    from training.train import main as train_main

    tiny = tmp_path / "model.json"
    base = json.loads((Path(__file__).resolve().parent.parent / "configuration" / "tiny.json").read_text())
    tiny.write_text(json.dumps({**base, "d_model": 32, "d_ff": 64}))
    assert base["p_drop"] > 0
    common = ["--model_config", str(tiny), "--train_file", str(corpus), "--streaming", "--stream_chunk_pairs", "100"]
    common += ["--vocab_size", "300", "--max_tokens_per_step", "600", "--warmup_steps", "4", "--logging_steps", "3"]
    common += ["--eval_steps", "1000", "--seed", "2", "--save_steps", "6", "--save_total_limit", "10"]
    common += ["--adam_epsilon", "1e-3", "--max_steps", "12", "--device", "cpu"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    summary = train_main([*common, "--output_dir", str(straight)])
    assert summary["steps"] == 12
    # the first step (the stream's first chunk included) timed apart from the 11 after it
    assert 0 < summary["first_step_train_seconds"] < summary["train_seconds"]
    # reported (a positive whole number); how it compares with the whole run's rate is timing, not asserted here
    assert isinstance(summary["steady_tokens_per_second"], int) and summary["steady_tokens_per_second"] > 0
    assert summary["data_preparation"]["stream_prefetch"] is prefetch_pays(on_cpu=True)
    position = load_position(straight / "checkpoint-6", 0)
    assert position is not None and position["consumed"] == 6 and position["chunk"] > 0  # resumed past a chunk
    resumed.mkdir()
    shutil.copytree(straight / "tokenizer", resumed / "tokenizer")
    shutil.copytree(straight / "checkpoint-6", resumed / "checkpoint-6")
    assert train_main([*common, "--output_dir", str(resumed), "--resume"])["steps"] == 12
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=key)


def test_ddp_shards_split_the_pairs_between_processes(corpus, tok):
    """Two processes' streams hold disjoint pairs (pairs r, r + 2, ...) whose union is the whole corpus."""

    whole = [pair(f) for batch in one_epoch(make(corpus, tok)) for f in batch]
    ranks = [[pair(f) for batch in one_epoch(make(corpus, tok, rank=r, world_size=2)) for f in batch] for r in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == sorted(whole)
    assert abs(len(ranks[0]) - len(ranks[1])) <= 0.1 * len(whole)
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        make(corpus, tok, rank=2, world_size=2)


def test_the_bpe_of_a_stream_is_reused_for_the_same_files_and_vocabulary_and_learnt_again_when_either_changes(
    tmp_path, corpus, monkeypatch
):
    """--streaming's BPE is cached like the map-style one: a second run on the same files loads it; a change of the
    files' content, of the vocabulary size or of the pairs it learns from learns a new one."""
    import datasets

    from training.data.prepare import stream_bpe

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    files = tmp_path / "train"
    for lang in ("en", "de"):
        shutil.copy(f"{corpus}.{lang}", f"{files}.{lang}")
    base = {"train_file": str(files), "source_lang": "en", "target_lang": "de", "vocab_size": 300, "bpe_max_pairs": 500}

    def bpe(**changes):
        s = {**base, **changes}
        return stream_bpe(stream_parallel(train_file=s["train_file"]), s)

    first, info = bpe()
    assert info["cached"] is False
    again, info = bpe()
    assert info["cached"] is True and again.get_vocab() == first.get_vocab()
    assert bpe(vocab_size=350)[1]["cached"] is False
    assert bpe(bpe_max_pairs=400)[1]["cached"] is False
    for lang, text in (("en", "A new line."), ("de", "Eine neue Zeile.")):
        with open(f"{files}.{lang}", "a", encoding="utf-8") as f:
            f.write(text + "\n")
    assert bpe()[1]["cached"] is False  # the files changed
    assert bpe()[1]["cached"] is True
