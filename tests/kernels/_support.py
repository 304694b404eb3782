"""What the kernel test modules share: where kernels run here, skip markers, seeded inputs, and
the fused-qkv machinery of the attention-style kernels (softmax and linear attention run the
same checks: a kernel on a fresh projection into a NaN buffer against its reference).

Where CUDA is absent, ``tests/conftest.py`` sets TRITON_INTERPRET before any kernel module is
imported, so every ``@triton.jit`` kernel runs under Triton's interpreter on CPU tensors.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable

import pytest
import torch

from kernels._common import INTERPRETED

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
DEVICE = CUDA if torch.cuda.is_available() else CPU  # where the kernels run here
requires_interpreter = pytest.mark.skipif(not INTERPRETED, reason="interpreter tests run where CUDA is absent")
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


Shape = tuple[int, int, int, int]  # (B, T, H, D)


def seeded(*key: object) -> torch.Generator:
    """A CPU generator seeded by the test case: fresh draws per case, reproducible per case."""
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def random_qkv(B: int, T: int, H: int, D: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A fused projection ``[B, T, 3·H·D]`` of fresh random values."""
    return torch.randn(B, T, 3 * H * D, device=device).to(dtype)


def head_views(qkv: torch.Tensor, H: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, T, _ = qkv.shape
    return tuple(qkv.view(B, T, 3, H, -1).permute(2, 0, 3, 1, 4))  # [B, H, T, D] strided views


def poisoned(B: int, T: int, H: int, D: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An output buffer ``[B, T, H·D]`` of NaN: any element the kernel skips fails the check."""
    return torch.full((B, T, H * D), float("nan"), device=device, dtype=dtype)


def assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, bound: float) -> None:
    assert not actual.isnan().any(), "output has NaN: an element was not written"
    err = ((actual.float() - expected.float()).norm() / expected.float().norm()).item()
    assert err <= bound, f"relative error {err:.2e} > {bound:.0e}"


DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def qkv_cases(rows: Iterable[tuple[int, int, torch.dtype]]) -> list:
    """``(D, T, dtype)`` rows as parameters ``D,T,dtype`` with ids like ``D64-T1000-bf16``."""
    return [pytest.param(D, T, dtype, id=f"D{D}-T{T}-{DTYPE_NAMES[dtype]}") for D, T, dtype in rows]


def check_qkv_kernel(
    kernel: Callable[..., torch.Tensor],
    reference: Callable[..., torch.Tensor],
    shape: tuple[int, int, int, int],
    dtype: torch.dtype,
    device: torch.device,
    bound: float,
) -> None:
    """``kernel(qkv, H, out=…)`` on a fresh fused projection ``qkv [B, T, 3·H·D]`` (``shape`` is
    ``(B, T, H, D)``), written into a NaN buffer, against ``reference(q, k, v)`` of its head views
    ``[B, H, T, D]``: relative Frobenius error ≤ ``bound``."""
    B, T, H, D = shape
    qkv = random_qkv(B, T, H, D, dtype, device)
    out = kernel(qkv, H, out=poisoned(B, T, H, D, dtype, device))
    assert_rel_close(out, reference(*head_views(qkv, H)), bound)


def config_params(pairs: Iterable[tuple[int, object]], name: Callable[[object], str]) -> list:
    """pytest params ``(head dim, config)``, each pair once and in order, with readable ids."""
    return [pytest.param(D, c, id=f"D{D}-{name(c)}") for D, c in dict.fromkeys(pairs)]


def spy_norm_launches(monkeypatch: pytest.MonkeyPatch) -> list:
    """The grids of every standalone norm kernel launch from here on (the fold removes them)."""
    import kernels.norm.triton as nt

    calls, real = [], nt._norm_kernel

    class Spy:
        def __getitem__(self, grid):
            calls.append(grid)
            return real[grid]

    monkeypatch.setattr(nt, "_norm_kernel", Spy())
    return calls
