"""Multi-query associative recall (MQAR), as defined by Zoology (Arora et al. 2023, §3 and
``zoology/data/associative_recall.py``).

A sequence opens with ``num_kv_pairs`` key/value pairs ``k1 v1 k2 v2 ...``; keys come from the
lower half of the vocabulary (token 0 excluded) and values from the upper half. Every key is then
queried exactly once later in the sequence, at positions drawn from a power law that favours
short gaps (``power_a``). The model is scored only at query positions: the target there is the
value bound to that key. Remaining positions hold random filler tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from nas.tasks.base import IGNORE_INDEX, Task, TaskError

__all__ = ["mqar"]


def _generate(rng: np.random.Generator, n: int, vocab_size: int, seq_len: int, num_kv_pairs: int,
              power_a: float) -> tuple[np.ndarray, np.ndarray]:
    context = 2 * num_kv_pairs
    key_vocab = vocab_size // 2
    # [N, D] distinct keys per example, values (may repeat) from the upper half
    keys = np.argsort(rng.random((n, key_vocab - 1)), axis=1)[:, :num_kv_pairs] + 1
    values = rng.integers(key_vocab, vocab_size, size=(n, num_kv_pairs))
    kvs = np.empty((n, context), dtype=np.int64)
    kvs[:, 0::2], kvs[:, 1::2] = keys, values

    # Query slots sit on even offsets of the remaining space, so a query never lands where the
    # previous query's target is read; gap g has probability ∝ a·g^(a-1) (Zoology's power law).
    space = (seq_len - context) // 2
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    p /= p.sum()
    slots = np.stack([rng.choice(space, size=num_kv_pairs, replace=False, p=p) for _ in range(n)])
    gaps = 2 * slots  # [N, D]

    queries = np.zeros((n, seq_len - context + 1), dtype=np.int64)
    np.put_along_axis(queries, gaps, keys, axis=1)
    tokens = np.concatenate([kvs, queries], axis=1)  # [N, T+1]
    labels = np.full((n, seq_len + 1), IGNORE_INDEX, dtype=np.int64)
    np.put_along_axis(labels, gaps + context + 1, values, axis=1)
    x, y = tokens[:, :-1].copy(), labels[:, 1:].copy()  # next-token alignment: y[t] = value after x[t]

    filler = x == 0
    x[filler] = rng.integers(1, vocab_size, size=int(filler.sum()))
    return x, y


def mqar(*, seed: int = 0, vocab_size: int = 128, seq_len: int = 64, num_kv_pairs: int = 8,
         power_a: float = 0.01, n_train: int = 8192, n_test: int = 512) -> Task:
    """MQAR with Zoology's generator; train and test come from independent seeded streams."""
    if vocab_size < 4 or vocab_size // 2 - 1 < num_kv_pairs:
        raise TaskError(f"mqar: vocab_size={vocab_size} has too few keys for num_kv_pairs={num_kv_pairs}")
    if num_kv_pairs < 1:
        raise TaskError(f"mqar: num_kv_pairs must be >= 1, got {num_kv_pairs}")
    if (seq_len - 2 * num_kv_pairs) // 2 < num_kv_pairs:
        raise TaskError(f"mqar: seq_len={seq_len} is too short for {num_kv_pairs} pairs and their queries "
                        f"(need >= {4 * num_kv_pairs})")
    if not 0 < power_a <= 1:
        raise TaskError(f"mqar: power_a must be in (0, 1], got {power_a}")
    if n_train < 1 or n_test < 1:
        raise TaskError("mqar: n_train and n_test must be >= 1")
    train_rng, test_rng = (np.random.default_rng([seed, s]) for s in (0, 1))
    xtr, ytr = _generate(train_rng, n_train, vocab_size, seq_len, num_kv_pairs, power_a)
    xte, yte = _generate(test_rng, n_test, vocab_size, seq_len, num_kv_pairs, power_a)
    config = dict(name="mqar", seed=seed, vocab_size=vocab_size, seq_len=seq_len,
                  num_kv_pairs=num_kv_pairs, power_a=power_a, n_train=n_train, n_test=n_test)
    return Task("mqar", config, vocab_size, vocab_size, "token",
                torch.from_numpy(xtr), torch.from_numpy(ytr), torch.from_numpy(xte), torch.from_numpy(yte),
                description=f"MQAR V={vocab_size} T={seq_len} kv={num_kv_pairs}")
