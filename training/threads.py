"""OpenMP's wait policy for our commands, set before torch loads: measured, not believed (benchmarks/load.py).

torch's CPU build runs its parallel regions on libgomp, whose idle threads spin before they sleep. On an idle machine
that spinning buys little; beside one other busy process it costs several times over, because the spinning thread
holds the core its descheduled partner needs. Sleeping at once (OMP_WAIT_POLICY=PASSIVE) bounds that, but pays a
futex wake-up per parallel region on the idle machine. A short spin, GOMP_SPINCOUNT=1000 (the count libgomp itself
falls back to when threads outnumber cores), keeps the idle speed and bounds the loss beside a competitor. The
measurements are in benchmarks/results/load-*.md (benchmarks/load.py); tests/test_threads.py checks when the default
applies. GOMP_SPINCOUNT is libgomp's: torch builds on other OpenMP runtimes (Intel's libiomp, macOS) ignore it.

`python -m training.<command>` and the `vaswani-<command>` scripts apply them from training/__init__.py, before any module imports torch. A user's
own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins; VASWANI_NO_THREAD_DEFAULTS=1 turns ours off. Importing `training` from
other code (a notebook, a test) never changes the environment.
"""

import os
import sys

OFF_SWITCH = "VASWANI_NO_THREAD_DEFAULTS"


def command_defaults(cpu_count: int) -> dict[str, str]:
    """The environment our commands add: idle OpenMP threads spin briefly, then sleep (see the module docstring)."""
    if cpu_count <= 1:  # one thread: no parallel region to wait in
        return {}
    return {"GOMP_SPINCOUNT": "1000"}


def started_as_command(orig_argv: list[str] | None = None) -> bool:
    """True when this interpreter was started as `python -m training.<command>` or as a `vaswani-<command>` script."""
    argv = list(sys.orig_argv if orig_argv is None else orig_argv)[1:]
    while argv and argv[0].startswith("-") and argv[0] not in ("-m", "-c", "-"):  # the interpreter's own options
        option = argv.pop(0)
        if option in ("-W", "-X", "--check-hash-based-pycs") and argv:  # options whose value is a separate word
            argv.pop(0)
    if argv and os.path.basename(argv[0]).startswith("vaswani-"):  # a console script of training/console.py
        return True
    return len(argv) >= 2 and argv[0] == "-m" and argv[1].startswith("training.")


def apply_command_defaults(orig_argv: list[str] | None = None) -> dict[str, str]:
    """Put `command_defaults` into os.environ when started as a command and torch is not loaded yet; returns what
    was set. Variables the user set already are kept, as is everything when the off switch is on."""
    if os.environ.get(OFF_SWITCH) == "1" or "torch" in sys.modules or not started_as_command(orig_argv):
        return {}
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:  # the user chose how threads wait
        return {}
    applied = command_defaults(os.cpu_count() or 1)
    os.environ.update(applied)
    return applied


if __name__ == "__main__":  # `python -m training.threads`: the wait settings a command started like this runs with
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS"):
        print(f"{name}={os.environ.get(name, '')}")
