"""Run Python in a fresh process that cannot import this package, as on the machine of a Hub user."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Prepended to every script: a meta-path finder refuses our packages (it also beats an editable install's own
# finder), and no sys.path entry may hold them; the script fails if `modeling_vaswani` is importable anyway.
_BLOCK_OUR_PACKAGES = textwrap.dedent(
    """
    import importlib.abc, os, sys

    class BlockOurPackages(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("modeling_vaswani", "training"):
                raise ImportError(f"blocked import of {name}")
            return None

    def holds_package(entry):
        entry = os.path.abspath(entry or os.getcwd())
        return entry == REPO_ROOT or os.path.isdir(os.path.join(entry, "modeling_vaswani"))

    sys.meta_path.insert(0, BlockOurPackages())
    sys.path[:] = [entry for entry in sys.path if not holds_package(entry)]
    try:
        import modeling_vaswani  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("modeling_vaswani is importable in the child")
    """
)


def run_isolated(script: str, args: list[str], tmp_path: Path) -> dict:
    """Run `script` (which prints `RESULT <json>` last) with `args` as sys.argv[1:], offline, with a private
    modules cache, from an empty folder, without PYTHONPATH and stdin; return the JSON it printed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_MODULES_CACHE=str(tmp_path / "modules"),
        TRANSFORMERS_VERBOSITY="error",
        TOKENIZERS_PARALLELISM="false",
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    code = f"REPO_ROOT = {str(REPO)!r}\n" + _BLOCK_OUR_PACKAGES + textwrap.dedent(script)
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.rpartition("RESULT ")[2])
