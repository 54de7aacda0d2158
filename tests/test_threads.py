"""Our commands set OpenMP's wait policy before torch loads (training/threads.py); users' settings win."""

import json
import os
import subprocess
import sys
from pathlib import Path

from training.threads import OFF_SWITCH, apply_command_defaults, command_defaults, started_as_command

ROOT = Path(__file__).resolve().parents[1]
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", OFF_SWITCH)


def run_threads_command(**extra: str) -> dict[str, str]:
    """`python -m training.threads` in a clean environment plus `extra`: the settings a command runs with."""
    env = {k: v for k, v in os.environ.items() if k not in WAIT_VARS} | extra
    out = subprocess.run(
        [sys.executable, "-m", "training.threads"], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_a_command_starts_with_the_measured_defaults():
    settings = run_threads_command()
    expected = command_defaults(os.cpu_count() or 1).get("GOMP_SPINCOUNT", "")
    assert settings["GOMP_SPINCOUNT"] == expected and settings["OMP_WAIT_POLICY"] == ""
    assert command_defaults(2) == {"GOMP_SPINCOUNT": "1000"}  # the measured choice (benchmarks/results/load-*)
    assert command_defaults(1) == {}


def test_the_users_settings_win_and_the_switch_turns_ours_off():
    active = run_threads_command(OMP_WAIT_POLICY="ACTIVE")
    assert active["OMP_WAIT_POLICY"] == "ACTIVE" and active["GOMP_SPINCOUNT"] == ""
    assert run_threads_command(GOMP_SPINCOUNT="5000")["GOMP_SPINCOUNT"] == "5000"
    assert run_threads_command(**{OFF_SWITCH: "1"})["GOMP_SPINCOUNT"] == ""


def test_importing_the_package_from_other_code_changes_nothing():
    code = "import training, torch, os; print(os.environ.get('GOMP_SPINCOUNT'), torch.get_num_threads())"
    env = {k: v for k, v in os.environ.items() if k not in WAIT_VARS}
    plain = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    assert plain.stdout.split()[0] == "None"


def test_only_a_training_command_applies_them(monkeypatch):
    assert started_as_command(["python", "-m", "training.train", "--output_dir", "x"])
    assert not started_as_command(["python", "-m", "pytest", "training.train"])
    assert started_as_command(["python", "-X", "importtime", "-u", "-m", "training.evaluate"])
    assert not started_as_command(["python", "script.py", "-m", "training.train"])  # the script's own arguments
    assert not started_as_command(["python", "-c", "import training"])
    assert started_as_command(["/venv/bin/python", "/venv/bin/vaswani-train", "--output_dir", "x"])  # console script
    assert not started_as_command(["/venv/bin/python", "/venv/bin/other-tool", "vaswani-train"])
    for name in WAIT_VARS:
        monkeypatch.delenv(name, raising=False)
    assert apply_command_defaults(["python", "-m", "training.train"]) == {}  # torch is loaded in this process


def test_load_benchmark_smoke(tmp_path):
    """benchmarks/load.py runs each cell in fresh processes and records the setting, the load and the stall check."""
    env = {k: v for k, v in os.environ.items() if k not in WAIT_VARS}
    cmd = [sys.executable, "-m", "benchmarks.load", "--smoke", "--settings", "commands", "--out_dir", str(tmp_path)]
    subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    (jsonl,) = tmp_path.glob("load-*.jsonl")
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [(r["setting"], r["load"]) for r in rows] == [("commands", "idle"), ("commands", "python")]
    expected = " ".join(f"{k}={v}" for k, v in command_defaults(os.cpu_count() or 1).items()) or "(none)"
    for row in rows:
        assert "error" not in row, row.get("error")
        assert row["env_added"] == expected and row["calls"] >= 3 and row["mean_ms"] > 0
        assert "foreign_cpu_s" in row and "cpu" in row["env"]
