"""MQAR invariants (Zoology): what each row must look like, not just its shape."""

import re
import sys
from itertools import pairwise

import numpy as np
import pytest
import torch

from nas.tasks import IGNORE_INDEX, TaskError, load_task, mqar, mqar_long
from nas.tasks.mqar import _draw, _generate

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
        assert x.dtype == y.dtype == torch.int32 and x.shape == y.shape
        check_rows(x.numpy(), y.numpy(), params["vocab_size"], params["num_kv_pairs"])


def test_perfect_logits_score_every_query():
    """The targets line up with Task.correct/loss: one-hot logits of y are right everywhere scored."""
    task = mqar(vocab_size=32, seq_len=32, num_kv_pairs=4, n_train=8, n_test=8)
    _, y = task.batch(slice(None), split="test")
    logits = torch.nn.functional.one_hot(y.clamp(min=0), 32).float() * 50
    hits, scored = task.correct(logits, y)
    assert int(hits) == int(scored) == 8 * 4
    assert float(task.loss(logits, y)) < 1e-6


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


# ---------------------------------------------------------------- long context (mqar_long)

LONG = [
    pytest.param(dict(seq_len=4096, num_kv_pairs=256), id="T4096-kv256"),
    pytest.param(dict(seq_len=2047, num_kv_pairs=511, vocab_size=1030), id="T2047-kv511-odd-tight"),
    pytest.param(dict(), id="defaults-T2048-kv128"),
]


def _queries(task) -> tuple[np.ndarray, np.ndarray]:
    """(query positions, their key's position in the kv block), both [N, D], of the training rows."""
    x, y = task.x_train.numpy(), task.y_train.numpy()
    d = task.config["num_kv_pairs"]
    pos = np.nonzero(y != IGNORE_INDEX)[1].reshape(len(x), d)
    queried = x[np.arange(len(x))[:, None], pos]  # [N, D]
    key_pos = 2 * np.argmax(queried[:, :, None] == x[:, None, 0 : 2 * d : 2], axis=2)
    return pos, key_pos


@pytest.mark.parametrize("params", LONG)
def test_long_rows_satisfy_zoology_invariants(params):
    task = mqar_long(seed=2, n_train=5, n_test=3, **params)
    cfg = task.config
    assert task.name == cfg["name"] == "mqar_long" and task.seq_len == cfg["seq_len"]
    assert (cfg["vocab_size"], cfg["seq_len"], cfg["num_kv_pairs"]) == (
        params.get("vocab_size", 8192),
        params.get("seq_len", 2048),
        params.get("num_kv_pairs", 128),
    )
    for x, y in ((task.x_train, task.y_train), (task.x_test, task.y_test)):
        check_rows(x.numpy(), y.numpy(), cfg["vocab_size"], cfg["num_kv_pairs"])


def test_long_is_mqar_with_long_defaults_and_deterministic():
    small = dict(seq_len=1024, num_kv_pairs=64, n_train=4, n_test=2)
    a, b, c = mqar_long(seed=4, **small), mqar_long(seed=4, **small), mqar_long(seed=5, **small)
    same = mqar(seed=4, vocab_size=8192, **small)  # one generator: only the name and defaults differ
    for k in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, k), getattr(b, k)) and torch.equal(getattr(a, k), getattr(same, k))
        assert not torch.equal(getattr(a, k), getattr(c, k))
    assert load_task("mqar_long:seq_len=1024,num_kv_pairs=64,n_train=4,n_test=2", seed=4).config == a.config


def test_queries_spread_over_the_whole_context():
    """Zoology's gap law favours short gaps, yet at T=2048 every eighth of the query region holds queries."""
    task = mqar_long(n_train=20, n_test=1)
    pos, _ = _queries(task)
    d, t = task.config["num_kv_pairs"], task.seq_len
    eighths = np.bincount(((pos - 2 * d) * 8 // (t - 2 * d)).ravel(), minlength=8)
    assert len(eighths) == 8 and (eighths > 0).all(), eighths
    assert pos.max() >= t - t // 16, "queries reach the end of the context"


def test_recall_distance_grows_with_context():
    """The difficulty grows with context: the mean key→query distance rises with seq_len at fixed pairs."""
    means = []
    for t in (512, 1024, 2048, 4096, 8192):
        pos, key_pos = _queries(mqar_long(seq_len=t, num_kv_pairs=64, n_train=16, n_test=1))
        means.append(float((pos - key_pos).mean()))
    assert all(b > 1.3 * a for a, b in pairwise(means)), means
    assert means[-1] > 5 * means[0], means


def test_chunks_draw_what_one_pass_draws(monkeypatch):
    """Rows are built chunk by chunk; the chunk size changes neither rows nor the random stream."""
    whole = _generate(np.random.default_rng(7), 37, 300, 257, 40, 0.01)
    for chunk in (1000, 100):  # several rows per chunk; fewer cells than one row (one row per chunk)
        monkeypatch.setattr(sys.modules[_generate.__module__], "_CHUNK", chunk)  # the name mqar is the function
        parts = _generate(np.random.default_rng(7), 37, 300, 257, 40, 0.01)
        assert all(np.array_equal(a, b) for a, b in zip(whole, parts, strict=True)), chunk


def test_long_storage_is_int32_and_batches_gather_rows_only():
    """Generation cost is bounded by its outputs: x and y are int32 [N, T] (4 bytes a cell) and own
    their memory; a training batch gathers and widens B rows, not the set."""
    n, t = 6, 8192
    x, y = _generate(np.random.default_rng(0), n, 8192, t, 512, 0.01)
    assert x.dtype == y.dtype == np.int32 and x.shape == y.shape == (n, t) and x.nbytes == 4 * n * t
    task = mqar_long(seq_len=t, num_kv_pairs=512, n_train=n, n_test=2)
    for a in (task.x_train, task.y_train, task.x_test, task.y_test):
        assert a.dtype == torch.int32 and a.is_contiguous() and a.untyped_storage().nbytes() == 4 * a.numel()
    xb, yb = task.batch(torch.tensor([4, 1, 4]))
    assert xb.dtype == yb.dtype == torch.int64 and xb.shape == yb.shape == (3, t)
    assert torch.equal(xb, task.x_train[[4, 1, 4]].long()) and torch.equal(yb, task.y_train[[4, 1, 4]].long())
    xt, _ = task.batch(slice(1, 2), split="test")
    assert xt.shape == (1, t) and torch.equal(xt[0], task.x_test[1].long())


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("mqar_long:num_kv_pairs=5000", "mqar_long: vocab_size=8192 has too few keys for num_kv_pairs=5000"),
        ("mqar_long:seq_len=500", "mqar_long: seq_len=500 is too short for 128 pairs"),
        (
            "mqar_long:vocab_size=4294967296,num_kv_pairs=2,seq_len=8",
            "mqar_long: vocab_size=4294967296 is above the maximum of 1,048,576",
        ),
        ("mqar_long:power_a=2", "mqar_long: power_a must be in (0, 1]"),
        ("mqar_long:n_test=0", "mqar_long: n_train and n_test must be >= 1"),
    ],
    ids=["kv-vocab", "seq_len", "vocab-max", "power_a", "n_test"],
)
def test_long_bad_parameters_are_one_line(spec, needle):
    with pytest.raises(TaskError) as err:
        load_task(spec)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("task_fn", [mqar, mqar_long])
def test_zero_filler_keeps_the_rows_and_clears_everything_else(task_fn):
    """random_non_queries=False (Zoology's option): the same keys, values, queries and targets as
    the random-filler rows of the same seed, with token 0 wherever those had filler."""
    params = dict(vocab_size=37, seq_len=45, num_kv_pairs=5, n_train=40, n_test=9)
    noisy, clean = task_fn(seed=3, **params), task_fn(seed=3, random_non_queries=False, **params)
    for split in ("train", "test"):
        xn, xc = getattr(noisy, f"x_{split}").numpy(), getattr(clean, f"x_{split}").numpy()
        yn, yc = getattr(noisy, f"y_{split}").numpy(), getattr(clean, f"y_{split}").numpy()
        check_rows(xc, yc, 37, 5)
        assert (yn == yc).all()
        kept = xc != 0  # kv block and queries
        assert kept[:, :10].all() and (xn[kept] == xc[kept]).all()
        assert (xn[~kept] != 0).all() and (~kept).any(), "the random rows had filler in every cleared cell"
    assert clean.config["random_non_queries"] is False and "random_non_queries" not in noisy.config
    assert "zero filler" in clean.description
    spec = f"{task_fn.__name__}:vocab_size=37,seq_len=45,num_kv_pairs=5,n_train=40,n_test=9,random_non_queries=false"
    assert load_task(spec, seed=3).config == clean.config


@pytest.mark.parametrize("random_non_queries", [True, False])
def test_short_frac_mixes_shorter_whole_instances_into_training_only(random_non_queries):
    """short_frac: that share of training rows holds a whole MQAR instance of T/2, T/4, T/8, T/16
    (pairs scaled alike) at its start, unscored filler after it; the other training rows and every
    test row are full-length instances; the config and task string round-trip."""
    params = dict(vocab_size=64, seq_len=130, num_kv_pairs=8, n_train=50, n_test=7)
    mixed = mqar_long(seed=2, short_frac=0.4, random_non_queries=random_non_queries, **params)
    plain = mqar_long(seed=2, random_non_queries=random_non_queries, **params)
    x, y = mixed.x_train.long().numpy(), mixed.y_train.long().numpy()
    n_short = 20
    for j, div in enumerate((2, 4, 8, 16)):
        rows = np.arange(j, n_short, 4)
        length, kv = 130 // div, max(1, 8 // div)
        if length < 4 * kv:  # 130 // 16 = 8 < 4 · 1 is fine; a too-short slot is drawn full length
            check_rows(x[rows], y[rows], 64, 8)
            continue
        check_rows(x[rows, :length], y[rows, :length], 64, kv)
        assert (y[rows, length:] == IGNORE_INDEX).all(), "nothing after the short instance is scored"
        tail = x[rows, length:]
        assert (tail != 0).all() if random_non_queries else (tail == 0).all()
    check_rows(x[n_short:], y[n_short:], 64, 8)
    assert (mixed.x_test == plain.x_test).all() and (mixed.y_test == plain.y_test).all()
    assert mixed.config["short_frac"] == 0.4 and "short_frac" not in plain.config
    assert "40% of training rows shorter" in mixed.description
    spec = "mqar_long:vocab_size=64,seq_len=130,num_kv_pairs=8,n_train=50,n_test=7,short_frac=0.4"
    spec += "" if random_non_queries else ",random_non_queries=false"
    again = load_task(spec, seed=2)
    assert again.config == mixed.config and (again.x_train == mixed.x_train).all()


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5])
def test_short_frac_outside_zero_one_is_refused(bad):
    with pytest.raises(TaskError, match="short_frac must be in"):
        mqar(short_frac=bad, n_train=8, n_test=2)


def test_curriculum_rows_are_whole_short_instances_and_the_config_round_trips():
    """curriculum_len/frac: n_train extra rows of a shorter MQAR (pairs capped at len/4), drawn
    after the training rows (which stay as without it); config and task string round-trip."""
    params = dict(vocab_size=64, seq_len=96, num_kv_pairs=12, n_train=30, n_test=5)
    task = mqar_long(seed=4, curriculum_len=32, curriculum_frac=0.6, **params)
    plain = mqar_long(seed=4, **params)
    x1, y1 = task.x_stage1.long().numpy(), task.y_stage1.long().numpy()
    assert x1.shape == (30, 32) and task.stage1_frac == 0.6
    check_rows(x1, y1, 64, 8)  # 12 pairs capped at 32 // 4
    assert torch.equal(task.x_train, plain.x_train) and torch.equal(task.y_test, plain.y_test)
    assert task.config["curriculum_len"] == 32 and "curriculum_len" not in plain.config
    assert "first 60% of steps at T=32 kv=8" in task.description
    spec = (
        "mqar_long:vocab_size=64,seq_len=96,num_kv_pairs=12,n_train=30,n_test=5,curriculum_len=32,curriculum_frac=0.6"
    )
    again = load_task(spec, seed=4)
    assert again.config == task.config and torch.equal(again.x_stage1, task.x_stage1)
    moved = task.to("cpu")
    assert torch.equal(moved.x_stage1, task.x_stage1) and moved.stage1_frac == 0.6


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        (dict(curriculum_len=16), "go together"),
        (dict(curriculum_frac=0.5), "go together"),
        (dict(curriculum_len=64, curriculum_frac=0.5), "curriculum_len must be in [4, seq_len=64)"),
        (dict(curriculum_len=3, curriculum_frac=0.5), "curriculum_len must be in"),
        (dict(curriculum_len=16, curriculum_frac=1.0), "curriculum_frac must be in (0, 1)"),
    ],
)
def test_bad_curriculum_is_refused(params, needle):
    with pytest.raises(TaskError, match=re.escape(needle)):
        mqar(n_train=8, n_test=2, **params)
