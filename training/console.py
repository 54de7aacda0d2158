"""The console scripts `pip install` puts on PATH (setup.cfg's entry points): `vaswani-train` is
`python -m training.train`, and so on, with the same arguments, help, errors and exit status.

    pip install "vaswani-transformer[train]"   # or, in a checkout: pip install -e ".[train]"
    vaswani-train --output_dir runs/tiny
    vaswani-translate --model runs/tiny < sentences.en > sentences.de
"""

import runpy


def _run(command: str) -> None:
    # exactly `python -m training.<command>`: its `if __name__ == "__main__"` block runs. training/__init__.py has
    # set the commands' OpenMP defaults already (threads.started_as_command knows these scripts); torch loads later
    runpy.run_module(f"training.{command}", run_name="__main__", alter_sys=True)


def train() -> None:
    _run("train")


def evaluate() -> None:
    _run("evaluate")


def translate() -> None:
    _run("translate")


def average() -> None:
    _run("average")


def publish() -> None:
    _run("publish")


def export() -> None:
    _run("export")


def demo() -> None:
    _run("demo")
