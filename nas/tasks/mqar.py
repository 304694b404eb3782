"""Multi-query associative recall (MQAR), as defined by Zoology (Arora et al. 2023, §3 and
``zoology/data/multiquery_ar.py``, ``num_passes=1``, ``random_non_queries=True`` by default).

A sequence opens with ``num_kv_pairs`` key/value pairs ``k1 v1 k2 v2 ...``; keys are distinct and
come from the lower half of the vocabulary (token 0 excluded), values are distinct and come from
the upper half. Every key is then queried exactly once later in the sequence, at positions drawn
from a power law that favours short gaps (``power_a``). The model is scored only at query
positions: the target there is the value bound to that key. Remaining positions hold random
filler tokens from ``[1, vocab_size)`` (Zoology draws from ``[0, vocab_size)``; token 0 is never a
key or value, so leaving it out changes nothing the model is scored on). With
``random_non_queries=false`` (Zoology's other setting) they hold token 0 instead: the same keys,
values and queries for a seed, without filler that repeats a key with a random token after it
(at V=256, T=1024 every key recurs about four times as filler).

``mqar_long`` is the same generator with long-context defaults (V=8192, T=2048, 128 pairs). It is
the task where a fixed-size recurrent state must lose recall: linear attention writes every token,
filler included, into one D×D state per head, so interference grows with the number of pairs and
with the context, while softmax attention keeps a KV cache that grows with the context (Zoology
§4; Based, Arora et al. 2024, "Simple linear attention language models balance the
recall-throughput tradeoff", §3, recall against recurrent state size). The gap law is Zoology's:
the mean key→query distance grows with ``seq_len`` (and with ``num_kv_pairs``).

Learnability. From scratch, a search-sized training stays on MQAR's plateau (loss ln(V/2)) once
T ≥ 128-256 (``docs/benchmarks.md``, earlier experiments), with random or zero filler
and with ``short_frac`` (a share of training rows holding a shorter instance). A length
curriculum over steps does learn: ``curriculum_len=L, curriculum_frac=f`` adds ``n_train`` rows
of an MQAR of length L (pairs capped at L/4), and the first f of the training steps draw from them
(``Task.x_stage1``); the score is always at ``seq_len``. On the CPU, 2-layer attention (d 64)
trained 700 steps at T=64 then 300 at T=256 reached 0.96 (16 pairs) and 0.99 (48 pairs) at T=256,
where from scratch it stays at chance; linear attention of the same width stays at chance.

Cost at T=8192, 512 pairs, 20 000 rows: x and y are int32 (tokens < 2^31; half of int64's bytes,
1.3 GB together) written in place chunk by chunk; besides them only ``[N, num_kv_pairs]`` draws and
one chunk of ``_CHUNK`` cells are alive. The random stream is the one a single whole-array pass
draws, so a seed gives the same rows at every chunk size.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from nas.tasks._build import pack, require, require_sizes, streams
from nas.tasks.base import IGNORE_INDEX, Task

__all__ = ["mqar", "mqar_long"]

_CHUNK = 1 << 22  # cells per chunk of rows: bounds temporaries at Zoology sizes (V=8192, N=100k, T=8192)


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
    rng: np.random.Generator,
    n: int,
    vocab_size: int,
    seq_len: int,
    num_kv_pairs: int,
    power_a: float,
    random_non_queries: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """x, y ``[n, seq_len]`` int32: tokens, and the bound value at each query (IGNORE_INDEX elsewhere).
    Filler is random tokens, or token 0 when ``random_non_queries`` is False (Zoology's option)."""
    context = 2 * num_kv_pairs
    key_vocab = vocab_size // 2
    # [N, D] distinct keys from [1, V/2) and distinct values from [V/2, V), as Zoology samples them
    keys = _draw(rng, n, key_vocab - 1, num_kv_pairs) + 1
    values = _draw(rng, n, vocab_size - key_vocab, num_kv_pairs) + key_vocab

    # Query slots sit on even offsets of the remaining space, so a query never lands where the
    # previous query's target is read; gap g has probability ∝ a·g^(a-1) (Zoology's power law),
    # and the i-th key drawn takes the i-th slot drawn, as in Zoology. The largest slot puts a
    # query at seq_len - 2 at most, so every query and its target lie inside the row.
    space = (seq_len - context) // 2
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    queries = context + 2 * _draw(rng, n, space, num_kv_pairs, np.log(p / p.sum()))  # [N, D] positions in x

    x = np.empty((n, seq_len), dtype=np.int32)
    y = np.full((n, seq_len), IGNORE_INDEX, dtype=np.int32)  # y[t]: the token after x[t], where scored
    rows = max(1, _CHUNK // seq_len)
    for start in range(0, n, rows):
        part = slice(start, min(n, start + rows))
        xs, ys = x[part], y[part]  # [rows, T] views: written in place
        xs[:, 0:context:2], xs[:, 1:context:2] = keys[part], values[part]
        xs[:, context:] = 0
        np.put_along_axis(xs, queries[part], keys[part], axis=1)
        np.put_along_axis(ys, queries[part], values[part], axis=1)
        # filler: keys and values are never 0; chunks draw, in row-major order, what one pass would
        if random_non_queries:
            filler = xs == 0
            xs[filler] = rng.integers(1, vocab_size, size=int(filler.sum()))
    return x, y


# Shorter instances of a mixed training set (``short_frac``): half, a quarter, an eighth and a
# sixteenth of the row, in turn, each with the row's pair density (pairs per token).
SHORT_DIVISORS = (2, 4, 8, 16)


def _generate_mixed(
    rng: np.random.Generator,
    n: int,
    vocab_size: int,
    seq_len: int,
    num_kv_pairs: int,
    power_a: float,
    random_non_queries: bool,
    short_frac: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``_generate`` with the first ``round(n · short_frac)`` rows holding a shorter instance at
    their start (lengths seq_len / SHORT_DIVISORS in turn, pairs scaled alike, at least one), the
    rest of such a row filler and unscored. Rows are drawn by index in training, so where the short
    ones sit does not matter. Full-length rows are what ``_generate`` alone would give from the
    generator's state after the short ones."""
    n_short = round(n * short_frac)
    x = np.empty((n, seq_len), dtype=np.int32)
    y = np.full((n, seq_len), IGNORE_INDEX, dtype=np.int32)
    for j, div in enumerate(SHORT_DIVISORS):
        rows = np.arange(j, n_short, len(SHORT_DIVISORS))
        length = seq_len // div
        kv = max(1, num_kv_pairs // div)
        if not len(rows) or length < 4 * kv:
            x[rows], y[rows] = _generate(rng, len(rows), vocab_size, seq_len, num_kv_pairs, power_a, random_non_queries)
            continue
        xs, ys = _generate(rng, len(rows), vocab_size, length, kv, power_a, random_non_queries)
        x[rows, :length], y[rows, :length] = xs, ys
        x[rows, length:] = rng.integers(1, vocab_size, size=(len(rows), seq_len - length)) if random_non_queries else 0
    x[n_short:], y[n_short:] = _generate(
        rng, n - n_short, vocab_size, seq_len, num_kv_pairs, power_a, random_non_queries
    )
    return x, y


def _check(
    name: str,
    vocab_size: int,
    seq_len: int,
    num_kv_pairs: int,
    power_a: float,
    rows: int,
    short_frac: float,
    curriculum_len: int,
    curriculum_frac: float,
) -> None:
    """Refuse an MQAR configuration that cannot be generated, naming the parameter (TaskError)."""
    require(num_kv_pairs >= 1, name, f"num_kv_pairs must be >= 1, got {num_kv_pairs}")
    require(
        vocab_size // 2 - 1 >= num_kv_pairs,
        name,
        f"vocab_size={vocab_size} has too few keys for num_kv_pairs={num_kv_pairs} "
        f"(need vocab_size >= {2 * num_kv_pairs + 2})",
    )
    require_sizes(name, vocab_size, seq_len, rows)
    require(
        seq_len >= 4 * num_kv_pairs,
        name,
        f"seq_len={seq_len} is too short for {num_kv_pairs} pairs and their queries (need >= {4 * num_kv_pairs})",
    )
    require(0 < power_a <= 1, name, f"power_a must be in (0, 1], got {power_a}")
    require(0 <= short_frac < 1, name, f"short_frac must be in [0, 1), got {short_frac}")
    require(
        (curriculum_len > 0) == (curriculum_frac > 0),
        name,
        f"curriculum_len and curriculum_frac go together, got {curriculum_len} and {curriculum_frac}",
    )
    if curriculum_len:
        require(
            4 <= curriculum_len < seq_len,
            name,
            f"curriculum_len must be in [4, seq_len={seq_len}), got {curriculum_len}",
        )
        require(0 < curriculum_frac < 1, name, f"curriculum_frac must be in (0, 1), got {curriculum_frac}")


def _mqar(
    name: str,
    seed: int,
    vocab_size: int,
    seq_len: int,
    num_kv_pairs: int,
    power_a: float,
    n_train: int,
    n_test: int,
    random_non_queries: bool = True,
    short_frac: float = 0.0,
    curriculum_len: int = 0,
    curriculum_frac: float = 0.0,
) -> Task:
    _check(
        name, vocab_size, seq_len, num_kv_pairs, power_a, n_train + n_test, short_frac, curriculum_len, curriculum_frac
    )
    train_rng, test_rng = streams(name, seed, n_train, n_test)
    shape = (vocab_size, seq_len, num_kv_pairs, power_a, random_non_queries)
    if short_frac > 0:
        train = _generate_mixed(train_rng, n_train, *shape, short_frac)
    else:
        train = _generate(train_rng, n_train, *shape)
    test = _generate(test_rng, n_test, *shape)  # always full length: the score is at seq_len
    stage1 = None
    if curriculum_len:
        # after the training rows, from their stream: those rows are the same with or without it
        stage1 = _generate(
            train_rng,
            n_train,
            vocab_size,
            curriculum_len,
            min(num_kv_pairs, curriculum_len // 4),
            power_a,
            random_non_queries,
        )
    config = dict(
        name=name,
        seed=seed,
        vocab_size=vocab_size,
        seq_len=seq_len,
        num_kv_pairs=num_kv_pairs,
        power_a=power_a,
        n_train=n_train,
        n_test=n_test,
    )
    if not random_non_queries:  # only when set: the configs of tasks stored before it existed stay equal
        config["random_non_queries"] = False
    if short_frac > 0:  # likewise
        config["short_frac"] = short_frac
    if curriculum_len:
        config |= {"curriculum_len": curriculum_len, "curriculum_frac": curriculum_frac}
    description = f"{'long-context ' if name == 'mqar_long' else ''}MQAR V={vocab_size} T={seq_len} kv={num_kv_pairs}"
    description += "" if random_non_queries else " (zero filler)"
    description += f" ({short_frac:.0%} of training rows shorter)" if short_frac > 0 else ""
    if stage1 is None:
        return pack(name, config, vocab_size, vocab_size, "token", train, test, description)
    kv1 = min(num_kv_pairs, curriculum_len // 4)
    description += f", first {curriculum_frac:.0%} of steps at T={curriculum_len} kv={kv1}"
    task = pack(name, config, vocab_size, vocab_size, "token", train, test, description)
    x1, y1 = (torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)) for a in stage1)
    return dataclasses.replace(task, x_stage1=x1, y_stage1=y1, stage1_frac=curriculum_frac)


def mqar(
    *,
    seed: int = 0,
    vocab_size: int = 128,
    seq_len: int = 64,
    num_kv_pairs: int = 8,
    power_a: float = 0.01,
    n_train: int = 8192,
    n_test: int = 512,
    random_non_queries: bool = True,
    short_frac: float = 0.0,
    curriculum_len: int = 0,
    curriculum_frac: float = 0.0,
) -> Task:
    """MQAR with Zoology's generator; train and test come from independent seeded streams.

    x ``[N, seq_len]`` int32 tokens; y ``[N, seq_len]`` int32, the bound value at the
    ``num_kv_pairs`` query positions of each row and IGNORE_INDEX elsewhere.
    """
    return _mqar("mqar", **locals())  # locals(): exactly the parameters above, by name


def mqar_long(
    *,
    seed: int = 0,
    vocab_size: int = 8192,
    seq_len: int = 2048,
    num_kv_pairs: int = 128,
    power_a: float = 0.01,
    n_train: int = 20_000,
    n_test: int = 1000,
    random_non_queries: bool = True,
    short_frac: float = 0.0,
    curriculum_len: int = 0,
    curriculum_frac: float = 0.0,
) -> Task:
    """Long-context MQAR: ``mqar`` with Zoology's vocabulary (8192) at T=2048 and 128 pairs.

    128 pairs is twice Zoology's largest setting, at 8x its longest sequence: a width-256 linear
    attention layer holds d_model·head_dim numbers per layer (8-32K) against an attention KV cache
    of 2·T·d_model (1M) at T=2048. 20 000 rows (x and y: 328 MB as int32); 1000 test rows score
    128 000 queries. x, y ``[N, seq_len]`` int32, as ``mqar``.
    """
    return _mqar("mqar_long", **locals())  # locals(): exactly the parameters above, by name
