"""``nas measure``: the bookkeeping on a CPU with a fake measurer (both latencies kept, the front
and the tables on the measured one, predictions outside their interval named, a rerun measures
nothing, bad input → one line, exit 2, storage bytes unchanged), and the real measurer on a GPU."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import optuna
import pytest
import torch

from hardware_profiles import detect_profile, load_profile
from nas.cli import main
from nas.latency import Latency, LatencyShape, predict, predict_decode
from nas.results import measure as measuring
from nas.results.pareto import front
from nas.search.record import Measured, TrialRecord, measured, records
from nas.spec import arch_hash
from tests.conftest import write_space

H200 = "NVIDIA H200"  # a GPU the h200 profile lists: what the CPU-made studies predicted for


def _search(tmp: Path, name: str, *extra: str) -> Path:
    storage = tmp / "s.journal"
    space = write_space(tmp)
    argv = ["search", "--space", str(space), "--trials", "4", "--no-baselines", "--storage", str(storage)]
    assert main([*argv, "--study", name, "--device", "cpu", "--target", "h200", *extra]) == 0
    return storage


@pytest.fixture(scope="module")
def searched(tmp_path_factory) -> Path:
    """A 4-trial study predicted for h200 on the CPU (default objectives), and an empty study."""
    storage = _search(tmp_path_factory.mktemp("measure"), "m")
    from nas.search.study import open_study

    open_study("empty", str(storage))  # as nas search creates one, before it records its setup
    return storage


@pytest.fixture(scope="module")
def generation(tmp_path_factory) -> Path:
    """A 4-trial study whose objectives are the prefill and decode latencies at a context."""
    objectives = ["--objectives", "accuracy,prefill_latency,decode_latency", "--context", "32"]
    return _search(tmp_path_factory.mktemp("generation"), "g", *objectives)


def _copy(storage: Path, to: Path) -> str:
    shutil.copy(storage, to / "s.journal")
    return str(to / "s.journal")


def _study(storage: str, name: str = "m") -> optuna.Study:
    from nas.search.storage import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(storage))


def _digest(storage: str | Path) -> str:
    return hashlib.sha256(Path(storage).read_bytes()).hexdigest()


class _Fake:
    """Stands for ``measure`` / ``measure_decode``: the h200 prediction times ``factor(arch)``,
    as a measurement on ``H200``; counts its calls."""

    def __init__(self, factor=lambda arch: 1.5) -> None:
        self.factor, self.calls = factor, 0
        self.profile = load_profile("h200")

    def _measured(self, arch, predicted: Latency, shape: LatencyShape, kind: str) -> Latency:
        self.calls += 1
        ms = predicted.median_ms * self.factor(arch)
        return Latency(ms, ms / 50, "measured", H200, "bf16", shape, kind=kind)

    def forward(self, model, shape, *, device=None, cache=None) -> Latency:
        return self._measured(model.arch, predict(model.arch, shape, self.profile), shape, "forward")

    def decode(self, model, batch, context, *, device=None, cache=None) -> Latency:
        predicted = predict_decode(model.arch, batch, context, self.profile)
        return self._measured(model.arch, predicted, LatencyShape(batch, context), "decode")


@pytest.fixture
def fake(monkeypatch) -> _Fake:
    """The fake measurer on a pretend H200 (``local_gpu``: the CPU, named as that GPU)."""
    found = _Fake()
    monkeypatch.setattr(measuring, "measure", found.forward)
    monkeypatch.setattr(measuring, "measure_decode", found.decode)
    monkeypatch.setattr(measuring, "local_gpu", lambda device: (torch.device("cpu"), H200))
    return found


def _trained(storage: str, name: str = "m") -> list[TrialRecord]:
    return [r for r in records(_study(storage, name)) if r.trained]


def test_measure_keeps_both_and_names_predictions_outside_their_interval(searched, tmp_path, fake, capsys):
    storage = _copy(searched, tmp_path)
    before = {r.number: r for r in _trained(storage)}
    assert main(["measure", "--study", "m", "--storage", storage]) == 0
    out = capsys.readouterr().out
    study = _study(storage)
    assert fake.calls == len(before) and set(measured(study)) == set(before)
    for r in _trained(storage):
        assert r.latency == before[r.number].latency and r.latency.predicted  # the prediction, untouched
        assert r.measured.latency.source == "measured" and r.measured.device == H200
        assert r.value("latency_ms") == pytest.approx(1.5 * r.latency.median_ms)  # the measurement wins
        assert r.prediction_of("latency_ms") == r.latency and r.latency_of("latency_ms") == r.measured.latency
        assert r.latency_label() == f"measured on {H200}"
    # Optuna's values keep the prediction: its samplers and hypervolume see what the search saw
    for t in study.get_trials(deepcopy=False):
        if t.number in before:
            assert t.values[1] == pytest.approx(before[t.number].latency.median_ms)
    # 50 % off: every prediction is outside its interval, one line each, and the summary counts them
    lines = [line for line in out.splitlines() if line.startswith("outside its interval: ")]
    assert len(lines) == len(before) and all("(+50%)" in line for line in lines), out
    assert f"measured {len(before)} trial(s) on {H200}: {len(before)} of {len(before)} prediction(s) outside" in out
    assert sum(line.startswith("measure ") for line in out.splitlines()) == len(before)  # one line per trial
    assert "(predicted " in out  # the front table shows the prediction beside the measurement
    # the front reads the measured values
    assert all(r.measured is not None for r in front(study))


def test_a_measurement_moves_the_front_and_the_tables_show_both(searched, tmp_path, fake, capsys):
    from nas.results.report import front_table_html, hover_text

    storage = _copy(searched, tmp_path)
    study = _study(storage)
    on_front = {r.number for r in front(study)}
    off = [r for r in _trained(storage) if r.number not in on_front]
    assert off, "the study's front holds every trial: no trial for a measurement to move"
    fast = arch_hash(off[0].arch)
    fake.factor = lambda arch: 0.01 if arch_hash(arch) == fast else 1.0  # the others exactly as predicted
    assert main(["measure", "--study", "m", "--storage", storage]) == 0
    out = capsys.readouterr().out
    assert off[0].number in {r.number for r in front(study)}  # now the fastest: on the front
    assert "1 of 4 prediction(s) outside their interval" in out
    assert f"outside its interval: trial {off[0].number}: latency measured" in out and "(-99%)" in out
    moved = next(r for r in front(study) if r.number == off[0].number)
    assert f"{moved.value('latency_ms'):.4f} (predicted {moved.latency.median_ms:.4g} ±" in out  # the final table
    table = front_table_html(study)
    assert f"{moved.value('latency_ms'):.4g} (measured; predicted {moved.latency.median_ms:.4g} ±" in table
    hover = hover_text(moved)
    assert f"measured on {H200}" in hover and f"; predicted {moved.latency.median_ms:.4g} [" in hover


def test_a_rerun_measures_nothing_unless_again(searched, tmp_path, fake, capsys):
    storage = _copy(searched, tmp_path)
    on_front = {r.number for r in front(_study(storage))}
    assert main(["measure", "--study", "m", "--storage", storage, "--front"]) == 0
    assert set(measured(_study(storage))) == on_front and fake.calls == len(on_front)
    capsys.readouterr()
    assert main(["measure", "--study", "m", "--storage", storage]) == 0  # the others, not the front again
    n = len(_trained(storage))
    assert fake.calls == n and f"{len(on_front)} measured already, skipped" in capsys.readouterr().out
    before = _digest(storage)
    assert main(["measure", "--study", "m", "--storage", storage]) == 0
    out = capsys.readouterr().out
    assert f"nothing to measure: all {n} trained trial(s) with a predicted latency were measured on {H200}" in out
    assert fake.calls == n and _digest(storage) == before
    assert main(["measure", "--study", "m", "--storage", storage, "--again"]) == 0
    assert fake.calls == 2 * n and f"measured {n} trial(s)" in capsys.readouterr().out


def test_generation_latencies_are_measured_beside_their_predictions(generation, tmp_path, fake, capsys):
    storage = _copy(generation, tmp_path)
    assert main(["measure", "--study", "g", "--storage", storage]) == 0
    out = capsys.readouterr().out
    trained = _trained(storage, "g")
    assert fake.calls == 3 * len(trained)  # the forward, the prefill and one decode step each
    for r in trained:
        for metric, kind in (("prefill_latency_ms", "forward"), ("decode_latency_ms", "decode")):
            got, predicted = r.measured.of(metric), r.prediction_of(metric)
            assert got.kind == kind and got.shape == LatencyShape(1, 32) and predicted.predicted
            assert r.value(metric) == pytest.approx(1.5 * predicted.median_ms)
    n = 2 * len(trained)  # the forward is no objective here: only the two generation latencies count
    assert f"{n} of {n} prediction(s) outside their interval" in out
    assert sum(line.startswith("outside its interval: ") for line in out.splitlines()) == n


def test_a_trial_whose_kernels_fail_stays_predicted(searched, tmp_path, fake, monkeypatch, capsys):
    from nas.latency import KernelMismatchError

    storage = _copy(searched, tmp_path)
    broken = arch_hash(_trained(storage)[0].arch)

    def forward(model, shape, *, device=None, cache=None):
        if arch_hash(model.arch) == broken:
            raise KernelMismatchError("output differs from the reference by 0.3\nsecond line")
        return _Fake.forward(fake, model, shape)

    monkeypatch.setattr(measuring, "measure", forward)
    assert main(["measure", "--study", "m", "--storage", storage]) == 0
    out = capsys.readouterr().out
    n = len(_trained(storage))
    assert "not measured (KernelMismatchError: output differs from the reference by 0.3)" in out
    assert f"measured {n - 1} trial(s) on {H200}, 1 could not be measured (left as predicted)" in out
    assert set(measured(_study(storage))) == {r.number for r in _trained(storage)[1:]}


def test_a_budget_judges_the_measured_latency():
    from nas.search.record import _judged
    from nas.search.setup import StudyBudgets
    from nas.spec import ArchSpec, LayerSpec

    shape = LatencyShape(1, 256)
    predicted = Latency(0.02, 0.0, "predicted", "h200", "bf16", shape, interval=0.1)
    arch = ArchSpec(d_model=16, layers=(LayerSpec("attention", heads=1),), vocab_size=16, n_out=16)
    r = TrialRecord(3, optuna.trial.TrialState.COMPLETE, {"latency_ms": 0.02}, arch=arch, latency=predicted)
    budgets = StudyBudgets(max_latency_ms=0.025)
    assert _judged(r, budgets).feasible  # as predicted: within the budget
    slow = _judged(r, budgets, Measured(Latency(0.03, 0.001, "measured", H200, "bf16", shape)))
    assert not slow.feasible and slow.over_budget == ("latency_ms",) and slow.value("latency_ms") == 0.03
    assert slow.values["latency_ms"] == 0.02  # Optuna's value, as stored
    assert slow.over_budget_text() == f"over the study's budget on latency_ms (as measured on {H200})"


def test_measured_record_round_trips():
    shape = LatencyShape(1, 256)
    lat = Latency(0.02, 0.001, "measured", H200, "bf16", shape)
    found = Measured(lat, decode=Latency(0.01, 0.0, "measured", H200, "bf16", shape, kind="decode"))
    assert Measured.from_dict(found.to_dict()) == found and found.of("prefill_latency_ms") is None


def _measured_search(storage: str) -> None:
    """The study marked as measured during its search (as nas search --measure records it)."""
    study = _study(storage)
    study.set_user_attr("search", {**study.user_attrs["search"], "measure": True})


BAD = [
    ("unknown-study", ["--study", "ghost"], None, "no study named 'ghost'", "studies there: ['m', 'empty']"),
    ("not-nas-search", ["--study", "empty"], H200, "study 'empty' was not created by nas search", ""),
    ("no-cuda", ["--study", "m"], None, "no CUDA device is available", "nas measure times kernels on a CUDA GPU"),
    ("cpu-device", ["--study", "m", "--device", "cpu"], None, "--device cpu is none", ""),
    ("bad-device", ["--study", "m", "--device", "gpu7"], None, "is not a torch device", ""),
    ("other-gpu", ["--study", "m"], "NVIDIA H100 80GB HBM3", "predicted latency for h200", "this GPU is NVIDIA H100"),
]


@pytest.mark.parametrize(("argv", "gpu", "words", "more"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input_one_line_exit_2_storage_untouched(searched, tmp_path, monkeypatch, capsys, argv, gpu, words, more):
    storage = _copy(searched, tmp_path)
    if gpu is not None:  # a pretend GPU of that name; None: this machine's own devices (no CUDA here)
        monkeypatch.setattr(measuring, "local_gpu", lambda device: (torch.device("cpu"), gpu))
    elif torch.cuda.is_available() and words.endswith("available"):
        pytest.skip("this machine has a CUDA device")
    before = _digest(storage)
    assert main(["measure", *argv, "--storage", storage]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("nas: error: ") and words in err and more in err, err
    assert _digest(storage) == before


def test_a_study_measured_during_its_search_has_nothing_to_measure(searched, tmp_path, fake, capsys):
    storage = _copy(searched, tmp_path)
    _measured_search(storage)
    before = _digest(storage)
    assert main(["measure", "--study", "m", "--storage", storage]) == 0
    assert "measured its latencies on h200 during the search: nothing to measure" in capsys.readouterr().out
    assert fake.calls == 0 and _digest(storage) == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_real_measurer_times_a_two_trial_study(tmp_path, capsys):
    profile = detect_profile()
    if profile is None:
        pytest.skip(f"no shipped profile lists {torch.cuda.get_device_name()}")
    storage = str(tmp_path / "s.journal")
    argv = ["search", "--space", str(write_space(tmp_path)), "--trials", "2", "--no-baselines", "--storage", storage]
    assert main([*argv, "--study", "m", "--device", "cpu", "--target", profile.name]) == 0  # trained, predicted
    capsys.readouterr()
    assert main(["measure", "--study", "m", "--storage", storage]) == 0
    out = capsys.readouterr().out
    trained = _trained(storage)
    assert len(trained) == 2 and f"measured 2 trial(s) on {torch.cuda.get_device_name()}" in out, out
    for r in trained:
        assert r.latency.predicted and r.measured.latency.source == "measured" and r.measured.latency.median_ms > 0
        assert r.measured.device == torch.cuda.get_device_name() and r.measured.latency.shape == LatencyShape(1, 256)


def test_the_report_splits_a_measured_latency_in_the_cost_models_shares(searched, tmp_path, fake, capsys):
    """After nas measure, the report's breakdown bars add up to the measured latency (the table's),
    in the prediction's shares, and say so; a prediction's own bars are its per-launch terms."""
    from nas.results.report import figures

    storage = _copy(searched, tmp_path)
    assert main(["measure", "--study", "m", "--storage", storage]) == 0
    capsys.readouterr()
    study = _study(storage)
    fig = figures(study)["breakdown"]
    for r in front(study):
        label = f"#{r.number} {r.arch_summary}"
        parts = {t.name: t.x[list(t.y).index(label)] for t in fig.data if label in t.y}
        assert sum(parts.values()) == pytest.approx(r.measured.latency.median_ms, rel=1e-9)
        predicted = dict(r.latency.breakdown)  # the shares: 1.5x every predicted term here
        assert parts["embedding"] == pytest.approx(1.5 * predicted["embed"], rel=1e-9)
        first = next(t for t in fig.data if label in t.y)
        source = first.customdata[list(first.y).index(label)]
        assert source.startswith(f"measured on {H200}, split in the cost model's shares")


def test_a_latency_measured_by_the_search_is_split_in_a_fresh_predictions_shares():
    """A study measured during its search stored no prediction: the split is predicted now for the
    study's profile and shape, and scaled to the measured total."""
    from types import SimpleNamespace

    from nas.results.report import _latency_split
    from nas.spec import ArchSpec, LayerSpec

    arch = ArchSpec(64, (LayerSpec("attention", heads=2), LayerSpec("none")), 32, 32, "token")
    shape = LatencyShape(1, 256)
    lat = Latency(0.05, 0.001, "measured", H200, "bf16", shape)
    r = TrialRecord(number=3, state=optuna.trial.TrialState.COMPLETE, arch=arch, latency=lat)
    setup = SimpleNamespace(latency_shape="1x256", context=None, decode_batch=1)
    split, source = _latency_split(r, "latency_ms", load_profile("h200"), setup)
    model = dict(predict(arch, shape, load_profile("h200")).breakdown)
    assert sum(split.values()) == pytest.approx(0.05, rel=1e-12) and set(split) == set(model)
    ratios = {op: split[op] / model[op] for op in model if model[op] > 0}
    assert max(ratios.values()) == pytest.approx(min(ratios.values()), rel=1e-9)  # the model's shares
    assert source == f"measured on {H200}, split in the cost model's shares (h200)"
