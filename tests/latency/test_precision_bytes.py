"""Memory at each layer's precision fields (fp8 1 byte, bf16 2, fp32 4, plus fp8's fp32 scales), and
what the latencies price: a decode step at them, a forward at the kernels' own dtypes."""

from __future__ import annotations

import dataclasses

import pytest
from optuna.trial import TrialState

from hardware_profiles import load_profile
from nas.latency import (
    STORED_NOTE,
    STORED_WIDENING,
    UNPRICED,
    LatencyShape,
    cache_memory,
    count_params,
    decode_work,
    memory,
    predict,
    predict_decode,
    unpriced_precision,
    weight_bytes,
)
from nas.spec import ArchSpec, LayerSpec

D, HEADS, CONTEXT, BATCH = 64, 4, 1000, 3
ATTN = LayerSpec("attention", heads=HEADS, mlp_ratio=2)
LIN = LayerSpec("linear_attention", heads=HEADS, feature_map="elu+1", mlp_ratio=0)
MLP = LayerSpec("none", mlp_ratio=3)


def _arch(attn: dict | None = None, lin: dict | None = None, mlp: dict | None = None) -> ArchSpec:
    layers = (dataclasses.replace(ATTN, **(attn or {})), dataclasses.replace(LIN, **(lin or {})))
    return ArchSpec(D, (*layers, dataclasses.replace(MLP, **(mlp or {}))), 32, 32)


FULL = _arch()
# the blocks' linear weights (elements, output channels): attention QKV + out + MLP up/down at ratio 2,
# linear attention QKV + out, the MLP-only block's up/down at ratio 3
ATTN_W, ATTN_ROWS = 4 * D * D + 2 * D * 2 * D, 4 * D + 2 * D + D
LIN_W, LIN_ROWS = 4 * D * D, 4 * D
MLP_W, MLP_ROWS = 2 * D * 3 * D, 3 * D + D


def test_full_precision_counts_as_before():
    c = cache_memory(FULL, CONTEXT, BATCH)
    assert c.kv_cache_bytes == BATCH * 2 * CONTEXT * D * 2  # bf16
    assert c.state_bytes == BATCH * HEADS * (16 * 16 + 16) * 4  # fp32 state and normalizer
    assert c.weight_bytes == count_params(FULL) * 2 == weight_bytes(FULL, 2)
    m = memory(FULL, LatencyShape(BATCH, 100))
    assert (m.kv_cache_bytes, m.recurrent_state_bytes) == (BATCH * 2 * 100 * D * 2, BATCH * HEADS * 16 * 16 * 4)


def test_the_kv_cache_counts_its_dtype_and_its_per_head_scales():
    fp8 = _arch(attn={"kv_dtype": "fp8"})
    scales = 2 * HEADS * 4  # an fp32 scale per head for K and for V, per sequence
    assert cache_memory(fp8, CONTEXT, BATCH).kv_cache_bytes == BATCH * (2 * CONTEXT * D * 1 + scales)
    assert memory(fp8, LatencyShape(BATCH, 100)).kv_cache_bytes == BATCH * (2 * 100 * D * 1 + scales)
    # the rest is as at full precision
    full, narrow = cache_memory(FULL, CONTEXT, BATCH), cache_memory(fp8, CONTEXT, BATCH)
    assert (narrow.state_bytes, narrow.conv_bytes, narrow.weight_bytes) == (
        full.state_bytes,
        full.conv_bytes,
        full.weight_bytes,
    )


def test_the_state_counts_its_dtype():
    bf16 = _arch(lin={"state_dtype": "bf16"})
    assert cache_memory(bf16, CONTEXT, BATCH).state_bytes == BATCH * HEADS * (16 * 16 + 16) * 2
    assert memory(bf16, LatencyShape(BATCH, 100)).recurrent_state_bytes == BATCH * HEADS * 16 * 16 * 2


@pytest.mark.parametrize(
    "narrow, elements, rows",
    [
        ({"attn": {"weight_dtype": "fp8"}}, ATTN_W, ATTN_ROWS),
        ({"lin": {"weight_dtype": "fp8"}}, LIN_W, LIN_ROWS),
        ({"mlp": {"weight_dtype": "fp8"}}, MLP_W, MLP_ROWS),
    ],
)
def test_a_block_s_linear_weights_count_one_byte_and_a_scale_per_output_channel(narrow, elements, rows):
    arch = _arch(**narrow)
    full = count_params(arch) * 2
    expected = full - elements * 2 + elements * 1 + rows * 4  # biases, norms, embedding, head stay bf16
    assert weight_bytes(arch, 2) == expected
    assert cache_memory(arch, CONTEXT, BATCH).weight_bytes == expected
    assert memory(arch, LatencyShape(BATCH, 100)).weight_bytes == expected
    assert weight_bytes(arch, 4) == count_params(arch) * 4 - elements * 3 + rows * 4  # at fp32 activations


def test_everything_narrow_is_cheaper_and_the_cache_memory_objective_sees_it():
    narrow = _arch(attn={"kv_dtype": "fp8", "weight_dtype": "fp8"}, lin={"state_dtype": "bf16", "weight_dtype": "fp8"})
    full, small = cache_memory(FULL, CONTEXT, BATCH), cache_memory(narrow, CONTEXT, BATCH)
    assert small.kv_cache_bytes < full.kv_cache_bytes and small.state_bytes < full.state_bytes
    assert small.total_mb < full.total_mb


def test_a_forward_latency_does_not_price_the_stored_precision():
    """No forward kernel stores fp8 or a bf16 state: a forward is predicted at the kernels' own
    dtypes, and says so (a note and the label); an architecture at full precision as before."""
    h200 = load_profile("h200")
    narrow = _arch(attn={"kv_dtype": "fp8"}, lin={"state_dtype": "bf16"})
    full, lat = predict(FULL, LatencyShape(1, 256), h200), predict(narrow, LatencyShape(1, 256), h200)
    assert lat.median_ms == full.median_ms and lat.interval == full.interval
    assert dict(lat.notes)[UNPRICED] == "kv fp8, state bf16" and UNPRICED not in dict(full.notes)
    assert "not priced at kv fp8, state bf16" in lat.label() and "not priced" not in full.label()
    measured = dataclasses.replace(full, source="measured", device="NVIDIA H200")
    assert unpriced_precision(measured, narrow).label() == "measured (NVIDIA H200, not priced at kv fp8, state bf16)"
    assert unpriced_precision(measured, FULL) is measured


def test_a_decode_step_is_priced_at_the_stored_precision_with_a_wider_interval():
    """``decode_work`` counts what ``StoredDecoder`` moves: the fp8 cache's bytes and scales, the
    bf16 state's, fp8 weights at a byte plus a scale per channel and a quantize launch before each
    fp8 linear; the prediction prices them with the full-precision fit, its interval widened."""
    kv = _arch(attn={"kv_dtype": "fp8"})
    st = _arch(lin={"state_dtype": "bf16"})
    w8 = _arch(attn={"weight_dtype": "fp8"}, mlp={"weight_dtype": "fp8"})
    full = decode_work(FULL, CONTEXT, BATCH)
    got = decode_work(kv, CONTEXT, BATCH)
    assert got.cache_bytes * 2 == full.cache_bytes  # one byte an element, not two
    assert got.state_bytes == full.state_bytes + BATCH * 2 * HEADS * 4  # the scales, read with the step
    got = decode_work(st, CONTEXT, BATCH)
    assert full.state_bytes - got.state_bytes == BATCH * 2 * HEADS * (16 * 16 + 16) * 2  # read + written, 2 B less
    got = decode_work(w8, CONTEXT, BATCH)
    assert got.launches == full.launches + 4 + 2  # the attention block's 4 linears, the MLP block's 2
    assert got.weight_bytes == full.weight_bytes - (ATTN_W + MLP_W) + (ATTN_ROWS + MLP_ROWS) * 4
    assert got.state_bytes > full.state_bytes  # the rows read again and written in fp8
    h200 = load_profile("h200")
    base = predict_decode(FULL, BATCH, CONTEXT, h200)
    for arch in (kv, st):
        lat = predict_decode(arch, BATCH, CONTEXT, h200)
        assert lat.median_ms < base.median_ms and lat.interval == base.interval * STORED_WIDENING
        assert STORED_NOTE in dict(lat.notes) and UNPRICED not in dict(lat.notes) and "not priced" not in lat.label()
        caveat = f"stored dtypes at full-precision costs, ±{lat.interval * 100:.0f} %"
        assert lat.basis == base.basis and lat.label() == f"predicted ({lat.basis}, {caveat})"
    assert STORED_NOTE not in dict(base.notes)


def test_a_caption_or_axis_over_many_trials_names_the_basis_once(tmp_path):
    """The final table's caption and the report's latency axis list how the trials' latencies were
    obtained. Each trial's label carries its own ``not priced at`` caveat, which differs with every
    combination of dtypes (per-layer choices multiply them): listed label by label, a handful of
    trials repeated one basis four times. They name the basis once, and the caveat once."""
    from optuna.trial import create_trial

    from nas.commands._front import front_table
    from nas.results.report import figures
    from nas.search import record
    from nas.search.record import TrialRecord
    from nas.search.setup import SearchSetup
    from nas.search.study import open_study
    from nas.spec import TrainSpec

    h200, shape = load_profile("h200"), LatencyShape(1, 256)
    study = open_study("p", str(tmp_path / "p.journal"))
    record.write_study_setup(study, SearchSetup("s", "", "mqar", "auto", "h200", "1x256", test_size=64))
    narrow = ({}, {"kv_dtype": "fp8"}, {"weight_dtype": "fp8"}, {"kv_dtype": "fp8", "weight_dtype": "fp8"})
    for i, attn in enumerate(narrow):
        arch = _arch(attn=attn, lin={"state_dtype": "bf16"} if i == 3 else None)
        acc, mem = 0.5 + 0.1 * i, 0.5 + 0.1 * i  # each more accurate and larger: all on the front
        r = TrialRecord(
            i,
            TrialState.COMPLETE,
            values={"accuracy": acc, "latency_ms": 0.05, "memory_mb": mem},
            arch=arch,
            train=TrainSpec("adamw", 1e-3, 0.0, 0.0, 10, 8),
            arch_summary=arch.summary(),
            params=count_params(arch),
            latency=predict(arch, shape, h200),
            memory={"total_mb": mem},
            steps_done=10,
            trained_accuracy=acc,
        )
        study.add_trial(create_trial(values=[acc, 0.05, mem], user_attrs=r.to_dict()))
    basis = f"predicted (h200, calibrated 2026-12-04, ±{round(100 * predict(FULL, shape, h200).interval)} %)"
    caption = " ".join(str(front_table(study).caption).split())
    lines = figures(study)["front2d"].layout.xaxis.title.text.split("<br>")
    assert len(lines) > 1 and max(map(len, lines)) <= 90  # wrapped: one line ran off the figure (PNG clipped it)
    assert not any(line.rstrip().endswith(tuple("0123456789")) and "±" in line[-6:] for line in lines)  # "±14 %" whole
    axis = " ".join(lines).replace("\u00a0", " ")
    for text in (caption, axis):
        assert text.count("predicted (") == 1 and basis in text, text
        assert text.count("not priced") == 1, text


def test_decode_labels_at_stored_dtypes_are_said_once_per_basis_with_their_intervals():
    """A search over precision fields predicts decode steps of full-precision trials and of trials
    at stored dtypes (a wider interval): the caption names the basis with its interval, then once
    where a trial stores narrower dtypes, with theirs."""
    from nas.latency import shared_labels

    h200 = load_profile("h200")
    lats = [
        predict_decode(arch, BATCH, CONTEXT, h200)
        for arch in (FULL, _arch(attn={"kv_dtype": "fp8"}), _arch(lin={"state_dtype": "bf16"}), FULL)
    ]
    base, stored = lats[0], lats[1]
    labels = shared_labels(lats)
    assert labels[0] == base.label() and len(labels) == 2, labels
    plain = base.label().removesuffix(f", ±{base.interval * 100:.0f} %)") + ")"
    assert labels[1] == (
        f"{plain} where a trial stores narrower dtypes: ±{stored.interval * 100:.0f} %, priced at full-precision costs"
    )
