"""benchmarks/stream_steps.py: a --streaming run's steps and chunk preparations are recorded, and --chunks decides
which process prepares the chunks after the first (the first is always the training process's)."""

import json
from pathlib import Path

from benchmarks import stream_steps
from training.data.corpus import default_corpus


def test_stream_steps_records_who_prepared_each_chunk(tmp_path):
    rows = default_corpus(3, 600, 0, 0)["train"]["translation"]
    prefix = tmp_path / "train"
    Path(f"{prefix}.en").write_text("".join(r["en"] + "\n" for r in rows), encoding="utf-8")
    Path(f"{prefix}.de").write_text("".join(r["de"] + "\n" for r in rows), encoding="utf-8")
    tiny = json.loads((Path(__file__).resolve().parent.parent / "configuration" / "tiny.json").read_text())
    (tmp_path / "model.json").write_text(json.dumps({**tiny, "d_model": 32, "d_ff": 64}))
    train = ["--model_config", str(tmp_path / "model.json"), "--train_file", str(prefix), "--streaming"]
    train += ["--stream_chunk_pairs", "100", "--vocab_size", "300", "--max_tokens_per_step", "600", "--max_steps", "8"]
    train += ["--save_steps", "1000", "--eval_steps", "1000", "--device", "cpu", "--logging_steps", "8"]
    for chunks in ("worker", "here"):
        out = ["--out_dir", str(tmp_path / "results"), "--chunks", chunks, "--"]
        row = stream_steps.main([*out, *train, "--output_dir", str(tmp_path / chunks)])
        assert row["prefetch"] is (chunks == "worker") and row["steps"] == 8 and len(row["step_seconds"]) == 7
        prepared = [p["where"] for p in row["preparations"] if p["what"] == "prepare"]
        assert prepared[0] == "here" and len(prepared) > 1  # 8 steps of ~60-pair batches: past the first chunk
        assert set(prepared[1:]) == {chunks}
        assert row["steady_tokens_per_s"] > 0 and row["machine_busy_s"] > 0
    assert len(list((tmp_path / "results").glob("stream-steps-*.jsonl"))) == 2
