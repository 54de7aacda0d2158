"""Fixtures shared by the test modules.

tests/ is not a package: pytest (its default `prepend` import mode) puts this folder on sys.path, so test modules
import their helpers (tiny_runs, isolated, transformers_suite) by plain name."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """The models are tiny: one thread keeps OpenMP workers from spinning against each other on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
