"""Scripts that train, evaluate and publish the model; run from a checkout as `python -m training.<script>`."""

from .threads import apply_command_defaults

apply_command_defaults()  # before any command imports torch; a no-op on plain import (training/threads.py)
