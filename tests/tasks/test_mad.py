"""MAD task invariants (Poli et al. 2024; athms/mad-lab): the rows, the scoring, the defaults."""

import inspect

import numpy as np
import pytest
import torch

from nas.tasks import IGNORE_INDEX, TaskError, in_context_recall, noisy_in_context_recall, selective_copying


def expected_recall_targets(stream: np.ndarray, n_plain: int, multi_query: bool) -> np.ndarray:
    """MAD's test targets for one recall stream [L] (kv slots, probe key, probe value; no copy
    prefix), rebuilt from its definition: y [L - 1], y[t] the target for stream[t + 1]."""
    half = n_plain // 2
    targets = np.full(len(stream), IGNORE_INDEX)
    bound: dict[int, int] = {}
    for i in range(0, len(stream) - 2, 2):
        k, v = int(stream[i]), int(stream[i + 1])
        if k >= n_plain:  # a noise slot: both tokens noise, never scored, binds nothing
            assert v >= n_plain
            continue
        assert 0 <= k < half <= v < n_plain, "key from the lower half, value from the upper"
        if k in bound:
            assert bound[k] == v, "a key keeps the value of its first appearance"
            if multi_query:
                targets[i + 1] = v
        bound[k] = v
    probe, answer = int(stream[-2]), int(stream[-1])
    assert bound.get(probe) == answer, "the probe repeats a key shown earlier, with its value"
    targets[-1] = answer
    return targets[1:]


def stream_of(x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """The generated stream [N, L]: inputs plus the final token (always the scored probe value)."""
    return np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1)


RECALL = [
    pytest.param(in_context_recall, dict(vocab_size=16, seq_len=64), 16, id="recall-V16-T64"),
    pytest.param(in_context_recall, dict(vocab_size=13, seq_len=30), 13, id="recall-V13-T30-odd-vocab"),
    pytest.param(noisy_in_context_recall, dict(vocab_size=32, noise_vocab_size=16, seq_len=64), 16, id="noisy-V32-T64"),
    pytest.param(
        noisy_in_context_recall,
        dict(vocab_size=27, noise_vocab_size=5, frac_noise=0.6, seq_len=42),
        22,
        id="noisy-V27-T42-heavy",
    ),
]


@pytest.mark.parametrize("fn, params, n_plain", RECALL)
def test_recall_targets_match_mad_definition(fn, params, n_plain):
    task = fn(seed=2, n_train=60, n_test=60, **params)
    assert task.seq_len == params["seq_len"] - 1  # multi-query: the seq_len-token stream, shifted by one
    assert (task.readout, task.vocab_size, task.n_out) == ("token", params["vocab_size"], params["vocab_size"])
    x, y = task.x_test.numpy(), task.y_test.numpy()
    assert ((x >= 0) & (x < task.vocab_size)).all()
    for s, row_y in zip(stream_of(task.x_test, task.y_test), y, strict=True):
        assert np.array_equal(row_y, expected_recall_targets(s, n_plain, multi_query=True))
    assert not (y[x >= n_plain] != IGNORE_INDEX).any(), "noise tokens are never scored"
    # MAD trains on every next token
    assert torch.equal(task.y_train[:, :-1], task.x_train[:, 1:])
    for s in stream_of(task.x_train, task.y_train):
        expected_recall_targets(s, n_plain, multi_query=True)  # train rows obey the same structure


def test_recall_masked_training_and_single_query():
    task = in_context_recall(seed=0, vocab_size=16, seq_len=32, train_all_tokens=False, n_train=40, n_test=4)
    for s, row_y in zip(stream_of(task.x_train, task.y_train), task.y_train.numpy(), strict=True):
        assert np.array_equal(row_y, expected_recall_targets(s, 16, multi_query=True))

    single = in_context_recall(seed=0, vocab_size=16, seq_len=32, multi_query=False, n_train=4, n_test=40)
    x, y = single.x_test.numpy(), single.y_test.numpy()
    assert single.seq_len == 32  # the copy prefix makes the stream seq_len + 1 long
    assert (x[:, -2] == 15).all() and not (x[:, :-2] == 15).any(), "copy prefix V-1 only before the probe"
    assert ((y != IGNORE_INDEX).sum(axis=1) == 1).all() and (y[:, -1] != IGNORE_INDEX).all()
    for s, row_y in zip(stream_of(single.x_test, single.y_test), y, strict=True):
        # without the prefix (and its target) the row is a plain stream scored only at the probe
        expected = expected_recall_targets(np.delete(s, -3), 15, multi_query=False)
        assert np.array_equal(np.delete(row_y, -3), expected)


def test_noise_fraction_and_plain_recall_has_none():
    task = noisy_in_context_recall(seed=0, seq_len=128, n_train=300, n_test=1)
    x = task.x_train.numpy()[:, :-1]  # the kv slots (the probe pair is never noise)
    noise_slots = (x[:, 0::2] >= 16).mean()
    assert 0.17 < noise_slots < 0.23, noise_slots
    assert not (in_context_recall(n_train=50, n_test=1, seq_len=32).x_train >= 16).any()


def test_selective_copying_invariants():
    v, t, m = 11, 45, 7
    task = selective_copying(seed=3, vocab_size=v, seq_len=t, num_tokens_to_copy=m, n_train=200, n_test=50)
    blank, marker, region = v - 2, v - 1, t - m - 1
    for x, y in ((task.x_train.numpy(), task.y_train.numpy()), (task.x_test.numpy(), task.y_test.numpy())):
        assert x.shape == y.shape == (len(x), t)
        assert (x[:, region] == marker).all() and not (x[:, :region] == marker).any()
        assert (x[:, region + 1 :] == blank).all(), "the answer positions are blanks"
        data = x[:, :region]
        assert ((data != blank).sum(axis=1) == m).all(), "exactly num_tokens_to_copy tokens to copy"
        assert (data[:, -1] != blank).all(), "MAD inserts blanks before tokens: the region ends on one"
        assert not (y[:, : t - m] != IGNORE_INDEX).any()
        assert np.array_equal(y[:, t - m :], data[data != blank].reshape(-1, m)), "the tokens, in order"
        assert (y[:, t - m :] < v - 2).all()
    layouts = {tuple(row) for row in (task.x_train.numpy()[:, :region] == blank)}
    assert len(layouts) > 150, "blank placement is random per row"


@pytest.mark.parametrize(
    "fn", [in_context_recall, noisy_in_context_recall, selective_copying], ids=["recall", "noisy", "copy"]
)
def test_deterministic_by_seed(fn):
    small = dict(seq_len=32, n_train=30, n_test=10) | ({"num_tokens_to_copy": 4} if fn is selective_copying else {})
    a, b, c = fn(seed=4, **small), fn(seed=4, **small), fn(seed=5, **small)
    for k in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, k), getattr(b, k))
        assert not torch.equal(getattr(a, k), getattr(c, k))
    assert not torch.equal(a.x_train[:10], a.x_test)
    assert torch.equal(fn(seed=4, **(small | {"n_train": 50})).x_test, a.x_test)


def test_defaults_are_mad_baselines():
    def defaults(fn):
        return {k: p.default for k, p in inspect.signature(fn).parameters.items()}

    assert defaults(in_context_recall) == dict(
        seed=0, vocab_size=16, seq_len=128, multi_query=True, train_all_tokens=True, n_train=12_800, n_test=1_280
    )
    assert defaults(noisy_in_context_recall) == dict(
        seed=0,
        vocab_size=32,
        seq_len=128,
        noise_vocab_size=16,
        frac_noise=0.2,
        multi_query=True,
        train_all_tokens=True,
        n_train=12_800,
        n_test=1_280,
    )
    assert defaults(selective_copying) == dict(
        seed=0, vocab_size=16, seq_len=256, num_tokens_to_copy=16, n_train=12_800, n_test=1_280
    )


@pytest.mark.parametrize(
    "fn, params, needle",
    [
        (in_context_recall, dict(seq_len=33), "even"),
        (in_context_recall, dict(seq_len=2), ">= 4"),
        (in_context_recall, dict(vocab_size=1), "key/value tokens"),
        (noisy_in_context_recall, dict(frac_noise=1.0), "frac_noise"),
        (noisy_in_context_recall, dict(noise_vocab_size=0), "noise_vocab_size >= 1"),
        (noisy_in_context_recall, dict(noise_vocab_size=31), "key/value tokens"),
        (selective_copying, dict(seq_len=33), "must exceed"),
        (selective_copying, dict(vocab_size=2), "vocab_size"),
        (selective_copying, dict(num_tokens_to_copy=0), "num_tokens_to_copy"),
        (selective_copying, dict(n_test=0), "n_test"),
    ],
    ids=[
        "odd-T",
        "tiny-T",
        "tiny-V",
        "all-noise",
        "no-noise-vocab",
        "noise-eats-vocab",
        "copy-T",
        "copy-V",
        "copy-0",
        "n_test",
    ],
)
def test_bad_parameters_raise_task_error(fn, params, needle):
    with pytest.raises(TaskError, match=needle):
        fn(**{"n_train": 4, "n_test": 4, **params})
