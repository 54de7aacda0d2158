"""Loading parallel data through datasets (default corpus, dataset folders, JSONL, TSV, Moses) and tokenizing it:
one row shape, clear errors before long work, dropped pairs counted and logged."""

import gc
import gzip
import json
import logging
import os
from pathlib import Path

import datasets
import huggingface_hub
import pytest
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from training.data.corpus import default_corpus
from training.data.parallel import load_parallel, tokenize_pairs
from training.data.tokenizer import train_tokenizer, wrap_tokenizer

MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
PAIRS = [("Two apples.", "Zwei Äpfel."), ("at half past seven", "um halb acht"), ("Thirty streets", "Dreißig Straßen")]


def rows(ds: datasets.Dataset) -> list[tuple[str, str]]:
    return [(r["en"], r["de"]) for r in ds["translation"]]


def write_jsonl(path: Path, pairs, extra: dict | None = None) -> Path:
    lines = [json.dumps({"translation": {"de": de, "en": en}, **(extra or {})}, ensure_ascii=False) for en, de in pairs]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_moses(prefix: Path, en: list[str], de: list[str], gz: bool = False) -> Path:
    for lang, lines in (("en", en), ("de", de)):
        data = ("\n".join(lines) + "\n").encode("utf-8")
        if gz:
            Path(f"{prefix}.{lang}.gz").write_bytes(gzip.compress(data))
        else:
            Path(f"{prefix}.{lang}").write_bytes(data)
    return prefix


@pytest.fixture
def cache(tmp_path) -> str:
    return str(tmp_path / "hf-cache")


# --- formats -----------------------------------------------------------------------------------------------------


def test_jsonl_keeps_only_the_translation_column(tmp_path, cache):
    path = write_jsonl(tmp_path / "train.jsonl", PAIRS, extra={"id": 7})
    ds = load_parallel(train_file=path, cache_dir=cache)
    assert list(ds) == ["train"] and ds["train"].column_names == ["translation"]
    assert rows(ds["train"]) == PAIRS


def test_tsv_with_and_without_header(tmp_path, cache):
    plain = tmp_path / "plain.tsv"
    plain.write_text("".join(f"{en}\t{de}\n" for en, de in PAIRS), encoding="utf-8")
    headed = tmp_path / "headed.tsv"  # the header names the columns: German first here
    headed.write_text("de\ten\n" + "".join(f"{de}\t{en}\r\n" for en, de in PAIRS), encoding="utf-8")
    ds = load_parallel(train_file=plain, validation_file=headed, cache_dir=cache)
    assert rows(ds["train"]) == PAIRS
    assert rows(ds["validation"]) == PAIRS
    reverse = load_parallel(train_file=headed, source_lang="de", target_lang="en", cache_dir=cache)
    assert rows(reverse["train"]) == PAIRS


@pytest.mark.parametrize("gz", [False, True])
def test_moses_prefix_plain_and_gzipped(tmp_path, cache, gz):
    prefix = write_moses(tmp_path / "train", [en for en, _ in PAIRS], [de for _, de in PAIRS], gz=gz)
    ds = load_parallel(train_file=prefix, cache_dir=cache)
    assert rows(ds["train"]) == PAIRS


def test_data_files_dict_and_splits_filter(tmp_path, cache):
    train = write_jsonl(tmp_path / "a.jsonl", PAIRS)
    test = write_jsonl(tmp_path / "b.jsonl", PAIRS[:1])
    ds = load_parallel(data_files={"train": train, "test": test}, cache_dir=cache)
    assert {k: len(v) for k, v in ds.items()} == {"train": 3, "test": 1}
    only = load_parallel(data_files={"train": train, "test": test}, splits=["test"], cache_dir=cache)
    assert list(only) == ["test"]


def test_an_edited_file_is_read_again(tmp_path, cache):
    path = tmp_path / "t.tsv"
    path.write_text("a\tb\n", encoding="utf-8")
    assert len(load_parallel(train_file=path, cache_dir=cache)["train"]) == 1
    path.write_text("a\tb\nc\td\n", encoding="utf-8")
    assert rows(load_parallel(train_file=path, cache_dir=cache)["train"]) == [("a", "b"), ("c", "d")]


def test_default_corpus_either_direction_and_splits():
    ds = load_parallel(corpus_options={"train_size": 40, "validation_size": 4, "test_size": 4})
    assert {k: len(v) for k, v in ds.items()} == {"train": 40, "validation": 4, "test": 4}
    assert ds["train"]["translation"] == default_corpus(0, 40, 4, 4)["train"]["translation"]
    reverse = load_parallel("default", source_lang="de", target_lang="en", splits=["validation"])
    assert list(reverse) == ["validation"] and len(reverse["validation"]) == 500


def _dataset_folder(root: Path) -> Path:
    """A dataset folder with a config, as on the Hub: README.md front matter naming the data files."""
    (root / "data").mkdir(parents=True)
    write_jsonl(root / "data" / "train.jsonl", PAIRS)
    write_jsonl(root / "data" / "test.jsonl", PAIRS[:2])
    (root / "README.md").write_text(
        "---\nconfigs:\n- config_name: de-en\n  data_files:\n  - split: train\n    path: data/train.jsonl\n"
        "  - split: test\n    path: data/test.jsonl\n---\n",
        encoding="utf-8",
    )
    return root


def test_named_dataset_by_name_and_config(tmp_path, cache):
    folder = _dataset_folder(tmp_path / "my-dataset")
    ds = load_parallel(str(folder), "de-en", cache_dir=cache)
    assert {k: len(v) for k, v in ds.items()} == {"train": 3, "test": 2}
    assert rows(ds["train"]) == PAIRS
    assert list(load_parallel(str(folder), "de-en", splits=["test"], cache_dir=cache)) == ["test"]


# --- bad input ---------------------------------------------------------------------------------------------------


def test_unknown_dataset_offline_says_so(monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=r"could not load dataset 'vaswani-tests/no-such-dataset'.*offline"):
        load_parallel("vaswani-tests/no-such-dataset", "de-en")


def test_unknown_config_and_split_and_language(tmp_path, cache):
    folder = str(_dataset_folder(tmp_path / "my-dataset"))
    with pytest.raises(ValueError, match=r"config 'fr-en'.*'fr-en' not found.*de-en"):
        load_parallel(folder, "fr-en", cache_dir=cache)
    with pytest.raises(ValueError, match=r"no split\(s\) \['validation'\]; available: \['test', 'train'\]"):
        load_parallel(folder, "de-en", splits=["validation"], cache_dir=cache)
    with pytest.raises(ValueError, match=r"language\(s\) \['fr'\] not in the translations; available .*\['de', 'en'\]"):
        load_parallel(folder, "de-en", source_lang="fr", cache_dir=cache)


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"train file .*nothere\.jsonl does not exist"):
        load_parallel(train_file=tmp_path / "nothere.jsonl")
    with pytest.raises(FileNotFoundError, match=r"nothere does not exist, nor do Moses-style files .*nothere\.en\.gz"):
        load_parallel(train_file=tmp_path / "nothere")
    (tmp_path / "half.en").write_text("a\n", encoding="utf-8")
    with pytest.raises(FileNotFoundError, match=r"no Moses-style file for language 'de'.*half\.de\.gz"):
        load_parallel(train_file=tmp_path / "half")


def test_a_missing_file_is_found_before_any_other_split_is_loaded(tmp_path, monkeypatch):
    good = write_jsonl(tmp_path / "train.jsonl", PAIRS)
    called = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: called.append(a))
    with pytest.raises(FileNotFoundError, match="test file"):
        load_parallel(train_file=good, test_file=tmp_path / "test.jsonl")
    assert called == []


def test_language_file_given_instead_of_prefix(tmp_path):
    prefix = write_moses(tmp_path / "train", ["a"], ["b"])
    with pytest.raises(ValueError, match=r"unknown format.*give .*train$"):
        load_parallel(train_file=f"{prefix}.en")


def test_rows_without_translation_column(tmp_path):
    path = tmp_path / "flat.jsonl"
    path.write_text(json.dumps({"en": "a", "de": "b"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"no 'translation' column \(columns: \['de', 'en'\]\)"):
        load_parallel(train_file=path)


def test_unknown_language(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", PAIRS)
    with pytest.raises(
        ValueError, match=r"language\(s\) \['fr'\] not in the translations; available languages: \['de', 'en'\]"
    ):
        load_parallel(train_file=path, target_lang="fr")
    with pytest.raises(ValueError, match=r"default corpus has no language\(s\) \['fr'\]; available languages"):
        load_parallel("default", target_lang="fr")
    tsv = tmp_path / "h.tsv"
    tsv.write_text("en\tfr\na\tb\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"header names languages \['en', 'fr'\]; \['de'\] not among them"):
        load_parallel(train_file=tsv)


def test_misaligned_moses_files_name_both_files_and_counts(tmp_path):
    prefix = write_moses(tmp_path / "train", ["a", "b", "c"], ["x", "y"], gz=True)
    with pytest.raises(ValueError, match=r"misaligned.*train\.en\.gz has 3 lines but .*train\.de\.gz has 2"):
        load_parallel(train_file=prefix)


def test_tsv_line_with_wrong_field_count_names_the_line(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("a\tb\nc\td\ne\tf\tg\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.tsv, line 3: expected 2 tab-separated fields .* got 3"):
        load_parallel(train_file=path)
    path.write_text("a\tb\njust one field\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: expected 2 tab-separated fields"):
        load_parallel(train_file=path)


def test_contradictory_arguments(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", PAIRS)
    with pytest.raises(ValueError, match="either dataset_name .* or data files"):
        load_parallel("wmt14", train_file=path)
    with pytest.raises(ValueError, match="train split is given twice"):
        load_parallel(train_file=path, data_files={"train": path})
    with pytest.raises(ValueError, match=r"split\(s\) \['test'\] requested but no file given"):
        load_parallel(train_file=path, splits=["test"])
    with pytest.raises(ValueError, match="both 'en'"):
        load_parallel(source_lang="en", target_lang="en")
    with pytest.raises(ValueError, match="default corpus has no configs"):
        load_parallel("default", "de-en")
    write_moses(tmp_path / "dup", ["a"], ["b"])
    write_moses(tmp_path / "dup", ["a"], ["b"], gz=True)
    with pytest.raises(ValueError, match=r"both .*dup\.en and .*dup\.en\.gz exist"):
        load_parallel(train_file=tmp_path / "dup")


# --- tokenization ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    texts = [r[lang] for r in default_corpus(0, 2000, 0, 0)["train"]["translation"] for lang in ("en", "de")]
    return train_tokenizer(texts + [" ".join(PAIRS[0])], vocab_size=500, show_progress=False)


def digits(n: int) -> str:
    """A text of exactly n + 2 tokens: "▁", n single digits, and </s>."""
    return "7" * n


def test_tokenize_pairs_columns_and_eos(tok):
    ds = datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"translation": [{"en": e, "de": d} for e, d in PAIRS]})}
    )
    out = tokenize_pairs(ds, tok, "en", "de", max_length=64)
    assert out["train"].column_names == ["input_ids", "attention_mask", "labels", "src_len", "tgt_len"]
    for row, (en, de) in zip(out["train"], PAIRS, strict=True):
        assert row["input_ids"][-1] == tok.eos_token_id and row["labels"][-1] == tok.eos_token_id
        assert row["src_len"] == len(row["input_ids"]) == len(row["attention_mask"]) == sum(row["attention_mask"])
        assert row["tgt_len"] == len(row["labels"])
        assert tok.decode(row["input_ids"], skip_special_tokens=True) == en
        assert tok.decode(row["labels"], skip_special_tokens=True) == de
    assert out.stats == {"train": {"pairs": 3, "empty": 0, "too_long": 0, "kept": 3}}
    kept_text = tokenize_pairs(ds, tok, "en", "de", max_length=64, keep_text=True)
    assert kept_text["train"]["translation"] == ds["train"]["translation"]


def test_empty_and_over_long_pairs_are_dropped_with_logged_counts(tmp_path, tok, caplog):
    assert len(tok(digits(8)).input_ids) == 10
    pairs = [
        ("Two apples.", "Zwei Äpfel."),
        ("   ", "leer"),  # blank source
        ("empty target", ""),  # blank target
        (digits(8), "ok"),  # exactly max_length tokens: kept
        (digits(9), "ok"),  # one token too many on the source side
        ("ok", digits(9)),  # and on the target side
        ("", ""),
    ]
    path = tmp_path / "train.tsv"
    path.write_text("".join(f"{en}\t{de}\n" for en, de in pairs) + "\n", encoding="utf-8")  # + a blank line
    missing = write_jsonl(tmp_path / "val.jsonl", PAIRS[:2])
    with missing.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"translation": {"en": "no German here"}}) + "\n")  # "de" missing: null, an empty side
    ds = load_parallel(train_file=path, validation_file=missing, cache_dir=str(tmp_path / "cache"))
    with caplog.at_level(logging.INFO, logger="training.data.parallel"):
        out = tokenize_pairs(ds, tok, "en", "de", max_length=10)
    assert out.stats["train"] == {"pairs": 8, "empty": 4, "too_long": 2, "kept": 2}
    assert out.stats["validation"] == {"pairs": 3, "empty": 1, "too_long": 0, "kept": 2}
    assert [tok.decode(x, skip_special_tokens=True) for x in out["train"]["input_ids"]] == ["Two apples.", digits(8)]
    assert len(out["validation"]) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("train: dropped 4 pair(s) with an empty side and 2 pair(s) longer than 10 tokens" in m for m in warnings)
    assert any("validation: dropped 1 pair(s) with an empty side and 0 pair(s)" in m for m in warnings)


def test_tokenization_is_cached_for_files(tmp_path, tok):
    path = write_jsonl(tmp_path / "train.jsonl", PAIRS * 10)
    ds = load_parallel(train_file=path, cache_dir=str(tmp_path / "cache"))
    first = tokenize_pairs(ds, tok, "en", "de", max_length=32)
    second = tokenize_pairs(ds, tok, "en", "de", max_length=32)
    assert first["train"].cache_files and first["train"].cache_files == second["train"].cache_files
    assert first["train"]._fingerprint == second["train"]._fingerprint
    other = tokenize_pairs(ds, tok, "en", "de", max_length=5)
    assert other["train"]._fingerprint != first["train"]._fingerprint


def test_a_tokenizer_without_eos_gets_it_appended(tok):
    bare = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    bare.post_processor = None
    plain = wrap_tokenizer(bare)
    assert plain("Zwei Äpfel.").input_ids[-1] != plain.eos_token_id
    ds = datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"translation": [{"en": e, "de": d} for e, d in PAIRS]})}
    )
    out = tokenize_pairs(ds, plain, "en", "de", max_length=64)
    assert all(x[-1] == plain.eos_token_id for x in [*out["train"]["input_ids"], *out["train"]["labels"]])


def test_tokenize_pairs_bad_arguments(tok):
    ds = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"translation": [{"en": "a", "de": "b"}]})})
    with pytest.raises(ValueError, match="max_length must be an int >= 2"):
        tokenize_pairs(ds, tok, "en", "de", max_length=1)
    with pytest.raises(ValueError, match=r"split 'train': language\(s\) \['fr'\] not in the translations"):
        tokenize_pairs(ds, tok, "fr", "de", max_length=8)
    flat = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a"]})})
    with pytest.raises(ValueError, match="no 'translation' column"):
        tokenize_pairs(flat, tok, "en", "de", max_length=8)


# --- real data, where this machine has it ------------------------------------------------------------------------


@pytest.mark.skipif(not (MULTI30K / "train.en.gz").is_file(), reason=f"Multi30k not at {MULTI30K}")
def test_multi30k_moses_prefix():
    ds = load_parallel(
        train_file=MULTI30K / "train", validation_file=MULTI30K / "val", test_file=MULTI30K / "test_2016_flickr"
    )
    assert {k: len(v) for k, v in ds.items()} == {"train": 29000, "validation": 1014, "test": 1000}
    first = ds["train"][0]["translation"]
    assert first["en"].startswith("Two young, White males") and first["de"].startswith("Zwei junge weiße Männer")


# --- at scale: batched, parallel, cached -------------------------------------------------------------------------


def _moses_corpus(prefix: Path, size: int, seed: int = 0) -> Path:
    rows = default_corpus(seed, size, 0, 0)["train"]["translation"]
    return write_moses(prefix, [r["en"] for r in rows], [r["de"] for r in rows])


def test_moses_cache_follows_the_content_not_the_path_or_time(tmp_path, cache):
    """The Arrow file of a Moses corpus is keyed by the BLAKE2b of both files: the same bytes elsewhere reuse it,
    different bytes of the same size and modification time do not."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write_moses(tmp_path / "a" / "train", ["one two", "three"], ["eins zwei", "drei"])
    b = write_moses(tmp_path / "b" / "train", ["one two", "three"], ["eins zwei", "drei"])
    first, copy = (load_parallel(train_file=p, cache_dir=cache)["train"] for p in (a, b))
    assert first._fingerprint == copy._fingerprint and first.cache_files == copy.cache_files
    assert len(list((Path(cache) / "vaswani_parallel").glob("*.arrow"))) == 1
    de = Path(f"{a}.de")
    stat = de.stat()
    de.write_text("eins zwei\nvier\n", encoding="utf-8")  # same size
    os.utime(de, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same modification time
    edited = load_parallel(train_file=a, cache_dir=cache)["train"]
    assert edited._fingerprint != first._fingerprint
    assert rows(edited) == [("one two", "eins zwei"), ("three", "vier")]


def test_tokenized_moses_corpus_is_reused_and_recomputed_when_an_input_changes(tmp_path, tok, monkeypatch):
    """Same files, tokenizer and filter: the tokenized split comes from the cache without tokenizing anything.
    A changed file, vocabulary or length filter gives a new fingerprint and tokenizes again."""
    import training.data.parallel as data

    cache = str(tmp_path / "cache")
    prefix = _moses_corpus(tmp_path / "train", 300)
    first = tokenize_pairs(load_parallel(train_file=prefix, cache_dir=cache), tok, "en", "de", max_length=32)
    assert first["train"].cache_files

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized again although nothing changed")

    with monkeypatch.context() as m:
        m.setattr(data, "_encode_table", no_tokenizing)
        again = tokenize_pairs(load_parallel(train_file=prefix, cache_dir=cache), tok, "en", "de", max_length=32)
    assert again["train"]._fingerprint == first["train"]._fingerprint
    assert again["train"].cache_files == first["train"].cache_files
    assert again.stats == first.stats and again["train"][:] == first["train"][:]

    fingerprints = {first["train"]._fingerprint}
    shorter = tokenize_pairs(load_parallel(train_file=prefix, cache_dir=cache), tok, "en", "de", max_length=12)
    fingerprints.add(shorter["train"]._fingerprint)
    assert shorter.stats["train"]["too_long"] > 0  # the filter really changed what is kept
    texts = [r[lang] for r in default_corpus(0, 2000, 0, 0)["train"]["translation"] for lang in ("en", "de")]
    other_vocab = train_tokenizer(texts, vocab_size=400, show_progress=False)
    fingerprints.add(
        tokenize_pairs(load_parallel(train_file=prefix, cache_dir=cache), other_vocab, "en", "de", 32)[
            "train"
        ]._fingerprint
    )
    with open(f"{prefix}.en", "a", encoding="utf-8") as f_en, open(f"{prefix}.de", "a", encoding="utf-8") as f_de:
        f_en.write("one more\n")
        f_de.write("noch eins\n")
    edited = tokenize_pairs(load_parallel(train_file=prefix, cache_dir=cache), tok, "en", "de", max_length=32)
    fingerprints.add(edited["train"]._fingerprint)
    assert len(fingerprints) == 4
    assert edited.stats["train"]["pairs"] == first.stats["train"]["pairs"] + 1


def test_num_proc_and_the_batched_fast_path_change_nothing(tmp_path, tok):
    """Two processes give the rows one process gives, and the direct `tokenizers` call gives what the
    transformers tokenizer call gives (a subclass takes that generic path)."""
    from transformers import PreTrainedTokenizerFast

    class Generic(PreTrainedTokenizerFast):
        pass

    generic = Generic(tokenizer_object=tok.backend_tokenizer, eos_token="</s>", pad_token="<pad>")
    ds = load_parallel(train_file=_moses_corpus(tmp_path / "train", 1200), cache_dir=str(tmp_path / "cache"))
    one = tokenize_pairs(ds, tok, "en", "de", max_length=20, num_proc=1, batch_size=100)
    two = tokenize_pairs(ds, tok, "en", "de", max_length=20, num_proc=2, batch_size=100)
    slow = tokenize_pairs(ds, generic, "en", "de", max_length=20, num_proc=1, batch_size=100)
    assert one.stats == two.stats == slow.stats and 0 < one.stats["train"]["too_long"] < 1200
    assert one["train"][:] == two["train"][:] == slow["train"][:]
    with pytest.raises(ValueError, match="num_proc must be a positive integer"):
        tokenize_pairs(ds, tok, "en", "de", max_length=20, num_proc=0)


def _mapped_bytes(path) -> int:
    """Bytes of `path`'s pages mapped into this process now (/proc/self/smaps' Rss of its mappings)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and ":" not in fields[0]:  # a mapping's header line: address perms offset dev inode [path]
            inside = len(fields) == 6 and fields[5] == str(path)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1]) * 1024
    return total


linux_only = pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="reads /proc/self/smaps (Linux)")


@linux_only
def test_released_pages_leave_the_process_and_the_rows_stay_readable(tmp_path):
    """release_mapped_pages unmaps every page of a memory-mapped Arrow table the process had read (the rows read
    back the same, mapping their pages again), and leaves a table in memory alone (anonymous memory: released
    pages would read back as zeros)."""
    import pyarrow as pa

    from training.data.memory import release_mapped_pages

    texts = [f"sentence {i} " * (i % 17 + 1) for i in range(20000)]
    table = pa.table({"translation": pa.array([{"en": t, "de": t[::-1]} for t in texts])})
    path = tmp_path / "rows.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1000)
    mapped = pa.ipc.open_stream(pa.memory_map(str(path))).read_all()
    rows = mapped.column("translation").to_pylist()
    assert _mapped_bytes(path) >= 0.99 * path.stat().st_size
    assert release_mapped_pages(mapped) >= 0.99 * path.stat().st_size
    assert _mapped_bytes(path) == 0
    assert mapped.column("translation").to_pylist() == rows == table.column("translation").to_pylist()
    assert _mapped_bytes(path) >= 0.99 * path.stat().st_size
    assert release_mapped_pages(table) == 0 and release_mapped_pages() == 0
    assert table.column("translation").to_pylist() == rows


@linux_only
def test_tokenizing_releases_the_pages_of_the_corpus_it_has_read(tmp_path, tok):
    """The process that tokenizes a memory-mapped corpus does not keep its pages: after the map, only the pages of
    the batches read since the last release (RELEASE_PAGES_EVERY at most, each read mapping the kernel's
    fault-around window of 64 KB around each of its four text buffers) are still mapped, not the whole file."""
    from training.data.parallel import RELEASE_PAGES_EVERY

    pairs, batch = 40000, 100
    ds = load_parallel(train_file=_moses_corpus(tmp_path / "train", pairs), cache_dir=str(tmp_path / "cache"))
    path = ds["train"].cache_files[0]["filename"]
    ds["train"].with_format("arrow")[:].column("translation").to_pylist()  # every page mapped
    size = Path(path).stat().st_size
    assert _mapped_bytes(path) >= 0.99 * size
    data = tokenize_pairs(ds, tok, "en", "de", max_length=64, num_proc=1, batch_size=batch)
    assert data.stats["train"]["pairs"] == pairs
    unreleased = (RELEASE_PAGES_EVERY + 1) * batch / pairs * size + 4 * 2 * 65536
    assert _mapped_bytes(path) <= unreleased < 0.25 * size


@linux_only
def test_the_page_release_switched_off_leaves_the_corpus_mapped_and_the_data_the_same(tmp_path, tok, monkeypatch):
    """VASWANI_RELEASE_PAGES=0 switches the tokenization's page release off (for A/B runs): the pages the process
    read stay mapped, and the tokenized data is the same as with the release on."""
    pairs, batch = 40000, 100
    corpus = _moses_corpus(tmp_path / "train", pairs)
    columns = ["input_ids", "labels", "src_len", "tgt_len"]
    results = {}
    for setting in ("off", "1"):
        monkeypatch.setenv("VASWANI_RELEASE_PAGES", setting)
        ds = load_parallel(train_file=corpus, cache_dir=str(tmp_path / f"cache-{setting}"))
        path = ds["train"].cache_files[0]["filename"]
        ds["train"].with_format("arrow")[:].column("translation").to_pylist()  # every page mapped
        size = Path(path).stat().st_size
        data = tokenize_pairs(ds, tok, "en", "de", max_length=64, num_proc=1, batch_size=batch)
        results[setting] = (_mapped_bytes(path) / size, data["train"].select_columns(columns).to_dict())
    assert results["off"][0] >= 0.99 and results["1"][0] < 0.25
    assert results["off"][1] == results["1"][1]


@pytest.mark.parametrize(
    ("value", "enabled"),
    [(None, True), ("", True), ("1", True), ("on", True), ("0", False), (" Off ", False), ("NO", False)],
)
def test_the_page_release_switch_reads_the_environment(monkeypatch, value, enabled):
    from training.data.memory import release_pages_enabled

    if value is None:
        monkeypatch.delenv("VASWANI_RELEASE_PAGES", raising=False)
    else:
        monkeypatch.setenv("VASWANI_RELEASE_PAGES", value)
    assert release_pages_enabled() is enabled


class _FreezeRecording(PreTrainedTokenizerFast):
    """Writes, in each process that calls it, how many objects were frozen out of the garbage collector there."""

    folder = ""

    def __call__(self, *args, **kwargs):
        Path(self.folder, str(os.getpid())).write_text(str(gc.get_freeze_count()))
        return super().__call__(*args, **kwargs)


def test_forked_tokenizing_workers_start_with_the_parents_objects_frozen(tmp_path, tok):
    """With num_proc > 1 the workers are forked with the parent's objects frozen out of the garbage collector (so
    that their collections do not copy the parent's pages); the parent's collector is as before afterwards; one
    process freezes nothing; objects a caller froze stay frozen."""
    from training.data.memory import frozen_for_fork

    corpus = _moses_corpus(tmp_path / "train", 1200)
    for procs in (1, 2):
        folder = tmp_path / f"procs{procs}"
        folder.mkdir()
        ds = load_parallel(train_file=corpus, cache_dir=str(folder / "cache"))  # not the other's tokenized cache
        recording = _FreezeRecording(tokenizer_object=tok.backend_tokenizer, eos_token="</s>", pad_token="<pad>")
        recording.folder = str(folder)
        assert gc.get_freeze_count() == 0
        tokenize_pairs(ds, recording, "en", "de", max_length=20, num_proc=procs, batch_size=100)
        assert gc.get_freeze_count() == 0
        counts = {int(f.name): int(f.read_text()) for f in folder.iterdir() if f.name.isdigit()}
        if procs == 1:
            assert counts == {os.getpid(): 0}
        else:
            # the pool's two jobs ran in worker processes (one worker may have taken both), each saw the freeze
            assert 1 <= len(counts) <= 2 and os.getpid() not in counts and min(counts.values()) > 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with frozen_for_fork():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_bpe_texts_are_read_from_the_arrow_file_without_its_memory_map(tmp_path, cache):
    """A split that is one Arrow file gives the BPE its texts by plain reads (the pages of a corpus-wide sample stay
    out of the process), the same batches of the same texts as the rows say, whole or sampled, across the file's
    record batches; a sliced split goes through datasets as before; a sample past the file's end is an error."""
    import numpy as np
    import pyarrow as pa
    from datasets.table import MemoryMappedTable

    from training.data import tokenizer as bpe

    moses = load_parallel(train_file=_moses_corpus(tmp_path / "train", 500), cache_dir=cache)["train"]
    path = tmp_path / "batches.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, moses.data.schema) as writer:
        for start in range(0, 500, 70):  # record batches of 70 rows: their ends fall inside the text batches
            writer.write_table(moses.data.table.slice(start, 70))
    split = datasets.Dataset(MemoryMappedTable.from_file(str(path)), info=moses.info)
    assert bpe._plain_file(moses) == moses.cache_files[0]["filename"] and bpe._plain_file(split) == str(path)
    assert bpe._plain_file(split.select(range(10, 20))) is None
    pairs = split["translation"]
    for indices in (None, bpe.bpe_sample(500, 123, seed=0)):
        picked = pairs if indices is None else [pairs[i] for i in indices]
        expected = [
            [p["en"] for p in picked[i : i + 64] if p["en"]] + [p["de"] for p in picked[i : i + 64] if p["de"]]
            for i in range(0, len(picked), 64)
        ]
        assert list(bpe.iter_pair_texts(split, "en", "de", 64, indices)) == expected
        assert list(bpe.iter_pair_texts(split.select(range(500)), "en", "de", 64, indices)) == expected
    with pytest.raises(IndexError, match="past the 500 rows"):
        list(bpe.iter_pair_texts(split, "en", "de", 64, np.array([3, 500])))


def test_bpe_learns_from_a_logged_sample_and_is_cached_by_its_settings(tmp_path, caplog):
    from training.data.tokenizer import iter_pair_texts, shared_bpe

    cache = str(tmp_path / "cache")
    train = load_parallel(train_file=_moses_corpus(tmp_path / "train", 500), cache_dir=cache)["train"]
    batches = iter_pair_texts(train, "en", "de", batch_size=64)
    assert not isinstance(batches, list) and max(len(b) for b in batches) <= 128  # batches, never the corpus
    with caplog.at_level(logging.INFO, logger="training.data.tokenizer"):
        tok_a, info = shared_bpe(train, "en", "de", 300, max_pairs=200, cache_dir=cache, show_progress=False)
    assert info["sampled"] and info["pairs"] == 500 and info["pairs_used"] == 200 and not info["cached"]
    assert any("learning from a random sample of 200" in r.getMessage() for r in caplog.records)
    tok_b, again = shared_bpe(train, "en", "de", 300, max_pairs=200, cache_dir=cache, show_progress=False)
    assert again["cached"] and again["key"] == info["key"]
    assert tok_b.backend_tokenizer.to_str() == tok_a.backend_tokenizer.to_str()
    _, other_size = shared_bpe(train, "en", "de", 280, max_pairs=200, cache_dir=cache, show_progress=False)
    _, whole = shared_bpe(train, "en", "de", 300, max_pairs=None, cache_dir=cache, show_progress=False)
    assert not other_size["cached"] and not whole["cached"] and not whole["sampled"]
    assert len({info["key"], other_size["key"], whole["key"]}) == 3
