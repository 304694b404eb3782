"""MQAR invariants (Zoology): what each row must look like, not just its shape."""

import numpy as np
import pytest
import torch

from nas.tasks import IGNORE_INDEX, TaskError, mqar
from nas.tasks.mqar import _draw

CASES = [
    pytest.param(dict(vocab_size=64, seq_len=48, num_kv_pairs=6), id="V64-T48-kv6"),
    pytest.param(dict(vocab_size=37, seq_len=33, num_kv_pairs=4), id="V37-T33-kv4-odd"),
    pytest.param(dict(vocab_size=20, seq_len=36, num_kv_pairs=9), id="V20-T36-kv9-all-keys"),
]


def check_rows(x: np.ndarray, y: np.ndarray, vocab_size: int, d: int) -> None:
    """Every MQAR invariant, vectorized over rows. x, y: [N, T] int64."""
    n, t = x.shape
    half = vocab_size // 2
    keys, values = x[:, 0 : 2 * d : 2], x[:, 1 : 2 * d : 2]  # [N, D]
    assert ((x >= 0) & (x < vocab_size)).all()
    assert ((keys >= 1) & (keys < half)).all(), "keys come from the lower half, token 0 excluded"
    assert ((values >= half) & (values < vocab_size)).all(), "values come from the upper half"
    assert (np.diff(np.sort(keys, axis=1), axis=1) > 0).all(), "keys are distinct within a row"
    assert (np.diff(np.sort(values, axis=1), axis=1) > 0).all(), "values are distinct within a row (Zoology)"

    scored = y != IGNORE_INDEX
    assert (scored.sum(axis=1) == d).all(), "exactly num_kv_pairs scored positions per row"
    assert not scored[:, : 2 * d].any(), "nothing in the kv block is scored"
    rows, pos = np.nonzero(scored)
    pos = pos.reshape(n, d)  # nonzero is row-major: D positions per row
    assert ((pos - 2 * d) % 2 == 0).all(), "queries sit on even offsets after the kv block"
    queried = x[np.arange(n)[:, None], pos]  # [N, D] key at each query
    assert (np.sort(queried, axis=1) == np.sort(keys, axis=1)).all(), "each key queried exactly once"
    # the target at a query is the value bound to that key in the kv block
    match = queried[:, :, None] == keys[:, None, :]  # [N, Dq, Dk]
    bound = (match * values[:, None, :]).sum(axis=2)
    assert (y[np.arange(n)[:, None], pos] == bound).all()


@pytest.mark.parametrize("params", CASES)
def test_rows_satisfy_zoology_invariants(params):
    task = mqar(seed=1, n_train=300, n_test=60, **params)
    assert (task.name, task.readout, task.vocab_size, task.n_out) == (
        "mqar",
        "token",
        params["vocab_size"],
        params["vocab_size"],
    )
    assert task.seq_len == params["seq_len"]
    for x, y in ((task.x_train, task.y_train), (task.x_test, task.y_test)):
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape
        check_rows(x.numpy(), y.numpy(), params["vocab_size"], params["num_kv_pairs"])


def test_perfect_logits_score_every_query():
    """The targets line up with Task.correct/loss: one-hot logits of y are right everywhere scored."""
    task = mqar(vocab_size=32, seq_len=32, num_kv_pairs=4, n_train=8, n_test=8)
    logits = torch.nn.functional.one_hot(task.y_test.clamp(min=0), 32).float() * 50
    hits, scored = task.correct(logits, task.y_test)
    assert int(hits) == int(scored) == 8 * 4
    assert float(task.loss(logits, task.y_test)) < 1e-6


def _slot_counts(power_a: float) -> np.ndarray:
    d, t = 4, 64
    task = mqar(seed=0, vocab_size=64, seq_len=t, num_kv_pairs=d, power_a=power_a, n_train=2000, n_test=1)
    _, pos = np.nonzero(task.y_train.numpy() != IGNORE_INDEX)
    return np.bincount((pos - 2 * d) // 2, minlength=(t - 2 * d) // 2)


def test_query_gaps_follow_power_law():
    counts = _slot_counts(0.01)  # p(gap g) ∝ g^-0.99: short gaps dominate
    quarter = len(counts) // 4
    assert counts[:quarter].sum() > 3 * counts[-quarter:].sum()
    assert counts[0] > counts[len(counts) // 2] > 0
    flat = _slot_counts(1.0)  # power_a = 1 is uniform: every slot about D/space of the time
    assert flat.max() < 1.5 * flat.min()


def test_vectorized_draw_matches_numpy_choice():
    """_draw (Gumbel-top-k) against the reference Zoology calls: rng.choice(replace=False, p=p) per
    row. Same law for the first draw, the second draw and how often each slot is drawn at all."""
    space, k, n = 12, 4, 6000
    p = 0.01 * np.arange(1, space + 1) ** (0.01 - 1)
    p /= p.sum()
    rng = np.random.default_rng(0)
    ref = np.stack([rng.choice(space, size=k, replace=False, p=p) for _ in range(n)])
    got = _draw(np.random.default_rng(1), n, space, k, np.log(p))
    assert ((got >= 0) & (got < space)).all() and (np.diff(np.sort(got, axis=1), axis=1) > 0).all()
    for ref_col, got_col in ((ref[:, 0], got[:, 0]), (ref[:, 1], got[:, 1]), (ref.ravel(), got.ravel())):
        ref_freq = np.bincount(ref_col, minlength=space) / len(ref_col)
        got_freq = np.bincount(got_col, minlength=space) / len(got_col)
        assert np.abs(ref_freq - got_freq).max() < 0.03, (ref_freq.round(3), got_freq.round(3))


def test_deterministic_by_seed_and_splits_independent():
    small = dict(vocab_size=32, seq_len=32, num_kv_pairs=4, n_test=20)
    a, b, c = mqar(seed=5, n_train=50, **small), mqar(seed=5, n_train=50, **small), mqar(seed=6, n_train=50, **small)
    for k in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, k), getattr(b, k))
        assert not torch.equal(getattr(a, k), getattr(c, k))
    assert not torch.equal(a.x_train[:20], a.x_test), "train and test are different streams"
    # the test split does not move when the training set grows
    assert torch.equal(mqar(seed=5, n_train=80, **small).x_test, a.x_test)


@pytest.mark.parametrize(
    "params, needle",
    [
        (dict(vocab_size=16, num_kv_pairs=8), "too few keys"),
        (dict(seq_len=31, num_kv_pairs=8), "too short"),
        (dict(num_kv_pairs=0), "num_kv_pairs"),
        (dict(power_a=0.0), "power_a"),
        (dict(power_a=1.5), "power_a"),
        (dict(n_train=0), "n_train"),
        (dict(seed=-1), "seed"),
    ],
    ids=["vocab", "seq_len", "kv0", "power0", "power>1", "n_train", "seed"],
)
def test_bad_parameters_raise_task_error(params, needle):
    with pytest.raises(TaskError, match=needle):
        mqar(**{"n_train": 4, "n_test": 4, **params})
