"""What a resume or a worker takes from the study's record rather than from its own command line:
the data file (by resolved path and SHA-256)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from nas.search.study import SearchConfig, SearchError, prepare, worker_config
from tests.conftest import study_checksum


def _config(tmp_path: Path, space: Path, **kw) -> SearchConfig:
    base = dict(
        space=str(space), trials=1, storage=str(tmp_path / "s.journal"), study="t", device="cpu", baselines=False
    )
    return SearchConfig(**{**base, **kw})


def _npz(path: Path, rows: int, seq_len: int, seed: int) -> Path:
    """A token-LM data file of ``rows`` x ``seq_len`` tokens below 16."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:  # np.savez would append .npz to a name without it
        np.savez(f, x=rng.integers(0, 16, (rows, seq_len)), y=rng.integers(0, 16, (rows, seq_len)))
    return path


def _journal(tmp_path: Path) -> tuple[str, str]:
    storage = str(tmp_path / "s.journal")
    return study_checksum(storage, "t"), hashlib.sha256(Path(storage).read_bytes()).hexdigest()


@pytest.mark.parametrize("how", ["resume", "worker"])
def test_a_data_file_changed_since_the_study_was_created_is_refused(tmp_path, tiny_space, how):
    """The study records the file's SHA-256; a resume or a worker used to read whatever the path
    held now (trial 0 on 40 rows of 8 tokens, the next ones on 30 rows of 12)."""
    data = _npz(tmp_path / "d.npz", rows=40, seq_len=8, seed=0)
    prepare(_config(tmp_path, tiny_space, task=str(data)))
    recorded = hashlib.sha256(data.read_bytes()).hexdigest()
    before = _journal(tmp_path)
    _npz(data, rows=30, seq_len=12, seed=1)
    now = hashlib.sha256(data.read_bytes()).hexdigest()
    if how == "resume":
        config = _config(tmp_path, tiny_space, task=str(data), trials=2)
    else:
        config = worker_config("t", str(tmp_path / "s.journal"), device="cpu", trials=2)
    with pytest.raises(SearchError) as refused:
        prepare(config)
    message = str(refused.value)
    assert "\n" not in message and str(data) in message, message
    assert recorded[:12] in message and now[:12] in message, message
    assert _journal(tmp_path) == before


def test_a_worker_elsewhere_reads_the_data_file_the_study_was_created_with(tmp_path, tiny_space, monkeypatch):
    """``--task data/d.npz`` is resolved where the study is created: a worker started in another
    folder, which holds a data/d.npz of its own, trains on the first one."""
    first, other = tmp_path / "a", tmp_path / "b"
    data = _npz(first / "data" / "d.npz", rows=40, seq_len=8, seed=0)
    _npz(other / "data" / "d.npz", rows=30, seq_len=12, seed=1)
    monkeypatch.chdir(first)
    ctx, _ = prepare(_config(tmp_path, tiny_space, task="data/d.npz"))
    rows = ctx.task.x_train.clone()
    monkeypatch.chdir(other)
    ctx, _ = prepare(worker_config("t", str(tmp_path / "s.journal"), device="cpu"))
    assert ctx.task.config["path"] == str(data.resolve())
    assert ctx.task.x_train.shape == rows.shape and bool((ctx.task.x_train == rows).all())
