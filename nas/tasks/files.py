"""Tasks from user files: a ``.npz`` of token arrays, or a plain text file as a character LM.

``.npz`` holds ``x``: int tokens ``[N, T]`` (>= 0; vocab = max + 1) and ``y``: either int targets
``[N, T]`` (IGNORE_INDEX = -100 for unscored positions; readout "token") or int class labels
``[N]`` (readout "last"). It is read with ``allow_pickle=False``: nothing is ever unpickled. Each
array's dtype and shape are read from its ``.npy`` header before its data, so a file declaring an
absurd shape is refused without allocating it.

Limits (``nas.tasks.base``; each a one-line TaskError naming the file, the array and the value):
at most ``MAX_SEQ_LEN`` = 65,536 tokens per row (a text file's ``seq_len`` too) and
``MAX_TASK_TOKENS`` = 2^30 in all rows, and a vocabulary (max token + 1) and a number of outputs
(max target + 1, or ``n_out``) of at most ``MAX_VOCAB`` = 1,048,576 — the embedding table and
the output layer are sized from them, so one stray id of 2^31 - 1 would otherwise ask for
hundreds of gigabytes.

A text file is decoded as UTF-8; its distinct characters, sorted, are the vocabulary. It is cut
into non-overlapping windows of ``seq_len + 1`` characters: x the first ``seq_len``, y the next
character at every position.

Rows (windows) are split into train and test by a seeded permutation. ``config`` records the
file's SHA-256, so ``task_from_config`` rebuilds the task only from the very same bytes.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np

from nas.tasks._build import pack
from nas.tasks.base import IGNORE_INDEX, MAX_SEQ_LEN, MAX_TASK_TOKENS, MAX_VOCAB, Task, TaskError

__all__ = ["MIN_ROWS", "load_npz", "load_text"]
# Rows (text: windows) a file must hold: at the default test_frac of 0.1 that is one test row and
# nine to train on; fewer give an accuracy of 0 or 1 from a row or two, which no search can rank.
MIN_ROWS = 10


def _read(path: str, sha256: str) -> tuple[Path, bytes, str]:
    """(resolved path, bytes, their SHA-256), checked against ``sha256`` when one is given."""
    file = Path(path).expanduser()
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise TaskError(f"{path}: no such file") from None
    except OSError as err:
        raise TaskError(f"{path}: cannot read ({err.strerror or err})") from None
    digest = hashlib.sha256(data).hexdigest()
    if sha256 and sha256 != digest:
        raise TaskError(f"{path}: contents changed (sha256 {digest[:12]}…, expected {sha256[:12]}…)")
    return file.resolve(), data, digest


def _split(n: int, seed: int, test_frac: float, path: str) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows): a seeded permutation, ``round(n * test_frac)`` test rows, at least one each."""
    if seed < 0:
        raise TaskError(f"{path}: seed must be >= 0, got {seed}")
    if not 0 < test_frac < 1:
        raise TaskError(f"{path}: test_frac must be in (0, 1), got {test_frac}")
    n_test = min(max(1, round(n * test_frac)), n - 1)
    perm = np.random.default_rng([seed, 2]).permutation(n)
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _int_array(arrays: dict[str, np.ndarray], key: str, path: str) -> np.ndarray:
    """``arrays[key]`` as int32 (the Task's storage), after checking its range on the raw dtype (a
    uint64 above 2^63, or an int64 below -2^31, would wrap when converted): a token or target id
    must be below ``MAX_VOCAB``, and nothing below ``IGNORE_INDEX`` (a token below 0, a target
    below 0 other than ``IGNORE_INDEX``, is refused by the caller). int32 rather than int64 from
    here on: the copies the split makes are half the size (a 2^30-token file peaked near 50 GB)."""
    arr = arrays[key]
    if arr.size and (top := arr.max()) >= MAX_VOCAB:
        what = "token" if key == "x" else "target"
        size = "vocabulary (max token + 1)" if key == "x" else "outputs (max target + 1)"
        raise TaskError(f"{path}: array '{key}' has {what} {top}; the {size} may be at most {MAX_VOCAB:,}")
    if arr.size and (low := arr.min()) < IGNORE_INDEX:
        if key == "x":
            raise TaskError(f"{path}: 'x' has negative tokens (min {low}); tokens must be >= 0")
        raise TaskError(f"{path}: 'y' has value {low}; targets must be >= 0 or {IGNORE_INDEX} (unscored)")
    return arr.astype(np.int32, copy=arr.dtype != np.int32)


def _header(zipped: zipfile.ZipFile, key: str, path: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of array ``key`` from its ``.npy`` header, without reading its data."""
    names = zipped.namelist()
    # the member numpy's NpzFile reads for ``archive[key]``: one named exactly ``key`` before
    # ``key.npy`` (checking the other let a crafted archive pass a float or raw-bytes 'x')
    member = key if key in names else f"{key}.npy"
    try:
        with zipped.open(member) as fp:
            if fp.read(len(np.lib.format.MAGIC_PREFIX)) != np.lib.format.MAGIC_PREFIX:
                raise TaskError(f"{path}: array '{key}' is not a .npy array")
            fp.seek(0)
            version = np.lib.format.read_magic(fp)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
            else:
                raise TaskError(f"{path}: array '{key}' has .npy format version {version}; expected 1.0 or 2.0")
    except TaskError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, RuntimeError):
        raise TaskError(f"{path}: array '{key}' is unreadable (truncated or corrupt archive)") from None
    return tuple(shape), dtype


def _check_headers(zipped: zipfile.ZipFile, path: str) -> None:
    """Dtypes and shapes of ``x`` and ``y`` as their headers declare them, before any data is read."""
    shapes = {}
    for key in ("x", "y"):
        shape, dtype = _header(zipped, key, path)
        if dtype.hasobject:
            raise TaskError(f"{path}: array '{key}' holds Python objects (never unpickled)")
        if not np.issubdtype(dtype, np.integer):
            raise TaskError(f"{path}: array '{key}' has dtype {dtype}; it must be an integer dtype")
        shapes[key] = shape
    x, y = shapes["x"], shapes["y"]
    if len(x) != 2 or x[1] < 1:
        raise TaskError(f"{path}: 'x' must be 2-D [N, T] with T >= 1, got shape {list(x)}")
    if x[1] > MAX_SEQ_LEN:
        raise TaskError(f"{path}: 'x' has {x[1]:,} tokens per row (shape {list(x)}); at most {MAX_SEQ_LEN:,}")
    if x[0] * x[1] > MAX_TASK_TOKENS:
        raise TaskError(f"{path}: 'x' holds {x[0] * x[1]:,} tokens (shape {list(x)}); at most {MAX_TASK_TOKENS:,}")
    if len(y) not in (1, 2):
        raise TaskError(f"{path}: 'y' must be [N] class labels or [N, T] targets, got shape {list(y)}")
    if y[0] != x[0]:
        raise TaskError(f"{path}: 'x' has {x[0]} rows but 'y' has {y[0]}")
    if len(y) == 2 and y != x:
        raise TaskError(f"{path}: 'y' is {list(y)} but 'x' is {list(x)}; per-token targets must match x")
    if x[0] == 0:
        raise TaskError(f"{path}: 'x' and 'y' are empty (shape {list(x)}); need at least {MIN_ROWS} rows")
    if x[0] < MIN_ROWS:
        raise TaskError(f"{path}: {x[0]} row(s); need at least {MIN_ROWS} (to train on and to test)")


def _load_arrays(data: bytes, path: str) -> dict[str, np.ndarray]:
    if not data:
        raise TaskError(f"{path}: empty file")
    try:
        archive = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile):
        raise TaskError(f"{path}: not a readable .npz archive") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise TaskError(f"{path}: not an .npz archive (a single .npy array)")
    with archive:
        missing = [k for k in ("x", "y") if k not in archive.files]
        if missing:
            raise TaskError(f"{path}: missing array(s) {missing}; found {sorted(archive.files)}")
        _check_headers(archive.zip, path)
        arrays = {}
        for key in ("x", "y"):
            try:
                arrays[key] = archive[key]
            except ValueError as err:
                why = "holds Python objects (never unpickled)" if "pickle" in str(err) else "is unreadable"
                raise TaskError(f"{path}: array '{key}' {why}") from None
            except (OSError, EOFError, zipfile.BadZipFile):
                raise TaskError(f"{path}: array '{key}' is unreadable (truncated or corrupt archive)") from None
        return arrays


def load_npz(*, path: str, seed: int = 0, test_frac: float = 0.1, n_out: int = 0, sha256: str = "") -> Task:
    """A task from ``path`` (.npz with ``x`` [N, T] and ``y`` [N, T] or [N]).

    ``n_out`` 0 infers the number of outputs as max target + 1; a larger value keeps spare
    classes (e.g. ``n_out`` = vocab for a language model whose last tokens are never targets).
    """
    if n_out > MAX_VOCAB:
        raise TaskError(f"{path}: n_out={n_out} is above the maximum of {MAX_VOCAB:,} outputs")
    file, data, digest = _read(path, sha256)
    arrays = _load_arrays(data, path)  # dtypes, shapes and row count checked from the headers
    x, y = _int_array(arrays, "x", path), _int_array(arrays, "y", path)
    if x.min() < 0:
        raise TaskError(f"{path}: 'x' has negative tokens (min {x.min()}); tokens must be >= 0")
    readout = "token" if y.ndim == 2 else "last"
    if readout == "last" and y.min() < 0:
        raise TaskError(f"{path}: class labels in 'y' must be >= 0, got min {y.min()}")
    bad = (y < 0) & (y != IGNORE_INDEX)
    if bad.any():
        raise TaskError(f"{path}: 'y' has value {y[bad].flat[0]}; targets must be >= 0 or {IGNORE_INDEX} (unscored)")
    if (y == IGNORE_INDEX).all():
        raise TaskError(f"{path}: 'y' has no scored targets (all {IGNORE_INDEX})")
    scored = y[y != IGNORE_INDEX]
    if scored.min() == scored.max():
        raise TaskError(
            f"{path}: every scored target in 'y' is {scored.flat[0]}; accuracy could not rank models "
            "(need two classes or more)"
        )
    needed = int(y.max()) + 1
    if n_out and n_out < needed:
        raise TaskError(f"{path}: n_out={n_out} is below max target + 1 = {needed}")
    train, test = _split(x.shape[0], seed, test_frac, path)
    if (y[test] == IGNORE_INDEX).all() or (y[train] == IGNORE_INDEX).all():
        raise TaskError(
            f"{path}: with seed={seed}, test_frac={test_frac} one split has no scored targets; "
            "score more rows or change test_frac"
        )
    # A training row with no scored target teaches nothing, and a batch drawn only from such rows
    # has no loss to average: they are left out of training (the test split keeps its rows; the
    # accuracy counts targets, not rows).
    unscored = (y[train] == IGNORE_INDEX).all(axis=1) if readout == "token" else np.zeros(len(train), bool)
    train = train[~unscored]
    left_out = f" ({int(unscored.sum()):,} training rows with no scored target left out)" if unscored.any() else ""
    config = dict(name="npz", seed=seed, path=str(file), test_frac=test_frac, n_out=n_out, sha256=digest)
    return pack(
        "npz",
        config,
        int(x.max()) + 1,
        n_out or needed,
        readout,
        (x[train], y[train]),
        (x[test], y[test]),
        f"{file.name}: {x.shape[0]}×{x.shape[1]} readout={readout}{left_out}",
    )


def load_text(*, path: str, seed: int = 0, seq_len: int = 128, test_frac: float = 0.1, sha256: str = "") -> Task:
    """A character-level LM over ``path`` (UTF-8). x, y ``[N, seq_len]`` int32; y[t] is the character after x[t]."""
    file, data, digest = _read(path, sha256)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TaskError(f"{path}: not UTF-8 text (bad byte at offset {err.start})") from None
    if not 1 <= seq_len <= MAX_SEQ_LEN:
        raise TaskError(f"{path}: seq_len must be in [1, {MAX_SEQ_LEN:,}], got {seq_len}")
    if len(text) < MIN_ROWS * seq_len + 1:  # MIN_ROWS windows of seq_len + 1 characters, overlapping by one
        raise TaskError(
            f"{path}: {len(text)} characters; seq_len={seq_len} needs at least {MIN_ROWS * seq_len + 1} "
            f"({MIN_ROWS} windows)"
        )
    codepoints = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    chars, tokens = np.unique(codepoints, return_inverse=True)
    if len(chars) > MAX_VOCAB:
        raise TaskError(f"{path}: {len(chars):,} distinct characters; the vocabulary may be at most {MAX_VOCAB:,}")
    windows = (len(tokens) - 1) // seq_len
    starts = np.arange(windows)[:, None] * seq_len + np.arange(seq_len + 1)  # [W, seq_len + 1]
    seqs = tokens[starts]
    targets = seqs[:, 1:]
    if targets.min() == targets.max():  # every model scores 1.000 (a .npz of one class is refused too)
        raise TaskError(
            f"{path}: every target (each character after the first) is {chr(chars[targets.flat[0]])!r}; "
            "accuracy could not rank models (need two distinct characters after the first)"
        )
    train, test = _split(windows, seed, test_frac, path)
    config = dict(name="text", seed=seed, path=str(file), seq_len=seq_len, test_frac=test_frac, sha256=digest)
    return pack(
        "text",
        config,
        len(chars),
        len(chars),
        "token",
        (seqs[train, :-1], seqs[train, 1:]),
        (seqs[test, :-1], seqs[test, 1:]),
        f"{file.name}: char LM, {len(chars)} symbols, {windows} windows",
    )
