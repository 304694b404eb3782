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


def test_a_model_row_times_each_form_over_pdl_and_checks_outputs_against_pdls(monkeypatch):
    """``model_row`` on the CPU with the model and the timing faked: each form's forward runs with
    that form in place (its output and timing are the form's), ``*_over_pdl`` is the form's time
    over PDL's, and one form giving another output makes ``same_output`` False."""
    import nas.models
    from benchmarks import model_vs_compile as mc
    from benchmarks._timing import Timing

    def pdl_form(t):
        return {}

    def plain_form(t):
        return {}

    variants = {"pdl": pdl_form, "plain": plain_form}
    us = {pdl_form: 10.0, plain_form: 11.0}
    outs = {pdl_form: torch.ones(3), plain_form: torch.ones(3)}

    seen = []  # the form in place at each forward

    class FakeTriton:
        def forward(self, x):
            seen.append(lt.after_library)
            return outs[lt.after_library]

        __call__ = forward

    def fake_time_graphs(sides, *, reps):
        timed = {}
        for name, fns in sides.items():
            seen.clear()
            fns[0]()
            timed[name] = Timing(us[seen[0]], 0, 0, 0.1, reps)
        return timed

    arch = mc.architectures(7, 1)[0]
    monkeypatch.setattr(mc, "model_and_inputs", lambda a, shape: (object(), None, [torch.zeros(1, 4)]))
    monkeypatch.setattr(nas.models, "to_triton", lambda model: FakeTriton())
    monkeypatch.setattr(pal, "time_graphs", fake_time_graphs)
    row = pal.model_row(3, arch, "1x256", variants)
    assert row["arch_index"] == 3 and row["shape"] == "1x256" and row["same_output"] is True
    assert row["pdl_us"]["median_us"] == 10.0 and row["plain_us"]["median_us"] == 11.0
    assert row["plain_over_pdl"] == pytest.approx(1.1) and row["pdl_over_pdl"] == 1.0
    assert lt.after_library is common.after_library
    outs[plain_form] = torch.tensor([1.0, 1.0, 1.0 + 2**-10])
    assert pal.model_row(3, arch, "1x256", variants)["same_output"] is False
