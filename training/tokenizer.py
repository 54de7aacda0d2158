"""The paper's shared source/target BPE vocabulary, trained with the `tokenizers` library (§5.1: "a shared
source-target vocabulary of about 37000 tokens"; smaller for small corpora).

    python -m training.tokenizer --out runs/tok --vocab_size 1000                 # on the default corpus
    python -m training.tokenizer --out runs/tok-m30k --vocab_size 8000 \\
        --train_file ../shared/data/multi30k/train                              # Moses-style en/de files

    from training.tokenizer import train_tokenizer
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

import argparse
from collections.abc import Iterable, Iterator
from pathlib import Path

import datasets
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")  # ids 0, 1, 2, 3
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
    truncates to when asked to truncate; the data pipeline drops longer pairs instead (see `training.data`).
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
    ds: datasets.Dataset, source_lang: str, target_lang: str, batch_size: int = 1000
) -> Iterator[list[str]]:
    """Batches of texts from both sides of a `{"translation": {...}}` dataset, source then target per batch."""
    for batch in ds.iter(batch_size=batch_size):
        rows = batch["translation"]
        yield [r[source_lang] for r in rows if r[source_lang]] + [r[target_lang] for r in rows if r[target_lang]]


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
) -> PreTrainedTokenizerFast:
    """The shared BPE of the train split of `ds` (or of `ds` itself when it is one `Dataset`), both sides."""
    train = ds["train"] if isinstance(ds, datasets.DatasetDict) else ds
    if "translation" not in train.column_names:
        raise ValueError(f"the dataset has no 'translation' column (columns: {train.column_names})")
    feature = train.features["translation"]
    languages = sorted(getattr(feature, "languages", None) or feature)
    for lang in (source_lang, target_lang):
        if lang not in languages:
            raise ValueError(f"language {lang!r} is not in the dataset's translations; available: {languages}")
    batches = iter_pair_texts(train, source_lang, target_lang, batch_size)
    texts = (text for batch in batches for text in batch)
    return train_tokenizer(
        texts,
        vocab_size,
        min_frequency,
        model_max_length=model_max_length,
        length=2 * len(train),
        show_progress=show_progress,
    )


def main(argv: list[str] | None = None) -> None:
    from training.data import load_parallel  # here: data imports nothing from this module, but keep it one-way

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for tokenizer.json and tokenizer_config.json")
    parser.add_argument("--vocab_size", type=int, default=1000)
    parser.add_argument("--min_frequency", type=int, default=2)
    parser.add_argument("--dataset_name", default=None, help='"default" (offline corpus) or a Hub dataset')
    parser.add_argument("--dataset_config", default=None)
    parser.add_argument("--train_file", default=None, help=".jsonl/.json, .tsv or a Moses prefix (path/train)")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing tokenizer in --out")
    args = parser.parse_args(argv)

    out = Path(args.out)
    if (out / "tokenizer.json").exists() and not args.overwrite:
        parser.error(f"{out / 'tokenizer.json'} exists; pass --overwrite to replace it")
    ds = load_parallel(
        args.dataset_name,
        args.dataset_config,
        train_file=args.train_file,
        source_lang=args.source_lang,
        target_lang=args.target_lang,
        splits=["train"],
    )
    tok = train_tokenizer_for(ds, args.source_lang, args.target_lang, args.vocab_size, args.min_frequency)
    tok.save_pretrained(out)
    print(f"vocabulary of {len(tok)} tokens saved to {out}")
    for row in ds["train"].select(range(min(3, len(ds["train"]))))["translation"]:
        for lang in (args.source_lang, args.target_lang):
            print(f"  {lang}: {tok.tokenize(row[lang])}")


if __name__ == "__main__":
    main()
