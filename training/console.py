"""The console scripts `pip install` puts on PATH (setup.cfg's entry points): `vaswani-train` is
`python -m training.train`, and so on, with the same arguments, help, errors and exit status.

    pip install "vaswani-transformer[train]"   # or, in a checkout: pip install -e ".[train]"
    vaswani-train --output_dir runs/tiny
    vaswani-translate --model runs/tiny < sentences.en > sentences.de
"""

import runpy
from collections.abc import Callable

COMMANDS = ("train", "evaluate", "translate", "average", "publish", "export", "demo")


def _script(command: str) -> Callable[[], None]:
    def run() -> None:
        # exactly `python -m training.<command>`: its `if __name__ == "__main__"` block runs. training/__init__.py
        # has set the commands' OpenMP defaults already (threads.started_as_command knows these scripts)
        runpy.run_module(f"training.{command}", run_name="__main__", alter_sys=True)

    run.__name__ = run.__qualname__ = command
    return run


# one entry point a command (setup.cfg's console_scripts; tests/test_install.py runs each)
train, evaluate, translate, average, publish, export, demo = (_script(c) for c in COMMANDS)
