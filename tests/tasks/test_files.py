"""User files: .npz round trips, the class-label variant, text as a char LM, and one clear error each."""

import io
import zipfile

import numpy as np
import pytest
import torch

from nas.tasks import (
    IGNORE_INDEX,
    MAX_SEQ_LEN,
    MAX_TASK_TOKENS,
    MAX_VOCAB,
    TaskError,
    load_npz,
    load_task,
    load_text,
    task_from_config,
)


def save(path, **arrays):
    with open(path, "wb") as f:  # np.savez would append .npz to names without it
        np.savez(f, **arrays)
    return str(path)


def token_arrays(n=50, t=9):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 13, size=(n, t)).astype(np.int32)
    y = np.where(rng.random((n, t)) < 0.3, rng.integers(0, 5, size=(n, t)), IGNORE_INDEX).astype(np.int16)
    y[:, -1] = 4  # every row scored somewhere
    return x, y


def rows_of(*tensors):
    return sorted(tuple(r) for r in torch.cat(tensors).tolist())


def test_token_targets_round_trip(tmp_path):
    x, y = token_arrays()
    task = load_npz(path=save(tmp_path / "d.npz", x=x, y=y), seed=3)
    assert (task.name, task.readout, task.vocab_size, task.n_out) == ("npz", "token", x.max() + 1, 5)
    assert task.x_train.dtype == task.y_train.dtype == torch.int32
    assert (len(task.x_train), len(task.x_test)) == (45, 5)  # 10% test
    # the split is a permutation of the rows: every (x, y) row lands in exactly one split, intact
    pairs = np.concatenate([x, y], axis=1).tolist()
    got = rows_of(torch.cat([task.x_train, task.y_train], 1), torch.cat([task.x_test, task.y_test], 1))
    assert got == sorted(tuple(r) for r in pairs)


def test_training_rows_with_no_scored_target_are_left_out(tmp_path):
    """Only a tenth of the rows are scored (a legal file): the others would teach nothing, and a
    batch of them alone has no loss to average (it read as NaN, so every trial "diverged"). They
    are left out of training, and the description says how many; the test split keeps its rows."""
    x, y = token_arrays(n=400)
    scored = np.zeros(400, bool)
    scored[np.random.default_rng(1).choice(400, 40, replace=False)] = True
    y[~scored] = IGNORE_INDEX
    task = load_npz(path=save(tmp_path / "sparse.npz", x=x, y=y), seed=3)
    assert len(task.x_train) == len(task.y_train) and bool((task.y_train != IGNORE_INDEX).any(1).all())
    assert len(task.x_test) == 40  # 10 % of all rows, scored or not
    train_scored = 40 - int((task.y_test != IGNORE_INDEX).any(1).sum())
    assert len(task.x_train) == train_scored
    assert f"({360 - train_scored:,} training rows with no scored target left out)" in task.description
    dense_x, dense_y = token_arrays(n=400)
    full = load_npz(path=save(tmp_path / "dense.npz", x=dense_x, y=dense_y))
    assert "left out" not in full.description and len(full.x_train) == 360


def test_a_search_on_sparsely_scored_rows_trains(tmp_path):
    """The auditor's file end to end (batch 8, a tenth of the rows scored): trials complete,
    none "diverged"."""
    from nas.search.record import records
    from nas.search.study import SearchConfig, run_search
    from tests.conftest import write_space

    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 10, (400, 8)), np.full((400, 8), IGNORE_INDEX)
    rows = rng.choice(400, 40, replace=False)
    y[rows] = rng.integers(0, 10, (40, 8))
    data = save(tmp_path / "rows10pct.npz", x=x, y=y)
    config = SearchConfig(
        space=str(write_space(tmp_path)), task=data, trials=2, storage=str(tmp_path / "s.journal"), baselines=False
    )
    trained = records(run_search(config))
    assert len(trained) == 2 and all(r.trained and r.failure is None for r in trained)


def test_a_batch_with_no_scored_position_has_loss_zero_and_no_gradient():
    """Task.loss is torch's mean cross-entropy bit for bit when a position is scored, and 0 with a
    zero gradient (not 0/0 = NaN) when none is."""
    import torch.nn.functional as F

    from nas.tasks.base import Task

    torch.manual_seed(0)
    logits = torch.randn(6, 7, 11, requires_grad=True)
    y = torch.randint(0, 11, (6, 7))
    y[torch.rand(6, 7) < 0.6] = IGNORE_INDEX
    (ours,) = torch.autograd.grad(Task.loss(None, logits, y), logits)
    (theirs,) = torch.autograd.grad(F.cross_entropy(logits.reshape(-1, 11), y.reshape(-1)), logits)
    assert torch.equal(Task.loss(None, logits, y), F.cross_entropy(logits.reshape(-1, 11), y.reshape(-1)))
    assert torch.equal(ours, theirs)
    none = torch.full((6, 7), IGNORE_INDEX)
    loss = Task.loss(None, logits, none)
    (grad,) = torch.autograd.grad(loss, logits)
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))


def test_class_labels(tmp_path):
    x, _ = token_arrays(n=12)
    labels = np.arange(12) % 3
    task = load_npz(path=save(tmp_path / "c.npz", x=x, y=labels))
    assert (task.readout, task.n_out) == ("last", 3)
    assert task.y_train.shape == (len(task.x_train),) and len(task.x_test) == 1  # round(1.2) = 1
    lookup = {tuple(r): int(lab) for r, lab in zip(x.tolist(), labels, strict=True)}
    for xs, ys in ((task.x_train, task.y_train), (task.x_test, task.y_test)):
        assert all(lookup[tuple(r)] == int(lab) for r, lab in zip(xs.tolist(), ys, strict=True))


def test_split_by_seed_and_rebuild_from_config(tmp_path):
    x, y = token_arrays()
    path = save(tmp_path / "d.npz", x=x, y=y)
    a, b, c = load_npz(path=path, seed=1), load_npz(path=path, seed=1), load_npz(path=path, seed=2)
    assert torch.equal(a.x_test, b.x_test) and not torch.equal(a.x_test, c.x_test)
    again = task_from_config(dict(a.config))
    assert all(torch.equal(getattr(a, k), getattr(again, k)) for k in ("x_train", "y_train", "x_test", "y_test"))
    assert load_npz(path=path, n_out=9).n_out == 9
    save(tmp_path / "d.npz", x=x, y=np.where(y == 4, 3, y))  # same name, other bytes
    with pytest.raises(TaskError, match="contents changed"):
        task_from_config(a.config)


def test_text_is_a_char_lm(tmp_path):
    text = "the quick brown fox jumps over the lazy dog; ünïcode too. " * 3
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    task = load_text(path=str(path), seq_len=10, test_frac=0.2)
    chars = sorted(set(text))
    assert (task.vocab_size, task.n_out, task.readout, task.seq_len) == (len(chars), len(chars), "token", 10)
    windows = (len(text) - 1) // 10
    assert len(task.x_train) + len(task.x_test) == windows and len(task.x_test) == round(windows * 0.2)
    assert torch.equal(task.y_train[:, :-1], task.x_train[:, 1:])
    decoded = {
        "".join(chars[i] for i in row) + chars[int(last)]
        for row, last in zip(
            torch.cat([task.x_train, task.x_test]).tolist(), torch.cat([task.y_train, task.y_test])[:, -1], strict=True
        )
    }
    assert decoded == {text[i * 10 : i * 10 + 11] for i in range(windows)}
    assert torch.equal(task_from_config(task.config).x_test, task.x_test)


def _shadowed(p, x, y, raw: bytes) -> None:
    """A valid x.npy and y.npy, and beside them a member named plain ``x`` holding ``raw``: numpy's
    NpzFile reads that one for ``archive['x']`` (the header checks read x.npy)."""
    save(p, x=x, y=y)
    with zipfile.ZipFile(p, "a") as z:
        z.writestr("x", raw)


def _npy_bytes(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _bad_npz(tmp_path, case):
    x, y = token_arrays(n=6, t=4)
    x20, y20 = token_arrays(n=20, t=4)  # enough rows: only the targets are wrong
    p = tmp_path / f"{case}.npz"
    writers = {
        "missing-file": lambda: None,
        "not-an-npz": lambda: p.write_text("hello, not an archive"),
        "empty-file": lambda: p.write_bytes(b""),
        "npy-inside": lambda: np.save(open(p, "wb"), x),
        "truncated": lambda: (save(p, x=x, y=y), p.write_bytes(p.read_bytes()[:60])),
        "missing-x": lambda: save(p, y=y),
        "missing-y": lambda: save(p, x=x, z=y),
        "x-1d": lambda: save(p, x=x[0], y=y[0]),
        "x-3d": lambda: save(p, x=x[:, :, None], y=y),
        "y-3d": lambda: save(p, x=x, y=y[:, :, None]),
        "y-shape": lambda: save(p, x=x, y=y[:, :3]),
        "n-mismatch": lambda: save(p, x=x, y=y[:5]),
        "x-float": lambda: save(p, x=x.astype(np.float32), y=y),
        "y-float": lambda: save(p, x=x, y=y.astype(np.float64)),
        "x-bool": lambda: save(p, x=x > 3, y=y),
        "x-object": lambda: save(p, x=np.array([[1, "a"]] * 6, dtype=object), y=y),
        "negative-token": lambda: save(p, x=x - 20, y=y),
        "target-minus-5": lambda: save(p, x=x, y=np.where(y == 4, -5, y)),
        "target-below-ignore": lambda: save(p, x=x, y=np.where(y == 4, -101, y)),
        "label-ignore": lambda: save(p, x=x, y=np.array([0, 1, -100, 1, 0, 1])),
        "nothing-scored": lambda: save(p, x=x, y=np.full_like(y, IGNORE_INDEX)),
        "one-row": lambda: save(p, x=x[:1], y=y[:1]),
        "no-tokens": lambda: save(p, x=x[:, :0], y=y[:, :0]),
        "one-class": lambda: save(p, x=x20, y=np.full(20, 2)),
        "one-target-token": lambda: save(p, x=x20, y=np.where(y20 == IGNORE_INDEX, y20, 3)),
        # below int32's range: converted without the check, -2^40 wrapped to 0, a valid token
        "x-int64-far-negative": lambda: save(p, x=np.where(x20 == 0, -(2**40), x20.astype(np.int64)), y=y20),
        "y-int64-far-negative": lambda: save(p, x=x20, y=np.where(y20 == 4, -(2**40), y20.astype(np.int64))),
        "x-member-raw-bytes": lambda: _shadowed(p, x20, y20, b"not an array"),
        "x-member-float": lambda: _shadowed(p, x20, y20, _npy_bytes(np.random.default_rng(0).random((7, 3)) * 5)),
    }
    writers[case]()
    return str(p)


BAD = [
    "missing-file",
    "not-an-npz",
    "empty-file",
    "npy-inside",
    "truncated",
    "missing-x",
    "missing-y",
    "x-1d",
    "x-3d",
    "y-3d",
    "y-shape",
    "n-mismatch",
    "x-float",
    "y-float",
    "x-bool",
    "x-object",
    "negative-token",
    "target-minus-5",
    "target-below-ignore",
    "label-ignore",
    "nothing-scored",
    "one-row",
    "no-tokens",
    "one-class",
    "one-target-token",
    "x-member-raw-bytes",
    "x-member-float",
    "x-int64-far-negative",
    "y-int64-far-negative",
]


@pytest.mark.parametrize("case", ["one-class", "one-target-token"])
def test_a_single_class_is_refused_as_unrankable(tmp_path, case):
    with pytest.raises(TaskError, match="every scored target in 'y' is"):
        load_npz(path=_bad_npz(tmp_path, case))


@pytest.mark.parametrize("case", BAD)
def test_every_bad_npz_is_one_clear_task_error(tmp_path, case):
    path = _bad_npz(tmp_path, case)
    with pytest.raises(TaskError) as err:
        load_npz(path=path)
    message = str(err.value)
    assert message.startswith(path + ": ") and "\n" not in message, message
    assert len(message) < 200


@pytest.mark.parametrize(
    "params, needle",
    [
        (dict(n_out=3), "n_out=3 is below"),
        (dict(test_frac=0.0), "test_frac"),
        (dict(test_frac=1.0), "test_frac"),
        (dict(seed=-2), "seed"),
    ],
    ids=["n_out-small", "test_frac-0", "test_frac-1", "seed"],
)
def test_bad_npz_parameters(tmp_path, params, needle):
    x, y = token_arrays()
    with pytest.raises(TaskError, match=needle):
        load_npz(path=save(tmp_path / "d.npz", x=x, y=y), **params)


@pytest.mark.parametrize(
    "content, params, needle",
    [
        (b"\xff\xfe bad bytes", dict(seq_len=2), "not UTF-8"),
        (b"short", dict(seq_len=4), "5 characters"),
        (b"long enough text", dict(seq_len=0), "seq_len"),
        # every model scored 1.000 on it (a one-class .npz is refused)
        (b"a" * 3000, dict(seq_len=8), "every target .* is 'a'; accuracy could not rank models"),
        (b"b" + b"a" * 3000, dict(seq_len=16), "every target .* is 'a'"),  # 'b' is never a target
    ],
    ids=["not-utf8", "too-short", "seq_len-0", "one-character", "one-target-character"],
)
def test_bad_text_files(tmp_path, content, params, needle):
    path = tmp_path / "t.txt"
    path.write_bytes(content)
    with pytest.raises(TaskError, match=needle) as err:
        load_text(path=str(path), **params)
    assert str(err.value).startswith(str(path))


def test_too_little_data_is_refused_with_the_minimum(tmp_path):
    x, y = token_arrays(n=9)
    with pytest.raises(TaskError, match=r"9 row\(s\); need at least 10"):
        load_npz(path=save(tmp_path / "nine.npz", x=x, y=y))
    assert len(load_npz(path=save(tmp_path / "ten.npz", x=x[:1].repeat(10, 0), y=y[:1].repeat(10, 0))).x_test) == 1
    path = tmp_path / "t.txt"
    path.write_text("x" * 40)
    with pytest.raises(TaskError, match="40 characters; seq_len=4 needs at least 41 \\(10 windows\\)"):
        load_text(path=str(path), seq_len=4)


def _header_only(path, **shapes):
    """An .npz whose members are only .npy headers declaring ``shapes`` (int64, no data): what a
    compressed file of that shape looks like before its data is read."""
    with zipfile.ZipFile(path, "w") as archive:
        for key, shape in shapes.items():
            header = io.BytesIO()
            np.lib.format.write_array_header_1_0(
                header, {"descr": "<i8", "fortran_order": False, "shape": tuple(shape)}
            )
            archive.writestr(f"{key}.npy", header.getvalue())
    return str(path)


def _raw_member(path):
    """An .npz whose 'x' member is raw bytes, not a .npy array (np.load hands back bytes)."""
    x, y = token_arrays(n=12)
    save(path, x=x, y=y)
    data = io.BytesIO()
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(data, "w") as dst:
        for name in src.namelist():
            dst.writestr(name, b"not an array at all" if name == "x.npy" else src.read(name))
    path.write_bytes(data.getvalue())
    return str(path)


def _one_value(path, key, value, *, labels=False):
    """Valid token data with one entry of ``key`` set to ``value``."""
    x, y = token_arrays(n=12)
    x, y = x.astype(np.int64), (np.arange(12) % 3 if labels else y).astype(np.int64)
    (x if key == "x" else y)[3, ...] = value
    return save(path, x=x, y=y)


# (id, writer(path) -> str path, what the one line must say besides the file)
LIMITS = [
    (
        "no-rows",
        lambda p: save(p, x=np.zeros((0, 16), np.int64), y=np.zeros((0, 16), np.int64)),
        "'x' and 'y' are empty",
    ),
    ("no-rows-labels", lambda p: save(p, x=np.zeros((0, 16), np.int64), y=np.zeros(0, np.int64)), "are empty"),
    ("token-2^31-1", lambda p: _one_value(p, "x", 2**31 - 1), "array 'x' has token 2147483647"),
    ("token-at-max-vocab", lambda p: _one_value(p, "x", MAX_VOCAB), f"array 'x' has token {MAX_VOCAB}"),
    ("target-1e9", lambda p: _one_value(p, "y", 10**9), "array 'y' has target 1000000000"),
    ("label-1e9", lambda p: _one_value(p, "y", 10**9, labels=True), "array 'y' has target 1000000000"),
    (
        "uint64-above-int64",
        lambda p: save(p, x=np.full((12, 4), 2**63 + 5, np.uint64), y=np.zeros(12, np.int64)),
        "array 'x' has token 9223372036854775813",
    ),
    ("long-rows", lambda p: _header_only(p, x=(10, 5_000_000), y=(10,)), "5,000,000 tokens per row"),
    ("one-past-max-seq", lambda p: _header_only(p, x=(10, MAX_SEQ_LEN + 1), y=(10,)), "tokens per row"),
    (
        "too-many-tokens",
        lambda p: _header_only(p, x=(MAX_TASK_TOKENS // 1024 + 1, 1024), y=(MAX_TASK_TOKENS // 1024 + 1,)),
        f"at most {MAX_TASK_TOKENS:,}",
    ),
    ("raw-member", _raw_member, "array 'x' is not a .npy array"),
]


@pytest.mark.parametrize("writer, needle", [c[1:] for c in LIMITS], ids=[c[0] for c in LIMITS])
def test_empty_and_oversized_npz_are_one_line_naming_the_array(tmp_path, writer, needle):
    """Empty arrays, ids that would size the embedding or the output layer past MAX_VOCAB, rows
    past MAX_SEQ_LEN and files past MAX_TASK_TOKENS: one TaskError naming the file and the culprit,
    shapes refused from the .npy header before any data is read."""
    path = writer(tmp_path / "d.npz")
    with pytest.raises(TaskError) as err:
        load_npz(path=path)
    message = str(err.value)
    assert message.startswith(path + ": ") and "\n" not in message, message
    assert needle in message, message


def test_limits_are_inclusive(tmp_path):
    """The largest token and target a file may hold load (vocab and outputs exactly MAX_VOCAB)."""
    x, y = token_arrays(n=12)
    x, y = x.astype(np.int64), y.astype(np.int64)
    x[0, 0] = y[0, 0] = MAX_VOCAB - 1
    task = load_npz(path=save(tmp_path / "d.npz", x=x, y=y))
    assert task.vocab_size == task.n_out == MAX_VOCAB


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("{path}:n_out=1048577", "n_out=1048577 is above the maximum of 1,048,576"),
        ("{text}:seq_len=65537", "seq_len must be in [1, 65,536], got 65537"),
        ("mqar:vocab_size=1048577,n_train=2,n_test=2", "mqar: vocab_size=1048577 is above the maximum of 1,048,576"),
        ("mqar:seq_len=65537,n_train=1,n_test=1", "mqar: seq_len=65537 is above the maximum of 65,536"),
        (
            "mqar_long:vocab_size=1048577,num_kv_pairs=2,seq_len=8,n_train=2,n_test=2",
            "mqar_long: vocab_size=1048577 is above",
        ),
        ("mad_recall:vocab_size=1048577,seq_len=32,n_train=2,n_test=2", "mad_recall: vocab_size=1048577 is above"),
        ("mad_noisy_recall:seq_len=65538,n_train=1,n_test=1", "mad_noisy_recall: seq_len=65538 is above"),
        ("mad_selective_copy:vocab_size=1048577,n_train=2,n_test=2", "mad_selective_copy: vocab_size=1048577 is above"),
    ],
    ids=[
        "npz-n_out",
        "text-seq_len",
        "mqar-vocab",
        "mqar-seq",
        "mqar_long-vocab",
        "mad-vocab",
        "mad-noisy-seq",
        "mad-copy-vocab",
    ],
)
def test_task_sizes_are_bounded_before_anything_is_built(tmp_path, spec, needle):
    """Each spec is just past one limit, and cheap to build were the limit not there."""
    x, y = token_arrays(n=12)
    path = save(tmp_path / "d.npz", x=x, y=y)
    text = tmp_path / "t.txt"
    text.write_text("abc" * 100)
    with pytest.raises(TaskError) as err:
        load_task(spec.format(path=path, text=text))
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "spec",
    ["mqar:vocab_size=32,seq_len=32,num_kv_pairs=4,n_train=40,n_test=12", "mad_recall:seq_len=32,n_train=40,n_test=12"],
)
def test_generated_tokens_are_bounded(monkeypatch, spec):
    """n_train + n_test rows of seq_len tokens within MAX_TASK_TOKENS (lowered here to 1000, so
    the test builds nothing large either way)."""
    monkeypatch.setattr("nas.tasks._build.MAX_TASK_TOKENS", 1000)
    with pytest.raises(TaskError, match=r"52 rows of 32 tokens \(n_train \+ n_test\) are above the maximum of 1,000"):
        load_task(spec)


def test_text_vocabulary_is_bounded(tmp_path):
    """A text file's vocabulary is its distinct characters: more than MAX_VOCAB of them is refused."""
    chars = "".join(chr(c) for c in range(0x20, 0x110000) if not 0xD800 <= c <= 0xDFFF)
    assert len(chars) > MAX_VOCAB
    path = tmp_path / "all.txt"
    path.write_text(chars, encoding="utf-8")
    with pytest.raises(TaskError, match=r"all.txt: 1,112,032 distinct characters; the vocabulary may be at most"):
        load_text(path=str(path), seq_len=16)
