"""benchmarks/precision_search.py's summary on constructed trial records (nothing trains): each
trial's precision setting and accuracy cost, and the per-setting statistics."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

from benchmarks.precision_search import per_setting, trial_row
from nas.latency import LatencyShape
from nas.latency._result import Latency
from nas.search.record import TrialRecord
from nas.spec import ArchSpec, LayerSpec


def _record(number, *, kv="bf16", state="fp32", acc=0.9, full=None, decode_ms=0.05, cache_mb=1.0):
    layers = (
        LayerSpec("attention", heads=2, kv_dtype=kv),
        LayerSpec("linear_attention", heads=2, feature_map="elu+1", state_dtype=state),
    )
    arch = ArchSpec(d_model=32, layers=layers, vocab_size=16, n_out=16)
    decode = Latency(decode_ms, 0.0, "measured", "NVIDIA H100 80GB HBM3", "bf16", LatencyShape(1, 32768), kind="decode")
    return TrialRecord(
        number=number,
        state=TrialState.COMPLETE,
        values={"accuracy": acc, "decode_latency_ms": decode_ms, "cache_memory_mb": cache_mb},
        arch=arch,
        arch_summary="A L | d=32",
        decode_latency=decode,
        full_precision_accuracy=full,
    )


def test_a_row_names_its_setting_and_costs_full_minus_stored():
    row = trial_row(_record(3, kv="fp8", state="bf16", acc=0.90, full=0.95, decode_ms=0.04, cache_mb=2.5))
    assert row["trial"] == 3 and row["precision"] == "kv fp8, state bf16"
    assert row["accuracy"] == 0.90 and row["full_precision_accuracy"] == 0.95
    assert row["accuracy_cost"] == pytest.approx(0.05)
    assert row["decode_latency_ms"] == 0.04 and row["cache_memory_mb"] == 2.5
    assert row["decode_latency_source"] == "measured" and row["decode_device"] == "NVIDIA H100 80GB HBM3"


def test_full_precision_costs_nothing_and_is_named_full():
    row = trial_row(_record(0, acc=0.8, full=None))
    assert row["precision"] == "full" and row["full_precision_accuracy"] == 0.8 and row["accuracy_cost"] == 0.0


def test_per_setting_groups_by_setting_with_median_and_largest_cost():
    rows = [
        trial_row(_record(0, acc=0.8)),
        trial_row(_record(1, kv="fp8", acc=0.90, full=0.91, decode_ms=0.02)),
        trial_row(_record(2, kv="fp8", acc=0.50, full=0.70, decode_ms=0.04)),
        trial_row(_record(3, kv="fp8", acc=0.60, full=0.60, decode_ms=0.06)),
    ]
    stats = per_setting(rows)
    assert set(stats) == {"full", "kv fp8"}
    fp8 = stats["kv fp8"]
    assert fp8["trials"] == 3
    assert fp8["median_accuracy_cost"] == pytest.approx(0.01)
    assert fp8["max_accuracy_cost"] == pytest.approx(0.20)
    assert fp8["median_decode_latency_ms"] == pytest.approx(0.04)
    assert stats["full"]["trials"] == 1 and stats["full"]["max_accuracy_cost"] == 0.0
