"""``benchmarks._timing.write_part``: one file per question and GPU, each part rewritten by its own
run and the others kept; a run of one part never loses another's rows."""

from __future__ import annotations

import json

from benchmarks._timing import write_part


def test_a_part_is_rewritten_and_the_others_kept(tmp_path):
    path = tmp_path / "decode_h999.json"
    write_part(path, "attention", [{"N": 1}], peer="sdpa")
    write_part(path, "step", [{"B": 2}])
    write_part(path, "attention", [{"N": 3}], peer="sdpa")
    parts = json.loads(path.read_text())
    assert set(parts) == {"attention", "step"}
    assert parts["attention"]["results"] == [{"N": 3}] and parts["attention"]["peer"] == "sdpa"
    assert parts["step"]["results"] == [{"B": 2}] and "torch" in parts["step"]  # the environment recorded
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file, replaced atomically
