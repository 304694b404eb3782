"""MAD synthetic tasks: in-context recall, noisy in-context recall and selective copying.

Anchor: Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures" (ICML),
§3 and App. B; defaults are the benchmark baselines of the reference repository
``athms/mad-lab`` (``configs/tasks/*.yml`` over ``mad/configs.py:MADConfig``), generators as in
``mad/data/instances.py``. 12 800 training and 1 280 test sequences, as there.

**In-context recall** (``multi_query=True``, the benchmark setting). The vocabulary splits into
keys ``[0, P/2)``, values ``[P/2, P)`` and noise ``[P, P + noise_vocab_size)`` with
``P = vocab_size - noise_vocab_size`` (``multi_query=False`` reserves ``vocab_size - 1`` as a
copy prefix and P shrinks by one). A sequence is ``seq_len/2 - 1`` two-token slots, then a probe
pair. A slot is noise (two noise tokens) with probability ``frac_noise``, else a key drawn
uniformly with replacement followed by its value, fixed at the key's first appearance. The probe
repeats a key seen earlier and its value. Test targets score every value whose key appeared
before (the probe included; with ``multi_query=False`` only the probe); keys, first values and
noise are unscored. MAD trains on *every* next token (``is_training`` returns the shifted
inputs), reproduced by ``train_all_tokens=True``. Inputs are the stream without its last token:
``seq_len - 1`` positions (``seq_len`` with ``multi_query=False``).

**Noisy in-context recall** is the same generator with a noise vocabulary (16 tokens) and
``frac_noise=0.2``.

**Selective copying.** Tokens ``[0, V-2)`` to copy, blank ``V-2``, copy marker ``V-1``. The first
``seq_len - num_tokens_to_copy - 1`` positions hold ``num_tokens_to_copy`` random tokens with
blanks inserted between them (each blank goes before a uniformly chosen token, as
``np.insert`` at an index in ``[0, m)`` does in MAD, so the region always ends on a token), then
the marker, then ``num_tokens_to_copy`` blanks. Targets, for train and test alike and without a
shift, are the copied tokens in order at those final blank positions.

Deviations, each because the original cannot be reproduced or fails: MAD's selective copying
places blanks with the global ``np.random`` (not seeded by its rng), here the task's generator;
MAD picks the always-kept kv slot among ``seq_len/2`` slots of which only ``seq_len/2 - 1`` exist,
so occasionally nothing is kept and an all-noise sequence has no key to probe (a crash); here the
kept slot is one that exists.
"""

from __future__ import annotations

import numpy as np

from nas.tasks._build import pack, require, require_sizes, streams
from nas.tasks.base import IGNORE_INDEX, Task

__all__ = ["in_context_recall", "noisy_in_context_recall", "selective_copying"]


def _recall(
    rng: np.random.Generator,
    n: int,
    vocab_size: int,
    seq_len: int,
    multi_query: bool,
    noise_vocab_size: int,
    frac_noise: float,
    train_all_tokens: bool,
) -> tuple[np.ndarray, np.ndarray]:
    plain = vocab_size - noise_vocab_size - (0 if multi_query else 1)  # keys + values
    n_keys, slots = plain // 2, seq_len // 2 - 1
    rows = np.arange(n)[:, None]
    order = np.broadcast_to(np.arange(slots), (n, slots))

    keys = rng.integers(0, n_keys, size=(n, slots))  # [N, S]
    table = rng.integers(n_keys, plain, size=(n, n_keys))  # [N, K] value a key gets on first use
    values = np.take_along_axis(table, keys, axis=1)  # [N, S]
    noise = rng.random((n, slots)) < frac_noise
    noise[rows[:, 0], rng.integers(0, slots, size=n)] = False  # at least one key before the probe

    first = np.full((n, n_keys), slots)  # [N, K] first kv slot of each key; `slots` = never shown
    kv = ~noise
    np.minimum.at(first, (np.broadcast_to(rows, (n, slots))[kv], keys[kv]), order[kv])
    repeat = kv & (np.take_along_axis(first, keys, axis=1) < order)  # value of a key seen before
    # probe: uniform among the keys shown (random scores, unshown keys forced below every shown one)
    probe = np.argmax(np.where(first < slots, rng.random((n, n_keys)), -1.0), axis=1)
    probe_value = table[np.arange(n), probe]

    pairs = np.stack([keys, values], axis=2)  # [N, S, 2]
    if frac_noise > 0:
        noise_tokens = rng.integers(plain, plain + noise_vocab_size, size=(n, slots, 2))
        pairs = np.where(noise[:, :, None], noise_tokens, pairs)
    scored = repeat if multi_query else np.zeros_like(repeat)
    pair_targets = np.stack([np.full_like(values, IGNORE_INDEX), np.where(scored, values, IGNORE_INDEX)], axis=2)

    tail = [probe, probe_value]
    tail_targets = [np.full(n, IGNORE_INDEX), probe_value]
    if not multi_query:
        tail, tail_targets = [np.full(n, vocab_size - 1)] + tail, [np.full(n, IGNORE_INDEX)] + tail_targets
    stream = np.concatenate([pairs.reshape(n, -1), np.stack(tail, axis=1)], axis=1)
    targets = np.concatenate([pair_targets.reshape(n, -1), np.stack(tail_targets, axis=1)], axis=1)
    # x[t] predicts stream[t + 1]; scored targets sit on the key before each scored value
    return stream[:, :-1], (stream if train_all_tokens else targets)[:, 1:]


def _recall_task(config: dict) -> Task:
    """Both recall variants from their ``config`` (the plain one has no noise parameters)."""
    c = {"noise_vocab_size": 0, "frac_noise": 0.0} | config
    name, seq_len, frac_noise, noise_vocab_size = c["name"], c["seq_len"], c["frac_noise"], c["noise_vocab_size"]
    require(seq_len >= 4 and seq_len % 2 == 0, name, f"seq_len must be even and >= 4, got {seq_len}")
    require_sizes(name, c["vocab_size"], seq_len, c["n_train"] + c["n_test"])
    require(0 <= frac_noise < 1, name, f"frac_noise must be in [0, 1), got {frac_noise}")
    require(noise_vocab_size >= 0, name, f"noise_vocab_size must be >= 0, got {noise_vocab_size}")
    require(frac_noise == 0 or noise_vocab_size >= 1, name, "frac_noise > 0 needs noise_vocab_size >= 1")
    plain = c["vocab_size"] - noise_vocab_size - (0 if c["multi_query"] else 1)
    require(
        plain >= 2,
        name,
        f"vocab_size={c['vocab_size']} leaves {plain} key/value tokens after "
        f"noise_vocab_size={noise_vocab_size}{'' if c['multi_query'] else ' and the copy prefix'} (need >= 2)",
    )
    train_rng, test_rng = streams(name, c["seed"], c["n_train"], c["n_test"])
    args = (c["vocab_size"], seq_len, c["multi_query"], noise_vocab_size, frac_noise)
    train = _recall(train_rng, c["n_train"], *args, c["train_all_tokens"])
    test = _recall(test_rng, c["n_test"], *args, False)
    noisy = f" noise={frac_noise}/{noise_vocab_size}" if frac_noise else ""
    return pack(
        name,
        config,
        c["vocab_size"],
        c["vocab_size"],
        "token",
        train,
        test,
        f"MAD in-context recall V={c['vocab_size']} T={seq_len}{noisy}",
    )


def in_context_recall(
    *,
    seed: int = 0,
    vocab_size: int = 16,
    seq_len: int = 128,
    multi_query: bool = True,
    train_all_tokens: bool = True,
    n_train: int = 12_800,
    n_test: int = 1_280,
) -> Task:
    """MAD in-context recall. x ``[N, seq_len - 1]`` (``seq_len`` if not multi_query) int32;
    y likewise: test scores recalled values only, train every next token if ``train_all_tokens``."""
    return _recall_task(
        dict(
            name="mad_recall",
            seed=seed,
            vocab_size=vocab_size,
            seq_len=seq_len,
            multi_query=multi_query,
            train_all_tokens=train_all_tokens,
            n_train=n_train,
            n_test=n_test,
        )
    )


def noisy_in_context_recall(
    *,
    seed: int = 0,
    vocab_size: int = 32,
    seq_len: int = 128,
    noise_vocab_size: int = 16,
    frac_noise: float = 0.2,
    multi_query: bool = True,
    train_all_tokens: bool = True,
    n_train: int = 12_800,
    n_test: int = 1_280,
) -> Task:
    """MAD noisy in-context recall: in-context recall with noise slots that are never scored at test."""
    return _recall_task(
        dict(
            name="mad_noisy_recall",
            seed=seed,
            vocab_size=vocab_size,
            seq_len=seq_len,
            noise_vocab_size=noise_vocab_size,
            frac_noise=frac_noise,
            multi_query=multi_query,
            train_all_tokens=train_all_tokens,
            n_train=n_train,
            n_test=n_test,
        )
    )


def _selective_copy(
    rng: np.random.Generator, n: int, vocab_size: int, seq_len: int, m: int
) -> tuple[np.ndarray, np.ndarray]:
    blanks = seq_len - 2 * m - 1  # blanks mixed into the data region
    tokens = rng.integers(0, vocab_size - 2, size=(n, m))  # [N, m]
    before = rng.integers(0, m, size=(n, blanks))  # the token each blank is inserted before
    counts = np.bincount((before + m * np.arange(n)[:, None]).ravel(), minlength=n * m).reshape(n, m)
    where = np.arange(m) + np.cumsum(counts, axis=1)  # [N, m] position of each token to copy
    x = np.full((n, seq_len), vocab_size - 2, dtype=np.int64)
    np.put_along_axis(x, where, tokens, axis=1)
    x[:, m + blanks] = vocab_size - 1
    y = np.full((n, seq_len), IGNORE_INDEX, dtype=np.int64)
    y[:, seq_len - m :] = tokens
    return x, y


def selective_copying(
    *,
    seed: int = 0,
    vocab_size: int = 16,
    seq_len: int = 256,
    num_tokens_to_copy: int = 16,
    n_train: int = 12_800,
    n_test: int = 1_280,
) -> Task:
    """MAD selective copying. x ``[N, seq_len]`` int32; y ``[N, seq_len]`` int32, the copied tokens
    in order on the last ``num_tokens_to_copy`` positions and IGNORE_INDEX elsewhere."""
    name = "mad_selective_copy"
    require(vocab_size >= 3, name, f"vocab_size must be >= 3 (tokens, blank, copy marker), got {vocab_size}")
    require(num_tokens_to_copy >= 1, name, f"num_tokens_to_copy must be >= 1, got {num_tokens_to_copy}")
    require_sizes(name, vocab_size, seq_len, n_train + n_test)
    require(
        seq_len > 2 * num_tokens_to_copy + 1,
        name,
        f"seq_len={seq_len} must exceed 2*num_tokens_to_copy+1 = {2 * num_tokens_to_copy + 1}",
    )
    train_rng, test_rng = streams(name, seed, n_train, n_test)
    train = _selective_copy(train_rng, n_train, vocab_size, seq_len, num_tokens_to_copy)
    test = _selective_copy(test_rng, n_test, vocab_size, seq_len, num_tokens_to_copy)
    config = dict(
        name=name,
        seed=seed,
        vocab_size=vocab_size,
        seq_len=seq_len,
        num_tokens_to_copy=num_tokens_to_copy,
        n_train=n_train,
        n_test=n_test,
    )
    return pack(
        name,
        config,
        vocab_size,
        vocab_size,
        "token",
        train,
        test,
        f"MAD selective copying V={vocab_size} T={seq_len} copy={num_tokens_to_copy}",
    )
