"""benchmarks/data.py --smoke: every step runs (cold and cached preparation in their own processes, the restart and
the streaming run), the cache is hit the second time, the results and the plot are written."""

import json

from benchmarks import data as data_bench

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_data_benchmark_smoke(tmp_path):
    rows = data_bench.main(["--smoke", "--out_dir", str(tmp_path), "--work_dir", str(tmp_path)])
    cold, cached = rows
    assert (cold["step"], cached["step"]) == ("cold", "cached") and cold["pairs"] == cached["pairs"] == 2000
    assert cold["bpe"]["cached"] is False and cached["bpe"]["cached"] is True  # the second preparation hit the cache
    assert cold["kept"] == cached["kept"] > 1000 and cold["batches"] == cached["batches"] > 0
    for row in rows:
        assert row["prepare_s"] > 0 and row["pairs_per_s"] > 0 and row["peak_rss_gib"] >= row["peak_pss_gib"] > 0
        assert abs(row["prepare_s"] - sum(row[k] for k in ("load_s", "bpe_s", "tokenize_s", "table_s"))) < 0.01
    assert cached["restart_first_step_s"] > 0 and cached["map_tokens_per_s"] > 0
    assert cached["stream_tokens_per_s"] > 0 and cached["stream_over_map"] > 0
    for run in ("map", "stream"):  # the first step (the loader's start) timed apart from the steady steps after it
        assert cached[f"{run}_first_step_train_s"] > 0 and cached[f"{run}_steady_tokens_per_s"] > 0
    steady = cached["stream_steady_tokens_per_s"] / cached["map_steady_tokens_per_s"]
    assert cached["stream_over_map"] == steady
    [jsonl] = tmp_path.glob("data-*.jsonl")
    written = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r["step"] for r in written] == ["cold", "cached"] and written[0]["env"]["cpu"]
    assert not list(tmp_path.glob("data-bench-*"))  # the generated corpus is removed
    larger = tmp_path / "larger.jsonl"  # a second file's sizes join the first's in one plot
    larger.write_text(json.dumps({**written[0], "pairs": 4000}) + "\n")
    assert [r["pairs"] for r in data_bench.read_rows([jsonl, larger])] == [2000, 2000, 4000]
    png = data_bench.plot([jsonl, larger], tmp_path / "plot.png")
    assert png.read_bytes()[:8] == PNG_SIGNATURE


def test_cold_only_runs_reuse_a_kept_corpus_and_record_the_page_release_switch(tmp_path, monkeypatch):
    """--corpus_dir keeps the corpus and a second run reuses it (a different size writes its own); --cold_only
    measures the cold preparation alone, with empty caches each run; each row says whether the tokenization
    released the corpus pages (VASWANI_RELEASE_PAGES, read in the measured process)."""
    corpora = tmp_path / "corpora"
    common = ["--smoke", "--cold_only", "--corpus_dir", str(corpora), "--work_dir", str(tmp_path)]
    monkeypatch.setenv("VASWANI_RELEASE_PAGES", "0")
    [off] = data_bench.main([*common, "--out_dir", str(tmp_path / "off")])
    written = (corpora / "2000" / "train.en").read_bytes()
    monkeypatch.delenv("VASWANI_RELEASE_PAGES")
    [on] = data_bench.main([*common, "--out_dir", str(tmp_path / "on")])
    assert (off["step"], on["step"]) == ("cold", "cold") and "restart_first_step_s" not in on
    assert (off["release_pages"], on["release_pages"]) == (False, True)
    assert (off["corpus_reused"], on["corpus_reused"]) == (False, True)
    assert off["bpe"]["cached"] is False and on["bpe"]["cached"] is False  # the caches are not kept
    assert (corpora / "2000" / "train.en").read_bytes() == written and on["kept"] == off["kept"]
    assert not list(tmp_path.glob("data-bench-*"))
    data_bench.reuse_or_write_corpus(corpora / "2000", 1000)  # another size: written anew
    assert len((corpora / "2000" / "train.en").read_text().splitlines()) == 1000


def test_projection_keeps_the_sampled_bpe_flat_and_the_other_phases_on_their_line():
    """4.5M pairs from 100k and 1M: load, tokenization, table and memory continue their straight lines; the BPE,
    which learns from a sample of BPE_MAX_PAIRS (1M) pairs beyond that, keeps the 1M time."""
    rows = [
        {"pairs": 100_000, "load_s": 1.0, "bpe_s": 6.0, "tokenize_s": 7.0, "table_s": 0.2},
        {"pairs": 1_000_000, "load_s": 2.0, "bpe_s": 41.0, "tokenize_s": 65.0, "table_s": 2.2},
    ]
    for r, pss in zip(rows, (1.0, 1.1), strict=True):
        r.update(step="cold", peak_pss_gib=pss, peak_pss_anon_gib=pss / 2, peak_rss_gib=2 * pss, peak_anon_gib=pss)
    guess = data_bench.project(rows, 4_500_000)
    assert guess["step"] == "projected" and guess["projected_from"] == [100_000, 1_000_000]
    assert guess["bpe_s"] == 41.0
    assert abs(guess["tokenize_s"] - (7.0 + 58.0 * 44 / 9)) < 1e-6
    assert abs(guess["load_s"] - (1.0 + 44 / 9)) < 1e-6
    assert abs(guess["peak_pss_gib"] - (1.0 + 0.1 * 44 / 9)) < 1e-6
    assert abs(guess["prepare_s"] - sum(guess[k] for k in ("load_s", "bpe_s", "tokenize_s", "table_s"))) < 1e-9


def test_the_plot_says_whether_4_5m_was_measured_or_projected():
    """A plot with a measured 4.5M row draws no projection and says 4.5M was measured; with only 100k and 1M it
    projects 4.5M and says so; with one size neither."""
    rows = [
        {"pairs": n, "step": "cold", "load_s": 1.0, "bpe_s": 6.0, "tokenize_s": t, "table_s": 0.2}
        for n, t in ((100_000, 7.0), (1_000_000, 65.0), (4_500_000, 300.0))
    ]
    for r in rows:
        r.update(peak_pss_gib=1.0, peak_pss_anon_gib=0.5, peak_rss_gib=2.0, peak_anon_gib=1.0)
    guess, title = data_bench.projection(rows)
    assert guess is None and "measured, 4.5M included" in title and "projected" not in title
    guess, title = data_bench.projection(rows[:2])
    assert guess["pairs"] == 4_500_000 and guess["step"] == "projected" and "4.5M projected" in title
    guess, title = data_bench.projection(rows[:1])
    assert guess is None and "projected" not in title and "4.5M" not in title
