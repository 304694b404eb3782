"""benchmarks/identity_route_summary.py: item 3's score from measured rows — the rules' route per
shape against the peer, miss_by, and which kernel the shortfall comes from."""

from __future__ import annotations

import json

import pytest

from benchmarks import identity_route_summary as summary
from kernels.linear_attention import configs

ENV = {"gpu": "NVIDIA H200", "torch": "t", "triton": "tr", "peer": "fla-core 0.6.0", "date": "d"}


def _t(us: float) -> dict:
    return {"median_us": us, "iqr_us": 0.1}


def _passes_row(B: int, H: int, L: int, D: int, ours: float, peer: float, kernels: dict) -> dict:
    plan = configs.two_pass_plan(B * H, L, D, configs.TWO_PASS_HOPPER[D][0], summary.SMS)
    route = {"us": _t(ours), "rel_err": 1e-3, "group": plan.group, "groups": plan.groups}
    return {
        "B": B,
        "H": H,
        "L": L,
        "D": D,
        "peer_us": _t(peer),
        "peer_kernel_us": {"chunk_fwd_kernel_h": 3.0, "chunk_fwd_kernel_o": 3.0},
        "route_kernel_us": kernels,
        "variants": {"route": route},
    }


def _focus_row(B: int, H: int, L: int, D: int, fused: float, peer: float) -> dict:
    kernels = {"chunk_fwd_kernel_h": 20.0, "chunk_fwd_kernel_o": 30.0}
    return {"B": B, "H": H, "L": L, "D": D, "fused_us": _t(fused), "peer_us": _t(peer), "fused_rel_err": 1e-3} | {
        "peer_kernel_us": kernels
    }


def test_scores_the_rules_route_and_names_the_shortfall(tmp_path, monkeypatch) -> None:
    long_rows = (16, 8, 2048, 32)  # the fused kernel here: sm_90's rule until 2026-12-04, forced back
    rule = configs.prefers_two_pass
    monkeypatch.setattr(
        configs, "prefers_two_pass", lambda cap, bh, L, D: (bh, L, D) != (128, 2048, 32) and rule(cap, bh, L, D)
    )
    assert rule((9, 0), 128, 2048, 32) and not configs.prefers_two_pass((9, 0), 128, 2048, 32)
    grouped = configs.two_pass_plan(4, 1000, 64, configs.TWO_PASS_HOPPER[64][0], summary.SMS)
    assert grouped.groups > 1
    passes = ENV | {
        "results": [
            _passes_row(
                2,
                2,
                1000,
                64,
                12.0,
                10.0,
                {"_two_pass_states_kernel": 3.0, "_two_pass_carry_kernel": 2.5, "_two_pass_out_kernel": 3.5},
            ),
            _passes_row(16, 8, 333, 64, 9.0, 10.0, {"_two_pass_states_kernel": 4.0, "_two_pass_out_kernel": 4.0}),
            _passes_row(1, 4, 449, 64, 8.0, 7.0, {"_two_pass_states_kernel": 4.5, "_two_pass_out_kernel": 2.5}),
            _passes_row(*long_rows, 50.0, 45.0, {"_two_pass_states_kernel": 30.0, "_two_pass_out_kernel": 20.0}),
        ]
    }
    focus = ENV | {"results": [_focus_row(*long_rows, 50.0, 45.0)]}
    out = summary.summarize(passes, focus)
    rows = {(r["B"], r["H"], r["L"], r["D"]): r for r in out["results"]}
    carry = rows[(2, 2, 1000, 64)]
    assert carry["route"] == "two_pass" and carry["miss_by"] == pytest.approx(1 - 10 / 12, abs=1e-4)
    assert carry["shortfall_from"].startswith("the carry scan")
    assert rows[(16, 8, 333, 64)]["met"] and rows[(16, 8, 333, 64)]["miss_by"] is None
    assert rows[(1, 4, 449, 64)]["shortfall_from"].startswith("pass 1")
    assert not rows[(1, 4, 449, 64)]["issue_grid"]
    fused = rows[long_rows]
    assert fused["route"] == "fused" and fused["speedup"] == pytest.approx(45 / 50)
    assert out["summary"]["all"]["shapes"] == 4 and out["summary"]["all"]["met"] == 1
    assert out["summary"]["issue_grid"]["shapes"] == 3 and out["untimed"] == []
    unfocused = summary.summarize(passes, ENV | {"results": []})  # the fused shape untimed: listed apart
    assert unfocused["untimed"] == [{"B": 16, "H": 8, "L": 2048, "D": 32, "route": "fused"}]
    assert unfocused["summary"]["all"]["shapes"] == 3
    paths = [tmp_path / "p.json", tmp_path / "f.json"]
    for p, data in zip(paths, (passes, focus), strict=True):
        p.write_text(json.dumps(data))
    assert summary.main(["--passes", str(paths[0]), "--focus", str(paths[1]), "--out", str(tmp_path / "o.json")]) == 0
    assert json.loads((tmp_path / "o.json").read_text())["summary"]["all"]["met"] == 1


def test_a_row_measured_with_other_groups_than_the_plan_is_refused() -> None:
    row = _passes_row(2, 2, 1000, 64, 12.0, 10.0, {"_two_pass_states_kernel": 3.0, "_two_pass_out_kernel": 3.5})
    row["variants"]["route"]["groups"] += 1
    with pytest.raises(ValueError, match="groups"):
        summary.summarize(ENV | {"results": [row]}, ENV | {"results": []})
