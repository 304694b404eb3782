"""One intra-op thread for these tiny tensors: extra threads only add synchronisation, and on a
shared 2-core runner they spin against each other (50x slower measured)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_intraop_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
