"""Token-budget batches (§5.1): the sampler's budget and order, DDP sharding and resume through accelerate, and
the Trainer integration, including the per-target-token loss normalisation across gradient accumulation."""

import copy

import datasets
import numpy as np
import pytest
import torch
from accelerate.data_loader import BatchSamplerShard, prepare_data_loader, skip_first_batches
from tokenizers import Tokenizer, models, pre_tokenizers
from torch.utils.data import DataLoader
from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerFast, Seq2SeqTrainer, Seq2SeqTrainingArguments

from modeling_vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from training.trainer.batching import (
    BudgetCheckedCollator,
    TokenBudgetBatchSampler,
    TokenBudgetTrainerMixin,
    _let_set_epoch_reach,
)

from tiny_runs import cpu_trainer_args

VOCAB = 30


def padded(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def assert_within_budget(batch: list[int], src, tgt, max_tokens: int, multiple: int = 1) -> None:
    """Padding counted: every row of the batch is as long as its longest row, rounded up to the multiple."""
    assert len(batch) * padded(max(src[i] for i in batch), multiple) <= max_tokens
    assert len(batch) * padded(max(tgt[i] for i in batch), multiple) <= max_tokens


# ---- the sampler ----


@pytest.mark.parametrize("seed", range(40))
def test_every_batch_keeps_the_budget_with_padding_and_every_pair_comes_once(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    longest = int(rng.integers(1, 80))
    src = rng.integers(1, longest + 1, n).tolist()
    tgt = np.clip(np.array(src) + rng.integers(-20, 21, n), 1, None).tolist()  # correlated, as in translation
    multiple = int(rng.choice([1, 1, 8]))
    max_tokens = padded(max(max(src), max(tgt)), multiple) * int(rng.integers(1, 12)) + int(rng.integers(0, 30))
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens, seed=seed, pad_to_multiple_of=multiple)
    for epoch in (0, 3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(i for b in batches for i in b) == list(range(n))  # each pair exactly once per epoch
        for batch in batches:
            assert_within_budget(batch, src, tgt, max_tokens, multiple)
        # batches are runs of the (source, target)-length order (lengths as padded): their ranges do not interleave
        keyed = [[(padded(src[i], multiple), padded(tgt[i], multiple)) for i in b] for b in batches]
        keyed.sort(key=lambda keys: (min(keys), max(keys)))
        for before, after in zip(keyed, keyed[1:], strict=False):
            assert max(before) <= min(after)


def test_padding_is_counted_not_just_tokens():
    # 2 + 2 + 2 + 5 = 11 real tokens fit 12, but padded to the longest they are 4 · 5 = 20
    sampler = TokenBudgetBatchSampler([2, 2, 2, 5], [1, 1, 1, 1], max_tokens=12, shuffle=False)
    assert list(sampler) == [[0, 1, 2], [3]]
    # the target side counts too, and the longer side of a batch decides
    sampler = TokenBudgetBatchSampler([1, 1, 1, 1], [2, 2, 2, 5], max_tokens=12, shuffle=False)
    assert list(sampler) == [[0, 1, 2], [3]]


def test_batches_are_filled_greedily_up_to_the_budget():
    sampler = TokenBudgetBatchSampler([5] * 10, [3] * 10, max_tokens=12, shuffle=False)  # 2 · 5 ≤ 12 < 3 · 5
    assert [len(b) for b in sampler] == [2] * 5
    sampler = TokenBudgetBatchSampler([5] * 10, [3] * 10, max_tokens=50, shuffle=False)
    assert [len(b) for b in sampler] == [10]


def _greedy_bounds(src: list[int], tgt: list[int], max_tokens: int) -> list[int]:
    """The greedy cut pair by pair: a pair opens a new batch when adding it would exceed the budget."""
    starts, n, max_src, max_tgt = [0], 0, 0, 0
    for i, (s, t) in enumerate(zip(src, tgt, strict=True)):
        if (n + 1) * max(max_src, s) > max_tokens or (n + 1) * max(max_tgt, t) > max_tokens:
            starts.append(i)
            n, max_src, max_tgt = 1, s, t
        else:
            n, max_src, max_tgt = n + 1, max(max_src, s), max(max_tgt, t)
    return [*starts, len(src)]


@pytest.mark.parametrize("seed", range(6))
def test_the_batch_cut_is_the_pair_by_pair_greedy_cut(seed):
    """The numpy cut (batch by batch) gives the bounds of the pair-by-pair greedy cut on sorted sources, with
    targets in any order, budgets from one longest pair to many pairs, and the lengths 1 and max_tokens."""
    rng = np.random.default_rng(seed)
    for max_tokens in (7, 40, 300, 3000):
        n = int(rng.integers(1, 3000))
        src = np.sort(rng.integers(1, max_tokens + 1, n) // int(rng.integers(1, 8))).clip(1)
        tgt = rng.integers(1, max_tokens + 1, n) // int(rng.integers(1, 8))
        tgt = tgt.clip(1)
        src[-1], tgt[0] = max_tokens, max_tokens if seed % 2 else tgt[0]
        bounds = TokenBudgetBatchSampler._cut(src.astype(np.int64), tgt.astype(np.int64), max_tokens)
        assert bounds.tolist() == _greedy_bounds(src.tolist(), tgt.tolist(), max_tokens)


def test_the_packed_sort_is_lexsorts_order():
    """The sampler's order (one argsort of a packed key) is lexsort's by (source, target, tie-break), and lexsort
    itself is used where the packed key would not fit in 64 bits."""
    from training.trainer import batching

    rng = np.random.default_rng(0)
    for n, longest in ((5000, 3), (5000, 300), (3, 2**30)):  # 2**30 · 2**30 · 3 overflows: lexsort's own path
        src, tgt = rng.integers(0, longest, n, dtype=np.int64), rng.integers(0, longest, n, dtype=np.int64)
        tie_break = rng.permutation(n)
        expected = np.lexsort((tie_break, tgt, src))
        assert np.array_equal(batching._sorted_order(src, tgt, tie_break), expected)


def test_pad_to_multiple_of_rounds_lengths_up_before_counting():
    assert len(TokenBudgetBatchSampler([5, 5], [5, 5], max_tokens=15)) == 1  # 2 · 5 = 10
    assert len(TokenBudgetBatchSampler([5, 5], [5, 5], max_tokens=15, pad_to_multiple_of=8)) == 2  # 2 · 8 = 16


def test_order_is_reproducible_for_the_same_seed_and_epoch_and_changes_with_the_epoch():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 30, 500).tolist(), rng.integers(1, 30, 500).tolist()
    first = TokenBudgetBatchSampler(src, tgt, max_tokens=120, seed=7)
    epoch0 = list(first)
    first.set_epoch(1)
    epoch1 = list(first)
    assert len(epoch0) > 20
    assert epoch1 != epoch0
    assert sorted(map(tuple, epoch1)) == sorted(map(tuple, epoch0))  # the same batches, another order
    first.set_epoch(0)
    assert list(first) == epoch0
    again = TokenBudgetBatchSampler(src, tgt, max_tokens=120, seed=7)  # a new process, the same arguments
    again.set_epoch(1)
    assert list(again) == epoch1
    other = TokenBudgetBatchSampler(src, tgt, max_tokens=120, seed=8)
    assert list(other) != epoch0


def test_without_shuffle_batches_come_shortest_first_in_every_epoch():
    rng = np.random.default_rng(1)
    src, tgt = rng.integers(1, 30, 200).tolist(), rng.integers(1, 30, 200).tolist()
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=90, shuffle=False)
    batches = list(sampler)
    firsts = [(src[b[0]], tgt[b[0]]) for b in batches]
    assert firsts == sorted(firsts)
    sampler.set_epoch(5)
    assert list(sampler) == batches


@pytest.mark.parametrize(
    ("src", "tgt", "max_tokens", "kwargs", "message"),
    [
        (
            [3, 4, 2, 12],
            [3, 4, 2, 5],
            10,
            {},
            r"max_tokens \(10\) is smaller than the longest allowed sentence \(12 tokens, index 3\)",
        ),
        (
            [3, 4],
            [9, 2],
            8,
            {},
            r"max_tokens \(8\) is smaller than the longest allowed sentence \(9 tokens, index 0\)",
        ),
        ([5, 5], [5, 5], 7, {"pad_to_multiple_of": 8}, r"\(8 tokens after padding to a multiple of 8, index 0\)"),
        ([3], [3], 0, {}, "max_tokens must be a positive integer, got 0"),
        ([3], [3], -5, {}, "max_tokens must be a positive integer, got -5"),
        ([3, 4], [3], 10, {}, "src_lens and tgt_lens must be two lists of the same length"),
        ([], [], 10, {}, "no sentence pairs to batch"),
        ([3, 0], [3, 3], 10, {}, "pair 1 has source length 0"),
        ([3], [3], 10, {"pad_to_multiple_of": 0}, "pad_to_multiple_of must be a positive integer"),
        ([3], [3], 10, {"seed": -1}, "seed must be a non-negative integer"),
    ],
)
def test_sampler_refuses_a_budget_that_contradicts_the_data(src, tgt, max_tokens, kwargs, message):
    with pytest.raises(ValueError, match=message):
        TokenBudgetBatchSampler(src, tgt, max_tokens, **kwargs)


# ---- DDP sharding and resume, through accelerate's own wrappers ----


def lengths(n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, 25, n).tolist(), rng.integers(1, 25, n).tolist()


@pytest.mark.parametrize(("n", "processes"), [(300, 2), (301, 2), (300, 3)])
def test_batch_sampler_shard_gives_ranks_different_batches_and_equal_counts(n, processes):
    src, tgt = lengths(n)
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=100, seed=3)
    sampler.set_epoch(2)
    epoch = list(sampler)
    shards = [
        list(
            BatchSamplerShard(sampler, num_processes=processes, process_index=r, split_batches=False, even_batches=True)
        )
        for r in range(processes)
    ]
    per_rank = -(-len(epoch) // processes)
    assert [len(s) for s in shards] == [per_rank] * processes  # every rank takes the same number of steps
    assert [len(BatchSamplerShard(sampler, processes, r)) for r in range(processes)] == [per_rank] * processes
    dealt = [batch for step in zip(*shards, strict=True) for batch in step]  # round-robin: rank r gets r, r+P, ...
    assert dealt[: len(epoch)] == epoch  # different batches on every rank, all of them dealt out
    short = -len(epoch) % processes  # even_batches: the ranks that would run short re-use the epoch's first batches
    assert dealt[len(epoch) :] == epoch[:short]
    for batch in dealt:
        assert_within_budget(batch, src, tgt, 100)


def trainer_epoch(dataloader, epoch: int, skip: int = 0) -> list[list[int]]:
    """What Trainer._run_epoch does with the prepared loader."""
    if skip:
        dataloader = skip_first_batches(dataloader, skip)
    if hasattr(dataloader, "set_epoch"):
        dataloader.set_epoch(epoch)
    underlying = getattr(getattr(dataloader, "batch_sampler", None), "batch_sampler", None)
    if hasattr(underlying, "set_epoch"):
        underlying.set_epoch(epoch)
    return [batch for batch in dataloader]


def prepared_loader(src, tgt, processes: int, rank: int):
    """A fresh process's loader: our sampler in a DataLoader, prepared as Accelerator.prepare does it."""
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=100, seed=11)
    loader = DataLoader(list(range(len(src))), batch_sampler=sampler, collate_fn=list)
    prepared = prepare_data_loader(loader, num_processes=processes, process_index=rank, even_batches=True)
    _let_set_epoch_reach(prepared, sampler)
    return prepared


@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize(("epoch", "skip"), [(0, 3), (1, 3), (2, 5)])
def test_resume_skips_the_seen_batches_and_continues_in_the_same_order(processes, epoch, skip):
    src, tgt = lengths(400, seed=5)
    for rank in range(processes):
        uninterrupted = prepared_loader(src, tgt, processes, rank)
        run = [trainer_epoch(uninterrupted, e) for e in range(epoch + 1)]
        resumed = trainer_epoch(prepared_loader(src, tgt, processes, rank), epoch, skip=skip)  # a new process
        assert len(run[epoch]) > skip + 3
        assert resumed == run[epoch][skip:]
        if epoch > 0:  # the test can tell epochs apart: another epoch's order would not match
            assert run[0][skip:] != run[epoch][skip:]


# ---- Trainer integration ----


def tokenizer() -> PreTrainedTokenizerFast:
    """A real fast tokenizer (word level, built offline) so DataCollatorForSeq2Seq pads as it will in training."""
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, VOCAB)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def tiny_model(seed: int = 0) -> VaswaniForConditionalGeneration:
    torch.manual_seed(seed)
    config = VaswaniConfig(vocab_size=VOCAB, d_model=16, d_ff=32, h=2, encoder_layers=1, decoder_layers=1, p_drop=0.0)
    return VaswaniForConditionalGeneration(config)


def rows(src_lens: list[int], tgt_lens: list[int], seed: int = 0) -> datasets.Dataset:
    """Tokenized pairs as the data part produces them: input_ids, attention_mask, labels, src_len, tgt_len."""
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in src_lens]
    labels = [torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in tgt_lens]
    return datasets.Dataset.from_dict(
        {
            "input_ids": ids,
            "attention_mask": [[1] * len(x) for x in ids],
            "labels": labels,
            "src_len": src_lens,
            "tgt_len": tgt_lens,
        }
    )


class RecordingTrainer(TokenBudgetTrainerMixin, Seq2SeqTrainer):
    """Records every micro-batch the model is trained on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[dict[str, torch.Tensor]] = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.seen.append({k: v.clone() for k, v in inputs.items()})
        return super().training_step(model, inputs, num_items_in_batch)


def recording(model, tmp_path, dataset, max_tokens: int, **settings) -> RecordingTrainer:
    """A RecordingTrainer on `dataset` with transformers' seq2seq collator; `settings` go to the CPU Trainer args."""
    return RecordingTrainer(
        model=model,
        args=args(tmp_path, **settings),
        train_dataset=dataset,
        data_collator=DataCollatorForSeq2Seq(tokenizer(), model=model, label_pad_token_id=-100),
        max_tokens=max_tokens,
    )


class FeatureKeys:
    """A collator wrapper that records the keys of every feature the collator is given."""

    def __init__(self, collator):
        self.collator, self.keys = collator, set()

    def __call__(self, features):
        for f in features:
            self.keys |= set(f)
        return self.collator(features)


def args(tmp_path, **overrides) -> Seq2SeqTrainingArguments:
    return cpu_trainer_args(tmp_path, **{"learning_rate": 1e-3, **overrides})


def pair_id(input_ids: torch.Tensor) -> tuple[int, ...]:
    return tuple(t for t in input_ids.tolist() if t != 1)  # the source ids without padding name the pair


@pytest.mark.parametrize("remove_unused_columns", [True, False])
def test_trainer_trains_on_token_budget_batches_shuffled_per_epoch(tmp_path, remove_unused_columns):
    src, tgt = lengths(60, seed=2)
    dataset = rows(src, tgt)
    ids = [tuple(x) for x in dataset["input_ids"]]
    assert len(set(ids)) == len(ids)
    model = tiny_model()
    collator = FeatureKeys(DataCollatorForSeq2Seq(tokenizer(), model=model, label_pad_token_id=-100))
    trainer = RecordingTrainer(
        model=model,
        args=args(tmp_path, max_steps=12, gradient_accumulation_steps=2, remove_unused_columns=remove_unused_columns),
        train_dataset=dataset,
        data_collator=collator,
        max_tokens=64,
        seed=5,
    )
    trainer.train()

    expected = TokenBudgetBatchSampler(src, tgt, max_tokens=64, seed=5)
    per_epoch = len(expected)
    assert 8 <= per_epoch <= 22  # more than one epoch in 12 steps of 2 micro-batches
    assert len(trainer.seen) == 24
    assert collator.keys == {"input_ids", "attention_mask", "labels"}  # the length columns never reach it
    for epoch in range(24 // per_epoch + 1):
        expected.set_epoch(epoch)
        want = [[ids[i] for i in batch] for batch in expected]
        got = [
            [pair_id(row) for row in b["input_ids"]] for b in trainer.seen[epoch * per_epoch : (epoch + 1) * per_epoch]
        ]
        assert got == want[: len(got)]  # the sampler's batches, in the sampler's order for that epoch
    first_epoch = [pair_id(row) for b in trainer.seen[:per_epoch] for row in b["input_ids"]]
    assert sorted(first_epoch) == sorted(ids)  # every pair once
    for batch in trainer.seen:
        assert set(batch) == {"input_ids", "attention_mask", "labels", "decoder_input_ids"}
        assert batch["input_ids"].numel() <= 64 and batch["labels"].numel() <= 64  # padding counted
        assert batch["decoder_input_ids"].shape == batch["labels"].shape


def test_resumed_trainer_continues_with_the_batches_of_the_uninterrupted_run(tmp_path):
    rng = np.random.default_rng(4)
    src, tgt = rng.integers(10, 13, 20).tolist(), rng.integers(10, 13, 20).tolist()  # 4 pairs per batch of 48
    dataset = rows(src, tgt)
    settings = {"max_steps": 5, "gradient_accumulation_steps": 2, "save_strategy": "steps", "save_steps": 4}
    model = tiny_model()
    full = recording(model, tmp_path, dataset, 48, **settings)
    per_epoch = len(TokenBudgetBatchSampler(src, tgt, max_tokens=48, seed=full.seed))
    assert per_epoch == 5  # 3 steps per epoch (2 + 2 + 1 micro-batches): step 4 is the first of epoch 1
    full.train()

    restarted = tiny_model(seed=123)  # other weights: the checkpoint must bring back the trained ones
    resumed = recording(restarted, tmp_path, dataset, 48, **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))

    after_step_4 = full.seen[-2:]  # step 5: micro-batches 2 and 3 of epoch 1
    assert [pair_id(r) for b in resumed.seen for r in b["input_ids"]] == [
        pair_id(r) for b in after_step_4 for r in b["input_ids"]
    ]
    for (name, a), b in zip(full.model.named_parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)  # same data, same order, same arithmetic


def test_loss_is_normalised_per_target_token_across_gradient_accumulation(tmp_path):
    """One step over two micro-batches of 4 and 12 target tokens equals one step over one batch of both.

    Plain SGD (lr 1, no momentum, no clipping, no weight decay), dropout 0, label smoothing 0.1: the update is
    -d(sum of the 16 token losses)/d(params) / 16 in both runs. Were each micro-batch averaged on its own and the
    two averages halved (Trainer without num_items_in_batch), the short batch's tokens would weigh 3 times more.
    """
    dataset = rows([3, 3, 7, 7], [2, 2, 6, 6], seed=9)
    base = tiny_model(seed=1)
    model_a, model_b = copy.deepcopy(base), copy.deepcopy(base)
    received: list[int] = []

    def record(module, positional, kwargs):
        received.append(int(kwargs["num_items_in_batch"]))

    model_a.register_forward_pre_hook(record, with_kwargs=True)
    settings = {"max_steps": 1, "optim": "sgd", "learning_rate": 1.0, "lr_scheduler_type": "constant"}
    settings |= {"max_grad_norm": 0.0, "train_sampling_strategy": "sequential"}

    accumulated = recording(model_a, tmp_path, dataset, 14, gradient_accumulation_steps=2, **settings)
    single = recording(model_b, tmp_path, dataset, 28, gradient_accumulation_steps=1, **settings)
    assert accumulated.model_accepts_loss_kwargs  # Trainer passes num_items_in_batch to this model's forward
    accumulated.train()
    single.train()
    assert [b["labels"].ne(-100).sum().item() for b in accumulated.seen] == [4, 12]  # two micro-batches
    assert [b["labels"].shape for b in single.seen] == [(4, 6)]  # one batch holding both
    assert received == [16, 16]  # the target tokens of the whole optimizer step, in both micro-batches

    # the update an independent computation expects: mean of the 16 token losses of the combined batch
    reference = copy.deepcopy(base)
    batch = single.seen[0]
    reference(**batch).loss.backward()
    wrong = copy.deepcopy(base)  # per-micro-batch means, averaged over the two micro-batches
    for b in accumulated.seen:
        (wrong(**b).loss / 2).backward()
    for (name, p0), pa, pb, pr, pw in zip(
        base.named_parameters(),
        model_a.parameters(),
        model_b.parameters(),
        reference.parameters(),
        wrong.parameters(),
        strict=True,
    ):
        step_a, step_b, expected = pa - p0, pb - p0, -pr.grad
        # float32: p0 - g is rounded to the parameter's precision (|p| < 2, so half an ulp ≤ 1.2e-7), and the
        # runs sum the same terms in another order over other padding (relative 1e-5)
        torch.testing.assert_close(step_a, expected, rtol=1e-5, atol=2.5e-7, msg=name)
        torch.testing.assert_close(step_b, expected, rtol=1e-5, atol=2.5e-7, msg=name)
        if expected.abs().max() > 1e-3:  # the test can fail: the wrong normalisation is far outside the tolerance
            assert (expected + pw.grad).abs().max() > 100 * (2.5e-7 + 1e-5 * expected.abs().max()), name
    assert max(p.abs().max() for p in base.parameters()) < 2


# ---- configuration errors, before training ----


def make(tmp_path, dataset, **kwargs):
    model = tiny_model()
    overrides = kwargs.pop("args", {})
    return RecordingTrainer(
        model=model,
        args=args(tmp_path, max_steps=1, **overrides),
        train_dataset=dataset,
        data_collator=DataCollatorForSeq2Seq(tokenizer(), model=model, label_pad_token_id=-100),
        **{"max_tokens": 64, **kwargs},
    )


def test_trainer_refuses_max_tokens_below_the_longest_pair_at_construction(tmp_path):
    dataset = rows([3, 5, 20, 4], [3, 9, 4, 4])
    with pytest.raises(ValueError, match=r"max_tokens \(16\) is smaller than the longest allowed sentence \(20 tokens"):
        make(tmp_path, dataset, max_tokens=16)
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        make(tmp_path, dataset, max_tokens=0)


@pytest.mark.parametrize(
    ("change", "kwargs", "message"),
    [
        (lambda d: d.remove_columns("tgt_len"), {}, r"has no \['tgt_len'\] column"),
        (lambda d: d.map(lambda r: {"src_len": r["src_len"] + 1}), {}, "row 0 of the training dataset has src_len=4"),
        (lambda d: d, {"args": {"train_sampling_strategy": "group_by_length"}}, "another way of batching"),
        (lambda d: d, {"args": {"auto_find_batch_size": True}}, "lower max_tokens instead"),
        (lambda d: d.with_format("torch").to_list(), {}, "need the training dataset as a datasets.Dataset"),
    ],
)
def test_trainer_refuses_data_or_settings_it_cannot_batch_by_tokens(tmp_path, change, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(tmp_path, change(rows([3, 5, 4], [3, 5, 4])), **kwargs)


def test_collated_batches_over_the_budget_are_refused():
    lying = [{"input_ids": [5] * 10, "labels": [6] * 2}, {"input_ids": [5] * 10, "labels": [6] * 2}]  # said 2 + 2
    collate = BudgetCheckedCollator(DataCollatorForSeq2Seq(tokenizer(), label_pad_token_id=-100), max_tokens=8)
    with pytest.raises(ValueError, match=r"input_ids of shape \(2, 10\), 20 tokens > max_tokens \(8\)"):
        collate(lying)
    assert collate([{"input_ids": [5] * 4, "labels": [6] * 3}])["input_ids"].shape == (1, 4)


@pytest.mark.parametrize(
    "feature, name, bad",
    [
        ({"input_ids": [5, 6, VOCAB], "labels": [6, 2]}, "input_ids", VOCAB),
        ({"input_ids": [5, -3], "labels": [6, 2]}, "input_ids", -3),
        ({"input_ids": [5, 6], "labels": [6, VOCAB + 7]}, "labels", VOCAB + 7),
    ],
    ids=["input_ids-high", "input_ids-negative", "labels"],
)
def test_collated_batches_with_token_ids_outside_the_vocabulary_are_refused(feature, name, bad):
    """Given the vocabulary size, the collator checks every id tensor on the CPU; -100 (padded labels) passes."""
    collate = BudgetCheckedCollator(DataCollatorForSeq2Seq(tokenizer(), label_pad_token_id=-100), 64, VOCAB)
    good = {"input_ids": [5, 6, 7, 8], "labels": [6, 7, 8, 9, 2]}  # pads the other row's labels with -100
    with pytest.raises(ValueError, match=rf"^{name} holds token id {bad}, outside \[0, vocab_size={VOCAB}\)$"):
        collate([good, feature])
    batch = collate([good, {"input_ids": [5, 6], "labels": [6, 2]}])
    assert (batch["labels"] == -100).any()
    assert BudgetCheckedCollator(collate.collate_fn, 64)([good, feature])  # no vocabulary size given: no check


def test_collated_decoder_input_ids_outside_the_vocabulary_are_refused():
    """A collator that passes decoder_input_ids through (DataCollatorForSeq2Seq makes them from the labels)."""
    stack = lambda features: {k: torch.tensor([f[k] for f in features]) for k in features[0]}  # noqa: E731
    collate = BudgetCheckedCollator(stack, 64, VOCAB)
    rows_ = [{"input_ids": [5, 6], "decoder_input_ids": [0, 7]}, {"input_ids": [5, 6], "decoder_input_ids": [0, VOCAB]}]
    with pytest.raises(ValueError, match=rf"^decoder_input_ids holds token id {VOCAB}, outside"):
        collate(rows_)
    assert collate(rows_[:1])["decoder_input_ids"].tolist() == [[0, 7]]


def test_trainer_refuses_a_batch_with_an_unknown_token_id_before_the_step(tmp_path):
    """The trainer's collator knows the model's vocabulary: the bad batch stops before any training step runs (the
    check an accelerator's training step relies on, since `forward` checks ids there only outside autograd)."""
    dataset = rows([3, 5, 4], [3, 5, 4]).map(
        lambda row, i: {"input_ids": row["input_ids"][:-1] + [VOCAB + 3]} if i == 1 else row, with_indices=True
    )
    trainer = make(tmp_path, dataset)
    with pytest.raises(ValueError, match=rf"input_ids holds token id {VOCAB + 3}, outside \[0, vocab_size={VOCAB}\)"):
        trainer.train()
    assert trainer.seen == []  # the collator refused it, not the model's forward inside a step


def test_evaluation_uses_length_sorted_token_budget_batches(tmp_path):
    src, tgt = lengths(40, seed=6)
    dataset = rows(src, tgt)
    trainer = make(tmp_path, rows([3, 4], [3, 4]), eval_dataset=dataset, eval_max_tokens=50)
    loader = trainer.get_eval_dataloader()
    batches = list(loader)
    expected = list(TokenBudgetBatchSampler(src, tgt, max_tokens=50, shuffle=False))
    assert len(batches) == len(expected)
    ids = [tuple(x) for x in dataset["input_ids"]]
    assert [[pair_id(r) for r in b["input_ids"]] for b in batches] == [[ids[i] for i in b] for b in expected]
    assert all(b["input_ids"].numel() <= 50 and b["labels"].numel() <= 50 for b in batches)
    assert set(batches[0]) == {"input_ids", "attention_mask", "labels", "decoder_input_ids"}
    metrics = trainer.evaluate()
    assert np.isfinite(metrics["eval_loss"])
