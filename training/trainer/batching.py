"""Token-budget batches inside `Trainer`: what fairseq calls `--max-tokens`.

§5.1: "Sentence pairs were batched together by approximate sequence length. Each training batch contained a set
of sentence pairs containing approximately 25000 source tokens and 25000 target tokens." §5.2: on 8 GPUs, so
about 3,125 + 3,125 tokens per GPU and optimizer step.

Why this is written here: `Trainer` only makes batches of a fixed number of examples (`per_device_train_batch_size`;
its "group_by_length" and "batch_rebalance" strategies also fix the count of examples per step), and neither
transformers, accelerate nor datasets has a sampler that caps the tokens of a batch. `TokenBudgetBatchSampler`
is that sampler; `TokenBudgetTrainerMixin` puts it into Trainer's data loading, through `accelerator.prepare` like
Trainer's own loaders, so that DDP sharding, gradient accumulation, resume and per-token loss normalisation keep
working. What was checked in the installed transformers and accelerate (setup.cfg bounds the versions; tests/test_batching.py
and tests/test_train_script.py exercise each point, so a release that changes one fails them):

- DDP. `Accelerator.prepare` wraps the batch sampler in `BatchSamplerShard`:
  process r takes batches r, r + P, r + 2P, ... of one common order (every process builds the same batches from
  the same lengths and seed), so processes get different batches. Our sampler has no `batch_size`, which
  `BatchSamplerShard` treats as batches of varying size. With `even_batches=True`
  (Trainer's default) every process yields ceil(B / P) batches: when P does not divide the number of batches B,
  the processes that would run short take the first batches of the epoch again, so all
  processes take the same number of steps; a few pairs are then seen twice in that epoch. `even_batches=False`
  would give processes different step counts (a DDP hang) and `split_batches`/`dispatch_batches` need a fixed
  batch size; those settings are refused.
- Epochs. Trainer calls `train_dataloader.set_epoch(epoch)` and then `set_epoch` on
  `train_dataloader.batch_sampler.batch_sampler`; accelerate's
  `DataLoaderShard.set_epoch` reaches `batch_sampler`, `batch_sampler.sampler` and
  `batch_sampler.batch_sampler.sampler`. On one process our sampler is the
  loader's batch sampler and both reach it. Under DDP after a resume the chain is
  SkipBatchSampler → BatchSamplerShard → ours and neither reaches it, so the prepared loader's `BatchSamplerShard`
  gets a `sampler` attribute pointing at our sampler (`_let_set_epoch_reach`), which accelerate's third branch uses.
- Resume. Trainer skips `steps_trained_in_current_epoch · gradient_accumulation_steps` batches with accelerate's
  `skip_first_batches`, which wraps the prepared loader's batch sampler in a
  `SkipBatchSampler`; since our batches depend only on (lengths, seed) and
  their order only on (seed, epoch), the resumed run sees exactly the batches the uninterrupted run would have.
- Loss normalisation. The model's `forward` takes `**kwargs`, so Trainer sets `model_accepts_loss_kwargs`,
  counts the target tokens (`labels != -100`) of all micro-batches of one optimizer step, sums that count over
  processes when `average_tokens_across_devices` (default True) and passes it as `num_items_in_batch` to
  `forward`. The model divides
  each micro-batch's summed token loss by it; Trainer then does not divide by the accumulation steps
  and multiplies by the number of processes, which DDP's gradient
  averaging undoes. The gradient is d(sum of token losses of the global batch) / (its target tokens).
  Trainer's own `LabelSmoother` (label_smoothing_factor > 0) normalises by `num_items_in_batch` the same way;
  `VaswaniTrainer` hands ε_ls to the model's loss instead, so the fused loss applies (training/trainer/trainer.py).
"""

import logging
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import datasets
import numpy as np
import torch
from accelerate.data_loader import BatchSamplerShard
from torch.utils.data import DataLoader, Sampler
from transformers.trainer_utils import seed_worker

from modeling_vaswani.checks_vaswani import check_token_ids
from training.common.checks import require_positive_integer

logger = logging.getLogger(__name__)

# First word of the numpy seed sequences, so the tie-break stream and the per-epoch order streams never coincide
# (numpy's SeedSequence pads entropy with zeros: [s] and [s, 0] are the same seed).
_TIE_BREAK_STREAM, _ORDER_STREAM = 1, 2


def _padded(lengths: np.ndarray, multiple: int) -> np.ndarray:
    return -(-lengths // multiple) * multiple


def _sorted_order(src: np.ndarray, tgt: np.ndarray, tie_break: np.ndarray) -> np.ndarray:
    """`np.lexsort((tie_break, tgt, src))` for non-negative lengths and a permutation `tie_break`: one argsort of
    the key (src, tgt, tie_break) packed into an int64 where it fits (every key differs, so the order is the same,
    and one sort of one key is quicker than lexsort's three), lexsort itself where it does not."""
    n, src_max, tgt_max = len(src), int(src.max()), int(tgt.max())
    if (src_max + 1) * (tgt_max + 1) * max(n, 1) >= 2**63:
        return np.lexsort((tie_break, tgt, src))
    return np.argsort((src * (tgt_max + 1) + tgt) * n + tie_break)


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of sentence pairs of similar length, each within a token budget per side, padding counted (§5.1).

    Lengths are first rounded up to `pad_to_multiple_of`, as the collator pads them. Pairs are sorted by (source
    length, target length), ties broken by a random permutation seeded with `seed`, and cut greedily into batches:
    a batch of n pairs holds n · max(source length) ≤ `max_tokens` and n · max(target length) ≤ `max_tokens`.
    The batches are built once (as fairseq does); each epoch yields them in an order drawn from (`seed`, epoch),
    so the same (seed, epoch) always gives the same batches in the same order (exact resume) and `set_epoch`
    changes the order. With `shuffle=False` they come shortest first. `len()` is the number of batches.

    Lengths are token counts of the tensors the model gets (`len(input_ids)`, `len(labels)`, EOS included).
    """

    def __init__(
        self,
        src_lens: Sequence[int],
        tgt_lens: Sequence[int],
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        pad_to_multiple_of: int = 1,
    ):
        self.max_tokens = require_positive_integer("max_tokens", max_tokens)
        self.pad_to_multiple_of = require_positive_integer("pad_to_multiple_of", pad_to_multiple_of)
        if not isinstance(seed, int | np.integer) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.seed, self.shuffle, self.epoch = int(seed), bool(shuffle), 0

        src, tgt = np.asarray(src_lens), np.asarray(tgt_lens)
        if src.ndim != 1 or tgt.ndim != 1 or len(src) != len(tgt):
            raise ValueError(
                f"src_lens and tgt_lens must be two lists of the same length, got shapes {src.shape} and {tgt.shape}"
            )
        if len(src) == 0:
            raise ValueError("no sentence pairs to batch: src_lens and tgt_lens are empty")
        if not (np.issubdtype(src.dtype, np.integer) and np.issubdtype(tgt.dtype, np.integer)):
            raise ValueError(f"lengths must be integers, got dtypes {src.dtype} and {tgt.dtype}")
        for name, lengths in (("source", src), ("target", tgt)):
            if lengths.min() < 1:
                i = int(lengths.argmin())
                raise ValueError(f"pair {i} has {name} length {int(lengths[i])}; every sentence has at least 1 token")
        src, tgt = (
            _padded(src.astype(np.int64), self.pad_to_multiple_of),
            _padded(tgt.astype(np.int64), self.pad_to_multiple_of),
        )
        longest = np.maximum(src, tgt)
        if longest.max() > self.max_tokens:
            i = int(longest.argmax())
            padding = (
                f" after padding to a multiple of {self.pad_to_multiple_of}" if self.pad_to_multiple_of > 1 else ""
            )
            raise ValueError(
                f"max_tokens ({self.max_tokens}) is smaller than the longest allowed sentence ({int(longest[i])} "
                f"tokens{padding}, index {i}): no batch can hold it; raise max_tokens or lower the length limit"
            )

        tie_break = np.random.default_rng([_TIE_BREAK_STREAM, self.seed]).permutation(len(src))
        self._order = _sorted_order(src, tgt, tie_break)  # by source length, then target length, then at random
        sorted_src, sorted_tgt = src[self._order], tgt[self._order]
        self._bounds = self._cut(sorted_src, sorted_tgt, self.max_tokens)
        starts, sizes = self._bounds[:-1], np.diff(self._bounds)
        # per batch (in built order): source + target tokens after padding, n · max(src) + n · max(tgt)
        self.padded_tokens = sizes * (np.maximum.reduceat(sorted_src, starts) + np.maximum.reduceat(sorted_tgt, starts))

    @staticmethod
    def _cut(src: np.ndarray, tgt: np.ndarray, max_tokens: int) -> np.ndarray:
        """Greedy cut of the pairs sorted by source length: a pair opens a new batch when adding it would exceed the
        budget. Batch by batch with numpy, not pair by pair in Python (with the packed sort, the sampler of 4.5M
        pairs takes 2.1-2.4 s instead of 7.9-8.2 s on this project's 2-core machine): from pair i on, every source
        has at least src[i] tokens, so the batch holds at most max_tokens // src[i] pairs; over those, a prefix of k pairs fits while k times its longest source and its longest target stay within the
        budget, which holds for a first run of k and then never again (both grow with k)."""
        n, starts, i = len(src), [0], 0
        while i < n:
            most = min(max_tokens // int(src[i]), n - i)  # ≥ 1: no pair is longer than max_tokens
            k = np.arange(1, most + 1)
            fits = k * np.maximum.accumulate(src[i : i + most]) <= max_tokens
            fits &= k * np.maximum.accumulate(tgt[i : i + most]) <= max_tokens
            i += most if fits[-1] else int(fits.argmin())
            starts.append(i)
        return np.array(starts, dtype=np.int64)

    def set_epoch(self, epoch: int) -> None:
        """Select the batch order of `epoch` (Trainer and accelerate call this before each epoch)."""
        if not isinstance(epoch, int | np.integer) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self._bounds) - 1

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            batch_order = np.random.default_rng([_ORDER_STREAM, self.seed, self.epoch]).permutation(len(self))
        else:
            batch_order = np.arange(len(self))
        for b in batch_order.tolist():
            yield self._order[self._bounds[b] : self._bounds[b + 1]].tolist()


class BudgetCheckedCollator:
    """Calls `collate_fn`, then refuses a batch whose padded `input_ids` or `labels` exceed `max_tokens`, or, given
    `vocab_size`, whose token ids fall outside [0, vocab_size) (labels: other than -100).

    The sampler trusts the length columns; this catches columns that do not match the tokenized pairs, or a
    collator that pads further than the sampler was told, at the first batch instead of as an out-of-memory. The
    token ids are checked here, on the CPU, once per batch: the model checks them in `forward` only where that costs
    no sync (modeling_vaswani/checks_vaswani.py), so a training step on an accelerator relies on this check.
    """

    def __init__(
        self,
        collate_fn: Callable[[list[dict[str, Any]]], dict[str, Any]],
        max_tokens: int,
        vocab_size: int | None = None,
    ):
        self.collate_fn, self.max_tokens, self.vocab_size = collate_fn, max_tokens, vocab_size

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.collate_fn(features)
        if self.vocab_size is not None:
            for key, ignore in (("input_ids", None), ("decoder_input_ids", None), ("labels", -100)):
                if isinstance(batch.get(key), torch.Tensor):
                    check_token_ids(batch[key], self.vocab_size, key, ignore_index=ignore)
        for key in ("input_ids", "labels"):
            value = batch.get(key)
            if isinstance(value, torch.Tensor) and value.numel() > self.max_tokens:
                raise ValueError(
                    f"a batch of {len(features)} pairs was collated to {key} of shape {tuple(value.shape)}, "
                    f"{value.numel()} tokens > max_tokens ({self.max_tokens}): the length columns do not match the "
                    "tokenized pairs, or the collator pads to a multiple the batch sampler was not given"
                )
        return batch


def _is_stream(dataset: Any) -> bool:
    """A training/data/streaming.py TokenBudgetStream (its batches are made as the data streams in)."""
    return hasattr(dataset, "position_after")


def _let_set_epoch_reach(dataloader: Any, sampler: TokenBudgetBatchSampler) -> None:
    """Under DDP, make accelerate's `DataLoaderShard.set_epoch` reach `sampler` through `BatchSamplerShard`.

    accelerate forwards `set_epoch` to `batch_sampler.sampler` and to `batch_sampler.batch_sampler.sampler`, never
    to a batch sampler inside `BatchSamplerShard`; Trainer forwards it one level down only, which misses it once
    `skip_first_batches` adds a `SkipBatchSampler` on a resume. Giving the shard a `sampler` attribute makes both paths land on ours.
    """
    shard = getattr(dataloader, "batch_sampler", None)
    if isinstance(shard, BatchSamplerShard) and shard.batch_sampler is sampler:
        shard.sampler = sampler


class TokenBudgetTrainerMixin:
    """Makes `Trainer`/`Seq2SeqTrainer` train on `TokenBudgetBatchSampler` batches of at most `max_tokens` tokens.

    Combine it before the Trainer class, e.g.
    `class VaswaniTrainer(TokenBudgetTrainerMixin, PaperScheduleTrainerMixin, Seq2SeqTrainer)`, and construct with
    `VaswaniTrainer(model=..., args=..., train_dataset=..., data_collator=..., max_tokens=...)`. Keyword arguments:

    - `max_tokens`: tokens per side, padding counted, per device and micro-batch. One optimizer step sees at most
      max_tokens · gradient_accumulation_steps · number of processes tokens per side (the paper: ~25,000).
    - `eval_max_tokens`: the same for evaluation batches (default `max_tokens`).
    - `seed`: batches and their order (default `TrainingArguments.data_seed`, else `TrainingArguments.seed`).
    - `src_len_column`, `tgt_len_column`: the int columns holding len(input_ids) and len(labels) of every row.

    The datasets must be `datasets.Dataset`s with the two length columns; they are read for the sampler and removed
    before Trainer's own column filtering, so the collator never sees them. `per_device_train_batch_size`,
    `dataloader_drop_last` and the train sampling strategy do not apply. Evaluation on one process uses length-sorted
    token-budget batches in a fixed order; under DDP it keeps Trainer's fixed-size batches, because accelerate can
    drop the pairs `even_batches` repeats only when batches have a fixed size (`gather_for_metrics` computes the
    remainder from `total_batch_size`), and repeated pairs would change BLEU. `get_test_dataloader` (`predict`) is
    Trainer's own and keeps the dataset's order.

    Use `DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)` as the collator (it pads input_ids
    with the tokenizer's pad id, labels with -100, and builds decoder_input_ids with the model's
    `prepare_decoder_input_ids_from_labels`); its `pad_to_multiple_of` is passed on to the sampler.
    """

    max_tokens: int
    eval_max_tokens: int
    seed: int

    def __init__(
        self,
        *args: Any,
        max_tokens: int,
        eval_max_tokens: int | None = None,
        seed: int | None = None,
        src_len_column: str = "src_len",
        tgt_len_column: str = "tgt_len",
        **kwargs: Any,
    ):
        self.max_tokens = require_positive_integer("max_tokens", max_tokens)
        self.eval_max_tokens = require_positive_integer(
            "eval_max_tokens", max_tokens if eval_max_tokens is None else eval_max_tokens
        )
        self.src_len_column, self.tgt_len_column = src_len_column, tgt_len_column
        super().__init__(*args, **kwargs)
        if seed is None:
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        self.seed = seed
        self._check_token_budget_config()
        # a config that contradicts itself (max_tokens below the longest pair) stops here, before training starts
        if self.train_dataset is not None and not _is_stream(self.train_dataset):
            self._lengths(self.train_dataset, "training", self.max_tokens)
        if self.eval_dataset is not None and self.accelerator.num_processes == 1:
            named = self.eval_dataset if isinstance(self.eval_dataset, dict) else {"evaluation": self.eval_dataset}
            for name, dataset in named.items():
                self._lengths(dataset, name, self.eval_max_tokens)

    def _check_token_budget_config(self) -> None:
        args, accelerator = self.args, self.accelerator
        if args.auto_find_batch_size:
            raise ValueError("auto_find_batch_size changes the number of examples per batch; lower max_tokens instead")
        if args.train_sampling_strategy in ("group_by_length", "batch_rebalance"):
            raise ValueError(
                f"train_sampling_strategy={args.train_sampling_strategy!r} is another way of batching; token-budget "
                "batches are already grouped by length. Use 'random' (shuffled batches) or 'sequential'"
            )
        if accelerator.split_batches or accelerator.dispatch_batches:
            raise ValueError(
                "split_batches and dispatch_batches need batches of a fixed size; with token-budget batches every "
                "process draws its own batches (leave both off)"
            )
        if accelerator.num_processes > 1 and not accelerator.even_batches:
            raise ValueError(
                "even_batches=False would give processes different numbers of token-budget batches, and DDP hangs "
                "when one process takes a step the others do not; leave even_batches on"
            )

    def _lengths(self, dataset: Any, description: str, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """The two length columns as arrays, checked against `max_tokens` and against the first tokenized rows."""
        columns = [self.src_len_column, self.tgt_len_column]
        if not isinstance(dataset, datasets.Dataset):
            raise ValueError(
                f"token-budget batches need the {description} dataset as a datasets.Dataset with columns {columns}, "
                f"got {type(dataset).__name__}"
            )
        missing = [c for c in columns if c not in dataset.column_names]
        if missing:
            raise ValueError(
                f"the {description} dataset has no {missing} column (its columns: {dataset.column_names}); "
                "token-budget batches need the source and target length of every pair"
            )
        if len(dataset) == 0:
            raise ValueError(f"the {description} dataset is empty")
        lengths = dataset.select_columns(columns).with_format("numpy")[:]
        src, tgt = np.asarray(lengths[columns[0]]), np.asarray(lengths[columns[1]])
        longest = np.maximum(_padded(src, self._pad_multiple()), _padded(tgt, self._pad_multiple()))
        if longest.max() > max_tokens:
            i = int(longest.argmax())
            raise ValueError(
                f"max_tokens ({max_tokens}) is smaller than the longest allowed sentence ({int(longest[i])} tokens, "
                f"index {i} of the {description} dataset): no batch can hold it; raise max_tokens or lower the "
                "length limit"
            )
        counted = {"input_ids": self.src_len_column, "labels": self.tgt_len_column}
        present = [c for c in counted if c in dataset.column_names]
        head = dataset.select(range(min(64, len(dataset)))).select_columns(present + columns)[:]
        for tokens_column in present:
            length_column = counted[tokens_column]
            for i, (tokens, n) in enumerate(zip(head[tokens_column], head[length_column], strict=True)):
                if len(tokens) != n:
                    raise ValueError(
                        f"row {i} of the {description} dataset has {length_column}={n} but {len(tokens)} "
                        f"{tokens_column}; the length columns must count the tokenized pairs"
                    )
        return src, tgt

    def _save_checkpoint(self, model, trial):
        """Trainer's checkpoint, plus the stream's position under `--streaming` (before the completion marker)."""
        super()._save_checkpoint(model, trial)
        if _is_stream(self.train_dataset):
            from pathlib import Path

            from training.data.streaming import save_position

            folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            consumed = self.state.global_step * self.args.gradient_accumulation_steps
            save_position(folder, self.args.process_index, self.train_dataset.position_after(consumed))

    def _vocab_size(self) -> int | None:
        """The model's vocabulary size, for the collator's token-id check (None: a model without one, unchecked)."""
        return getattr(getattr(self.model, "config", None), "vocab_size", None)

    def _pad_multiple(self) -> int:
        return getattr(self.data_collator, "pad_to_multiple_of", None) or 1

    def _token_budget_dataloader(
        self, dataset: Any, description: str, max_tokens: int, shuffle: bool, is_training: bool
    ) -> DataLoader:
        src, tgt = self._lengths(dataset, description, max_tokens)
        sampler = TokenBudgetBatchSampler(
            src, tgt, max_tokens, shuffle=shuffle, seed=self.seed, pad_to_multiple_of=self._pad_multiple()
        )
        # the length columns go first: Trainer's column filter keeps nothing the model's forward does not take,
        # but with remove_unused_columns=False it keeps everything, and the collator must not see them
        dataset = dataset.remove_columns([self.src_len_column, self.tgt_len_column])
        dataset = self._remove_unused_columns(dataset, description=description)
        args = self.args
        params: dict[str, Any] = {  # as Trainer._get_dataloader, with a batch sampler
            "batch_sampler": sampler,
            "collate_fn": BudgetCheckedCollator(self.data_collator, max_tokens, self._vocab_size()),
            "num_workers": args.dataloader_num_workers,
            "pin_memory": args.dataloader_pin_memory,
            "persistent_workers": args.dataloader_persistent_workers,
            "multiprocessing_context": args.dataloader_multiprocessing_context,
            "prefetch_factor": args.dataloader_prefetch_factor,
            "in_order": args.dataloader_in_order,
        }
        if is_training:
            params["worker_init_fn"] = partial(
                seed_worker, num_workers=args.dataloader_num_workers, rank=args.process_index
            )
        dataloader = self.accelerator.prepare(DataLoader(dataset, **params))
        _let_set_epoch_reach(dataloader, sampler)
        real = int(src.sum() + tgt.sum())
        logger.info(
            f"{description}: {len(sampler)} token-budget batches of at most {max_tokens} tokens per side from "
            f"{len(src)} pairs ({len(src) / len(sampler):.1f} pairs per batch, "
            f"{1 - real / int(sampler.padded_tokens.sum()):.1%} padding)"
        )
        return dataloader

    def get_train_dataloader(self) -> DataLoader:
        """Trainer's training loader, with token-budget batches shuffled per epoch (see the module docstring)."""
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        self._check_token_budget_config()
        if _is_stream(self.train_dataset):  # training/data/streaming.py: batches made by the stream, one process each
            if self.args.dataloader_num_workers:
                raise ValueError("a streamed training set is read in the training process: set num_workers to 0")
            collate = BudgetCheckedCollator(self.data_collator, self.max_tokens, self._vocab_size())
            # its own generator: each iter() of a DataLoader draws a worker base seed, from the global torch RNG
            # when it has none, and Trainer restores a checkpoint's RNG state before that iter() when nothing is
            # skipped (ignore_data_skip), so the draw would move a resumed run's dropout off the uninterrupted one's
            generator = torch.Generator().manual_seed(self.seed)
            return DataLoader(self.train_dataset, batch_size=None, collate_fn=collate, generator=generator)
        shuffle = self.args.train_sampling_strategy != "sequential"
        return self._token_budget_dataloader(self.train_dataset, "training", self.max_tokens, shuffle, True)

    def get_eval_dataloader(self, eval_dataset: str | datasets.Dataset | None = None) -> DataLoader:
        """Length-sorted token-budget batches on one process; Trainer's fixed-size batches under DDP (see class)."""
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        key = eval_dataset if isinstance(eval_dataset, str) else "eval"
        if isinstance(eval_dataset, str):
            dataset = self.eval_dataset[eval_dataset]
        else:
            dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if self.accelerator.num_processes > 1:
            if isinstance(dataset, datasets.Dataset):
                dataset = dataset.remove_columns(
                    [c for c in (self.src_len_column, self.tgt_len_column) if c in dataset.column_names]
                )
            return super().get_eval_dataloader(dataset)
        cache: dict[str, DataLoader] = self.__dict__.setdefault("_token_budget_eval_dataloaders", {})
        if self.args.dataloader_persistent_workers and key in cache:
            return cache[key]
        dataloader = self._token_budget_dataloader(dataset, "evaluation", self.eval_max_tokens, False, False)
        if self.args.dataloader_persistent_workers:
            cache[key] = dataloader
        return dataloader
