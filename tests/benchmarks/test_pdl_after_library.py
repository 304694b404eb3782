"""benchmarks/pdl_after_library.py without a GPU: the forms it captures and its summary."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import kernels._common as common
import kernels.linear.triton as lt
from benchmarks import pdl_after_library as pal


def test_each_form_is_in_place_only_while_its_call_runs():
    seen = []
    form = lambda t: {"mark": 1}  # noqa: E731
    assert pal.under(form, lambda: seen.append(lt.after_library))() is None
    assert seen == [form] and lt.after_library is common.after_library

    def boom():
        raise RuntimeError("in the capture")

    with pytest.raises(RuntimeError, match="in the capture"):
        pal.under(form, boom)()
    assert lt.after_library is common.after_library


def test_forms_answer_as_named(monkeypatch):
    fake_gpu = SimpleNamespace(device=torch.device("cuda", 0))
    monkeypatch.setattr(common, "_interpreted", lambda: False)
    monkeypatch.setattr(common, "_pdl_capable", lambda index: True)
    forms = pal.forms()
    assert set(forms) == {"rule", "pdl", "plain", "trigger_only"}
    assert forms["plain"](fake_gpu) == {} and forms["rule"](fake_gpu) == {}
    assert forms["pdl"](fake_gpu) == {"PDL": 1, "launch_pdl": True}
    assert forms["trigger_only"](fake_gpu) == {"PDL": 1, "launch_pdl": False}
    with common.pdl_early(True):
        assert forms["rule"](fake_gpu) == forms["pdl"](fake_gpu) == {"PDL": 2, "launch_pdl": True}
        assert forms["trigger_only"](fake_gpu) == {"PDL": 2, "launch_pdl": False}
    assert forms["trigger_only"](torch.zeros(1)) == {}


def _timed(us: float) -> dict:
    return {"median_us": us, "iqr_us": 0.1}


def test_summary_counts_against_the_peer_and_pdl():
    variants = {"pdl": None, "plain": None}
    rows = [
        {"part": "linear", "pdl_us": _timed(6.0), "plain_us": _timed(5.5), "peer_us": _timed(5.8)},
        {"part": "linear", "pdl_us": _timed(9.0), "plain_us": _timed(9.5), "peer_us": _timed(9.2)},
        {"part": "model", "shape": "1x256", "same_output": True, "pdl_over_pdl": 1.0, "plain_over_pdl": 1.04},
        {"part": "model", "shape": "1x256", "same_output": False, "pdl_over_pdl": 1.0, "plain_over_pdl": 1.0},
        {"part": "model", "shape": "8x1024", "same_output": True, "pdl_over_pdl": 1.0, "plain_over_pdl": 0.98},
    ]
    s = pal.summary(rows, variants)
    assert s["linear"] == {"rows": 2, "pdl_at_or_under_peer": 1, "plain_at_or_under_peer": 1}
    assert s["1x256"]["archs"] == 2 and s["1x256"]["all_same_output"] is False
    assert s["1x256"]["plain_over_pdl"] == {"median": 1.02, "max": 1.04}
    assert s["8x1024"]["plain_over_pdl"] == {"median": 0.98, "max": 0.98} and s["8x1024"]["all_same_output"]


def test_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):
        pal.main([])
