"""Input checks: a bad batch fails with a ValueError naming the tensor, never an index error or a device assert.

The checks keep no state; each looks only at the tensors it is given. Shapes are checked in every eager forward
(they cost nothing). Token ids are checked where that costs no host-device sync in a training step:
- in `forward`, for CPU tensors, and for tensors on any device outside autograd (inference, evaluation, generate:
  one sync per call, none per decoding step);
- for training batches, once, where the batches are made, on the CPU: training/trainer/batching.py's
  `BudgetCheckedCollator`. A training step on an accelerator fed by another loader is not checked.
tests/test_bad_input.py covers the model's checks, tests/test_batching.py the collator's.

This file travels to the Hub as remote code with `modeling_vaswani.py`, which imports it relatively.
"""

import torch
from transformers.utils import is_torchdynamo_compiling


def check_shapes(ids: torch.Tensor | None, mask: torch.Tensor | None, name: str, past: int = 0) -> None:
    """An empty batch or a mask of another shape fails here, with its name, not deep inside torch.

    A 2-D mask must be (batch, past + length); a 4-D mask is taken as a ready-made attention mask.
    """
    if ids is not None and (ids.dim() != 2 or ids.shape[0] == 0 or ids.shape[1] == 0):
        raise ValueError(f"{name} must be a non-empty (batch, length) tensor, got shape {tuple(ids.shape)}")
    if ids is not None and mask is not None and mask.dim() != 4:
        expected = (ids.shape[0], past + ids.shape[1])
        if tuple(mask.shape) != expected:
            raise ValueError(f"the attention mask of {name} has shape {tuple(mask.shape)}, expected {expected}")


def check_token_ids(ids: torch.Tensor, vocab_size: int, name: str, ignore_index: int | None = None) -> None:
    """Token ids outside [0, vocab_size) (other than `ignore_index`) raise a ValueError naming `name`."""
    bad = (ids < 0) | (ids >= vocab_size)
    if ignore_index is not None:
        bad &= ids != ignore_index
    if bad.any():
        raise ValueError(f"{name} holds token id {ids[bad][0].item()}, outside [0, vocab_size={vocab_size})")


def check_token_ids_in_forward(ids: torch.Tensor, vocab_size: int, name: str, ignore_index: int | None = None) -> None:
    """`check_token_ids` where it is cheap (see the module docstring): CPU tensors, or autograd off; not compiled."""
    if not is_torchdynamo_compiling() and (ids.device.type == "cpu" or not torch.is_grad_enabled()):
        check_token_ids(ids, vocab_size, name, ignore_index)
