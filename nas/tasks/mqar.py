"""Multi-query associative recall (MQAR), as defined by Zoology (Arora et al. 2023, §3 and
``zoology/data/multiquery_ar.py``, ``num_passes=1``, ``random_non_queries=True``).

A sequence opens with ``num_kv_pairs`` key/value pairs ``k1 v1 k2 v2 ...``; keys are distinct and
come from the lower half of the vocabulary (token 0 excluded), values are distinct and come from
the upper half. Every key is then queried exactly once later in the sequence, at positions drawn
from a power law that favours short gaps (``power_a``). The model is scored only at query
positions: the target there is the value bound to that key. Remaining positions hold random
filler tokens from ``[1, vocab_size)`` (Zoology draws from ``[0, vocab_size)``; token 0 is never a
key or value, so leaving it out changes nothing the model is scored on).
"""

from __future__ import annotations

import numpy as np

from nas.tasks._build import pack, require, streams
from nas.tasks.base import IGNORE_INDEX, Task

__all__ = ["mqar"]

_CHUNK = 1 << 22  # scores per chunk of rows: bounds memory at Zoology sizes (V=8192, N=100k)


def _draw(rng: np.random.Generator, n: int, width: int, k: int, log_weights: np.ndarray | None = None) -> np.ndarray:
    """[n, k] int64: per row, k distinct integers from [0, width) drawn one after another without
    replacement, p ∝ exp(log_weights) (uniform if None), in draw order. This is what
    ``rng.choice(width, k, replace=False, p=p)`` samples, vectorized as Gumbel-top-k: the draw
    order is the order of the Gumbel-perturbed log-weights (uniform scores suffice when equal)."""
    rows = max(1, _CHUNK // width)
    parts = []
    for start in range(0, n, rows):
        scores = rng.random((min(rows, n - start), width))  # [rows, W]
        if log_weights is not None:
            scores = log_weights - np.log(-np.log(scores))  # + standard Gumbel noise
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        parts.append(np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, 1), axis=1), 1))
    return np.concatenate(parts).astype(np.int64)


def _generate(
    rng: np.random.Generator, n: int, vocab_size: int, seq_len: int, num_kv_pairs: int, power_a: float
) -> tuple[np.ndarray, np.ndarray]:
    context = 2 * num_kv_pairs
    key_vocab = vocab_size // 2
    # [N, D] distinct keys from [1, V/2) and distinct values from [V/2, V), as Zoology samples them
    keys = _draw(rng, n, key_vocab - 1, num_kv_pairs) + 1
    values = _draw(rng, n, vocab_size - key_vocab, num_kv_pairs) + key_vocab
    kvs = np.empty((n, context), dtype=np.int64)
    kvs[:, 0::2], kvs[:, 1::2] = keys, values

    # Query slots sit on even offsets of the remaining space, so a query never lands where the
    # previous query's target is read; gap g has probability ∝ a·g^(a-1) (Zoology's power law),
    # and the i-th key drawn takes the i-th slot drawn, as in Zoology.
    space = (seq_len - context) // 2
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    gaps = 2 * _draw(rng, n, space, num_kv_pairs, np.log(p / p.sum()))  # [N, D]

    queries = np.zeros((n, seq_len - context + 1), dtype=np.int64)
    np.put_along_axis(queries, gaps, keys, axis=1)
    tokens = np.concatenate([kvs, queries], axis=1)  # [N, T+1]
    labels = np.full((n, seq_len + 1), IGNORE_INDEX, dtype=np.int64)
    np.put_along_axis(labels, gaps + context + 1, values, axis=1)
    x, y = tokens[:, :-1].copy(), labels[:, 1:].copy()  # next-token alignment: y[t] = value after x[t]

    filler = x == 0
    x[filler] = rng.integers(1, vocab_size, size=int(filler.sum()))
    return x, y


def mqar(
    *,
    seed: int = 0,
    vocab_size: int = 128,
    seq_len: int = 64,
    num_kv_pairs: int = 8,
    power_a: float = 0.01,
    n_train: int = 8192,
    n_test: int = 512,
) -> Task:
    """MQAR with Zoology's generator; train and test come from independent seeded streams.

    x ``[N, seq_len]`` int64 tokens; y ``[N, seq_len]`` int64, the bound value at the
    ``num_kv_pairs`` query positions of each row and IGNORE_INDEX elsewhere.
    """
    require(num_kv_pairs >= 1, "mqar", f"num_kv_pairs must be >= 1, got {num_kv_pairs}")
    require(
        vocab_size // 2 - 1 >= num_kv_pairs,
        "mqar",
        f"vocab_size={vocab_size} has too few keys for num_kv_pairs={num_kv_pairs} "
        f"(need vocab_size >= {2 * num_kv_pairs + 2})",
    )
    require(
        seq_len >= 4 * num_kv_pairs,
        "mqar",
        f"seq_len={seq_len} is too short for {num_kv_pairs} pairs and their queries (need >= {4 * num_kv_pairs})",
    )
    require(0 < power_a <= 1, "mqar", f"power_a must be in (0, 1], got {power_a}")
    train_rng, test_rng = streams("mqar", seed, n_train, n_test)
    train = _generate(train_rng, n_train, vocab_size, seq_len, num_kv_pairs, power_a)
    test = _generate(test_rng, n_test, vocab_size, seq_len, num_kv_pairs, power_a)
    config = dict(
        name="mqar",
        seed=seed,
        vocab_size=vocab_size,
        seq_len=seq_len,
        num_kv_pairs=num_kv_pairs,
        power_a=power_a,
        n_train=n_train,
        n_test=n_test,
    )
    return pack(
        "mqar",
        config,
        vocab_size,
        vocab_size,
        "token",
        train,
        test,
        f"MQAR V={vocab_size} T={seq_len} kv={num_kv_pairs}",
    )
