"""Candidate networks: ``build(arch, task)`` gives the torch ``HybridModel`` used for training."""

from __future__ import annotations

import torch

from nas.models.decode import DecodeCache, LayerCache
from nas.models.hybrid import Block, HybridModel
from nas.models.population import Population
from nas.models.triton_decode import TritonDecoder
from nas.models.triton_decode_stored import StoredDecoder
from nas.models.triton_model import TritonModel, to_triton
from nas.spec import ArchSpec
from nas.tasks.base import Task

__all__ = [
    "Block",
    "DecodeCache",
    "HybridModel",
    "LayerCache",
    "Population",
    "StoredDecoder",
    "TritonDecoder",
    "TritonModel",
    "build",
    "to_triton",
]


def build(arch: ArchSpec, task: Task | None = None, *, seed: int | None = None) -> HybridModel:
    """A freshly initialised model for ``arch``; with ``seed`` the weights are reproducible.

    ``task``, when given, is checked against the vocabulary and outputs the arch was sized for.
    """
    if task is not None and (task.vocab_size, task.n_out, task.readout) != (arch.vocab_size, arch.n_out, arch.readout):
        raise ValueError(
            f"arch is sized for vocab={arch.vocab_size}, n_out={arch.n_out}, readout={arch.readout!r}; "
            f"task {task.name!r} has vocab={task.vocab_size}, n_out={task.n_out}, readout={task.readout!r}"
        )
    if seed is None:
        return HybridModel(arch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return HybridModel(arch)
