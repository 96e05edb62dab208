"""`midtrain.num_threads`: the thread count holds inside the block and is restored after it, even on error."""

import os

import pytest
import torch

from flywheel.pipeline.midtrain import torch_threads

OUTSIDE = (os.cpu_count() or 1) + 3  # a count neither case sets, so "restored" cannot pass by accident


@pytest.fixture
def outside_count():
    before = torch.get_num_threads()
    torch.set_num_threads(OUTSIDE)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("n, want", [(1, 1), (0, os.cpu_count() or 1)])
def test_torch_threads_sets_then_restores(outside_count, n, want):
    with torch_threads(n):
        assert torch.get_num_threads() == want
    assert torch.get_num_threads() == OUTSIDE


def test_torch_threads_restores_after_an_error(outside_count):
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError("training failed")
    assert torch.get_num_threads() == OUTSIDE
