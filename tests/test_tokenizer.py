"""The shared BPE tokenizer: special ids, </s> appended, exact detokenization, save and AutoTokenizer reload."""

import json
import unicodedata

import datasets
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from training.data.corpus import default_corpus
from training.data.tokenizer import SPECIAL_TOKENS, train_tokenizer, train_tokenizer_for

# NFKC-stable sentences (NFKC leaves them unchanged) with punctuation, umlauts, ß, digits and several words.
ROUND_TRIP = [
    "Ich habe am Montag fünfundvierzig Bücher gekauft.",
    "Der Laden schließt um 19:30 Uhr; das Café öffnet um halb acht!",
    "Das Buch kostet 12,50 Euro (nicht 1.250 Euro).",
    "Wie viele Äpfel hat sie? Dreihundertzweiundvierzig.",
    "She said: \"It's a quarter past seven, isn't it?\"",
    "Grüße aus Köln, Zürich und Düsseldorf - Straße 7/8.",
]
EXTRA_TRAINING_TEXT = ROUND_TRIP[1:]  # so that every character of the test sentences is in the alphabet


@pytest.fixture(scope="module")
def corpus():
    return default_corpus(seed=0, train_size=3000, validation_size=10, test_size=10)


@pytest.fixture(scope="module")
def tok(corpus):
    texts = [r[lang] for r in corpus["train"]["translation"] for lang in ("en", "de")] + EXTRA_TRAINING_TEXT * 3
    return train_tokenizer(texts, vocab_size=600, show_progress=False)


def test_special_tokens_have_the_model_config_ids(tok):
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert tok.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2, 3]
    assert (tok.bos_token, tok.pad_token, tok.eos_token, tok.unk_token) == ("<s>", "<pad>", "</s>", "<unk>")
    assert (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.padding_side == "right"
    assert len(tok) <= 600


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip_gives_back_the_text(tok, text):
    assert unicodedata.normalize("NFKC", text) == text
    ids = tok(text).input_ids
    assert ids[-1] == tok.eos_token_id and tok.eos_token_id not in ids[:-1]
    assert tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_nfkc_normalizes_and_unknown_characters_become_unk(tok):
    assert tok.decode(tok("ﬁve Äpfel").input_ids, skip_special_tokens=True) == "five Äpfel"  # the fi ligature
    ids = tok("fünf ☃ Äpfel").input_ids
    assert tok.unk_token_id in ids


def test_digits_are_single_tokens(tok):
    pieces = tok.tokenize("am 5. März 2021 und 342 Äpfel")
    assert pieces[pieces.index("5") - 1] == "▁"
    assert [p for p in pieces if any(c.isdigit() for c in p)] == ["5", "2", "0", "2", "1", "3", "4", "2"]


def test_the_vocabulary_is_shared_between_languages(tok):
    vocab = tok.get_vocab()
    assert "▁Äpfel" in vocab or "Äpfel" in "".join(tok.tokenize("Äpfel"))
    for word in ("apples", "Äpfel", "Montag", "Monday", "dreißig", "thirty"):
        assert tok.unk_token_id not in tok(word).input_ids


def test_labels_through_text_target_and_right_padding(tok):
    batch = tok(["fünf Äpfel", "Ich habe am Montag fünfundvierzig Bücher gekauft."], padding=True)
    short, long = batch.input_ids
    assert len(short) == len(long)
    n = sum(batch.attention_mask[0])
    assert short[n - 1] == tok.eos_token_id and short[n:] == [tok.pad_token_id] * (len(short) - n)
    labels = tok(text_target=["fünf Äpfel"]).input_ids[0]
    assert labels == tok("fünf Äpfel").input_ids and labels[-1] == tok.eos_token_id


def test_save_pretrained_and_autotokenizer_reload(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    saved = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    assert saved["model"]["type"] == "BPE" and saved["normalizer"]["type"] == "NFKC"
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2, 3]
    assert (reloaded.pad_token_id, reloaded.eos_token_id, reloaded.padding_side) == (1, 2, "right")
    assert reloaded.get_vocab() == tok.get_vocab()
    batch = ROUND_TRIP + ["fünf Äpfel"]
    assert reloaded(batch, padding=True).input_ids == tok(batch, padding=True).input_ids
    assert reloaded.batch_decode(tok(batch).input_ids, skip_special_tokens=True) == batch


def test_train_tokenizer_for_uses_both_sides_of_train_only(corpus):
    features = corpus["train"].features
    snowman = datasets.Dataset.from_dict({"translation": [{"en": "☃ ☃ ☃", "de": "☃ ☃ ☃"}] * 5}, features=features)
    ds = datasets.DatasetDict({"train": corpus["train"], "validation": snowman})
    tok = train_tokenizer_for(ds, "en", "de", vocab_size=400, show_progress=False)
    vocab = tok.get_vocab()
    assert len(tok) <= 400
    assert any(c in piece for piece in vocab for c in "äöüß")  # the German side was read
    assert any("th" in piece for piece in vocab)  # the English side was read
    assert tok.unk_token_id not in tok("twenty-one apples, einundzwanzig Äpfel").input_ids
    assert tok.unk_token_id in tok("☃").input_ids  # validation was not


def test_bad_arguments_raise(corpus):
    with pytest.raises(ValueError, match="vocab_size must be at least 5"):
        train_tokenizer(["a b c"], vocab_size=4)
    with pytest.raises(ValueError, match="no non-empty text"):
        train_tokenizer(["", ""], vocab_size=100, show_progress=False)
    with pytest.raises(
        ValueError, match=r"language 'fr' is not in the dataset's translations; available: \['de', 'en'\]"
    ):
        train_tokenizer_for(corpus, "en", "fr", vocab_size=100)
