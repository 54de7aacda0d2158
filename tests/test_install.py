"""The package as `pip install` makes it, away from a checkout: the wheel holds the model, the commands and their
library, the configuration files and the card template; the `vaswani-*` scripts run from any folder and find the
installed recipes (training.common.files.project_file), and `vaswani-demo` builds, saves, reloads and decodes."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = ("train", "evaluate", "translate", "average", "publish", "export", "demo")  # the README names these


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A wheel built from the tracked files (so nothing untracked sneaks in), installed into a folder of its own."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for name in tracked.splitlines():
        if (REPO / name).is_file() and not name.startswith(("benchmarks/results/", "tests/")):
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((REPO / name).read_bytes())
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "wheel"), str(source)],
                   check=True, capture_output=True, text=True)  # fmt: skip
    wheel = next((root / "wheel").glob("vaswani_transformer-*.whl"))
    site = root / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, capture_output=True)
    return {"wheel": wheel, "site": site, "elsewhere": root}


def run_script(installed, name: str, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(installed["site"]), "HF_HUB_OFFLINE": "1", "HOME": "/tmp"}
    script = installed["site"] / "bin" / f"vaswani-{name}"
    return subprocess.run([sys.executable, str(script), *args], cwd=installed["elsewhere"], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def test_wheel_holds_the_commands_library_configuration_and_template(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    tracked = subprocess.run(["git", "ls-files", "training", "modeling_vaswani"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()  # fmt: skip
    missing = [name for name in tracked if name.endswith(".py") and name not in names]
    assert not missing, f"tracked modules the wheel lacks: {missing}"
    data = {n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n}
    configs = sorted(p.name for p in (REPO / "configuration").iterdir() if p.suffix in (".json", ".yaml"))
    expected = {"share/vaswani-transformer/model_card.md"} | {
        f"share/vaswani-transformer/configuration/{c}" for c in configs
    }
    assert expected <= data, f"not installed: {sorted(expected - data)}"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(installed["wheel"]).read(entry_points).decode()
    for name in SCRIPTS:
        assert f"vaswani-{name} = training.console:{name}" in text


def test_scripts_run_from_an_install_outside_a_checkout(installed):
    for name in SCRIPTS:
        done = run_script(installed, name, "--help")
        assert done.returncode == 0, (name, done.stderr[-2000:])
        assert "usage:" in done.stdout, name
    help_text = " ".join(run_script(installed, "train", "--help").stdout.split())
    assert "from recipe_tiny.json" in help_text  # the installed recipe gave the defaults
    bad = run_script(installed, "evaluate", "--model", "./nowhere", "--dataset_name", "default", "--output_dir", "o")
    assert (
        bad.returncode == 2 and bad.stderr.strip().splitlines()[-1] == "error: --model ./nowhere: no such model folder"
    )


def test_demo_builds_saves_reloads_and_decodes_from_the_install(installed, tmp_path):
    done = run_script(installed, "demo", "--output_dir", str(tmp_path / "demo"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "built configuration/tiny.json: d_model=" in done.stdout
    assert "matches" in done.stdout
    imported = subprocess.run(
        [sys.executable, "-c", "import training, modeling_vaswani; print(training.__file__, modeling_vaswani.__file__)"],
        cwd=installed["elsewhere"], env={"PYTHONPATH": str(installed["site"]), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert imported.count(str(installed["site"])) == 2  # the installed copies ran, not the checkout
