"""benchmarks/routes_vs_peer.py: the rules' route per shape and map scored against a peer timed in
another run — the variant the rule names is the one scored, misses say by how much, and a route
the routes file did not time correctly is an error, not a silent pick of another."""

from __future__ import annotations

import json

import pytest

from benchmarks import routes_vs_peer as rvp
from kernels.linear_attention import configs


def _timed(us: float) -> dict:
    return {"ok": True, "us": {"median_us": us}}


def _files(prefix_ok: bool = True) -> tuple[dict, dict]:
    short, long = (1, 4, 256, 64), (2, 2, 4097, 64)  # the prefix forward and the two passes
    assert configs.forward_route((9, 0), 4, 256, 64, "identity") == "prefix"
    assert configs.forward_route((9, 0), 4, 4097, 64, "elu+1") == "two_pass"
    prefix = rvp.prefix_variant(64)
    routes = {
        "gpu": "G",
        "results": [
            {
                "B": 1,
                "H": 4,
                "L": 256,
                "D": 64,
                "feature_map": "identity",
                "variants": {
                    "fused": _timed(1.0),  # the fastest, but not the rule's: must not be scored
                    "two_pass": _timed(9.0),
                    prefix: _timed(4.0) if prefix_ok else {"ok": False, "rel_err": 1.0},
                },
            },
            {
                "B": 2,
                "H": 2,
                "L": 4097,
                "D": 64,
                "feature_map": "elu+1",
                "variants": {"fused": _timed(90.0), "two_pass": _timed(20.0)},
            },
            {"B": 9, "H": 9, "L": 9, "D": 64, "feature_map": "relu", "variants": {"fused": _timed(1.0)}},
        ],
    }
    peers = {
        "gpu": "G",
        "results": [
            {"op": "linear_attention", "B": b, "H": h, "L": L, "D": d, "feature_map": fm, "peer_us": {"median_us": us}}
            for (b, h, L, d), fm, us in ((short, "identity", 5.0), (long, "elu+1", 24.0))
        ],
    }
    return routes, peers


def test_scores_the_rules_route_with_miss_by() -> None:
    routes, peers = _files()
    out = rvp.score(routes, peers)
    by = {(r["L"], r["feature_map"]): r for r in out["results"]}
    assert set(by) == {(256, "identity"), (4097, "elu+1")}  # the relu row has no peer: left out
    ident, elu = by[(256, "identity")], by[(4097, "elu+1")]
    assert ident["route"] == "prefix" and ident["speedup"] == pytest.approx(5.0 / 4.0) and ident["met"]
    assert elu["route"] == "two_pass" and elu["speedup"] == pytest.approx(1.2) and not elu["met"]
    assert elu["miss_by"] == pytest.approx(0.3) and all(r["cross_run"] for r in out["results"])
    assert out["summary"]["identity"]["met"] == 1 and out["summary"]["elu+1"]["met"] == 0


def test_a_route_not_timed_correctly_is_an_error(tmp_path) -> None:
    routes, peers = _files(prefix_ok=False)
    with pytest.raises(ValueError, match="not timed correctly"):
        rvp.score(routes, peers)
    routes, peers = _files()
    peers["gpu"] = "other"
    paths = []
    for name, data in (("r.json", routes), ("p.json", peers)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="different GPUs"):
        rvp.main(["--routes", str(paths[0]), "--peers", str(paths[1]), "--out", str(tmp_path / "o.json")])
