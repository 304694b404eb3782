"""Shared fixtures: a tiny search space written to disk and helpers to read a study back."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import optuna
import pytest
import torch

# Every process a test starts (CLI runs, workers, exports) inherits one OpenMP thread: on a shared
# 2-core runner their torch and BLAS pools otherwise spin against the other xdist worker's.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _no_pending_interrupt():
    """A test that simulates Ctrl-C leaves no request behind for the next one."""
    from nas.search import interrupt

    interrupt.reset()
    yield
    interrupt.reset()


def pytest_configure(config: pytest.Config) -> None:
    """Before any test module (and so any kernel module) is imported: without CUDA every
    @triton.jit kernel runs under Triton's interpreter on CPU tensors (tests/kernels compare them
    with their fp32 references)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


# max_train_seconds is a guard that must not fire in tests of steps (a loaded 2-core runner took
# over 10 s for 16 steps): tests that want it to fire set it to 1e-9.
TINY_SPACE = """\
name: ci_tiny
description: test space
task: mqar:vocab_size=16,seq_len=16,num_kv_pairs=2,n_train=128,n_test=32
max_train_seconds: 600
depth: {low: 1, high: 2}
d_model: [16]
layer:
  mixer: [attention, linear_attention, none]
  heads: [1, 2]
  feature_map: [identity, elu+1, relu]
  short_conv: [0, 4]
  mlp_ratio: [0, 2]
train:
  optimizer: [adamw, lion, radam, sgd]
  lr: {low: 1.0e-3, high: 1.0e-2, log: true}
  steps: [STEPS]
  batch_size: [8]
"""


def write_space(tmp_path: Path, steps: int = 5, extra: str = "") -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(TINY_SPACE.replace("STEPS", str(steps)) + extra)
    return path


@pytest.fixture
def tiny_space(tmp_path: Path) -> Path:
    return write_space(tmp_path)


def study_checksum(storage: str, name: str) -> str:
    """Digest of every trial's number, state, values, params and user attrs."""
    from nas.search.storage import open_storage

    study = optuna.load_study(study_name=name, storage=open_storage(storage))
    rows = [(t.number, t.state.name, t.values, t.params, t.user_attrs) for t in study.get_trials(deepcopy=False)]
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()


@pytest.fixture(autouse=True)
def one_intraop_thread():
    """One intra-op thread for these tiny tensors: extra threads only add synchronisation, and on
    a shared 2-core runner they spin against each other (measured 50x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def postgres_url() -> str:
    """The real PostgreSQL server CI starts (.ci/postgres.sh); never a mock."""
    url = os.environ.get("NAS_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("NAS_REQUIRE_POSTGRES"):
            pytest.fail("NAS_REQUIRE_POSTGRES is set but NAS_TEST_POSTGRES_URL is not")
        pytest.skip('no PostgreSQL server: run eval "$(.ci/postgres.sh)" (CI does)')
    return url


@pytest.fixture(params=["journal", "postgres"])
def storage_url(request, tmp_path, monkeypatch) -> str:
    """Each storage backend a multi-worker study runs on; artifacts go to the test's tmp dir."""
    monkeypatch.setenv("NAS_ARTIFACTS", str(tmp_path / "artifacts"))
    monkeypatch.setenv("NAS_HEARTBEAT_SECONDS", "1")
    if request.param == "journal":
        return str(tmp_path / "studies.journal")
    return request.getfixturevalue("postgres_url")


def unique_name(prefix: str) -> str:
    import uuid

    return f"{prefix}-{uuid.uuid4().hex[:8]}"
