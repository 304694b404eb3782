"""benchmarks/linear_attention_prefix.py without a GPU: its grid, --shapes for a rule's boundary,
and a bad shape refused in one line with exit code 2."""

from __future__ import annotations

import pytest

from benchmarks import _timing
from benchmarks import default_peers as dp
from benchmarks import linear_attention_prefix as lap


def test_the_grid_holds_default_peers_shapes_and_the_models_mixers():
    grid = lap.cases()
    assert set(dp.LINATTN_CASES) <= set(grid) and set(lap.MODEL_CASES) <= set(grid)
    assert len(grid) == len(set(grid)), "a shape timed twice"


def test_shapes_replace_the_grid(capsys):
    lap.main(["--out", "unused.json", "--list", "--shapes", "8,2,1024,128", "16,1,1024,128", "8,2,1024,128"])
    assert capsys.readouterr().out.strip() == "2 shapes: [(8, 2, 1024, 128), (16, 1, 1024, 128)]"


@pytest.mark.parametrize("bad", ["8,2,1024", "8,2,1024,0", "8,2,x,64", "8,2,1024,64,1", "0,2,3,4"])
def test_a_bad_shape_is_one_line_and_exit_2(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        lap.main(["--out", "unused.json", "--list", "--shapes", bad])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"invalid shape {bad!r}" in err


def test_kernel_times_are_per_call_and_per_kernel_heaviest_first():
    """On the CPU profiler (the GPU one is the same code with CUDA events): two functions, one
    running a matmul and an add, the other an add only; per call, 0.5 matmuls and 1 add."""
    import torch

    a = torch.randn(96, 96)
    fns = [lambda: torch.mm(a, a).add_(1.0), lambda: a.add(1.0)]
    times = _timing.kernel_times(fns, rounds=3, activity="CPU")
    assert times["aten::mm"]["launches"] == 0.5 and times["aten::add"]["launches"] == 0.5
    assert times["aten::add_"]["launches"] == 0.5
    assert all(v["us"] > 0 for v in times.values())
    us = [v["us"] for v in times.values()]
    assert us == sorted(us, reverse=True)
