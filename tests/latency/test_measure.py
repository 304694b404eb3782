"""Measured latency: the on-disk cache (CPU) and the measurement itself (GPU)."""

from __future__ import annotations

import pytest
import torch

from nas.latency import Latency, LatencyCache, cache_key, measure, parse_shape
from nas.models import build
from nas.spec import ArchSpec, LayerSpec
from tests.kernels._support import requires_cuda


def _latency(ms: float) -> Latency:
    return Latency(
        ms,
        0.01,
        "measured",
        "NVIDIA H200",
        "bf16",
        parse_shape("1x256"),
        versions=(("torch", "2.11"), ("triton", "3.6")),
        notes=(("remeasured", "yes"),),
    )


def test_cache_round_trip_and_keys(tmp_path):
    cache = LatencyCache(tmp_path / "lat.json")
    shape = parse_shape("1x256")
    key = cache_key("abc", shape, "bf16", "NVIDIA H200", "2.11", "3.6")
    assert cache.get(key) is None
    cache.put(key, _latency(0.1))
    assert cache.get(key) == _latency(0.1)  # notes and versions survive the JSON
    # everything that determines a measurement is part of the key
    for other in (
        cache_key("abd", shape, "bf16", "NVIDIA H200", "2.11", "3.6"),
        cache_key("abc", parse_shape("8x256"), "bf16", "NVIDIA H200", "2.11", "3.6"),
        cache_key("abc", shape, "fp16", "NVIDIA H200", "2.11", "3.6"),
        cache_key("abc", shape, "bf16", "NVIDIA H100", "2.11", "3.6"),
        cache_key("abc", shape, "bf16", "NVIDIA H200", "2.12", "3.6"),
        cache_key("abc", shape, "bf16", "NVIDIA H200", "2.11", "3.7"),
        cache_key("abc", shape, "bf16", "NVIDIA H200", "2.11", "3.6", "0123456789ab"),
    ):
        assert cache.get(other) is None
    cache.put(key, _latency(0.2))
    assert LatencyCache(tmp_path / "lat.json").get(key).median_ms == 0.2  # a new reader sees the update


def test_latency_read_back_from_the_cache_equals_the_one_written(tmp_path):
    """A latency's identity does not depend on the order its versions and notes were written
    in: ``measure`` builds versions as (torch, triton, kernels), JSON may hand them back in
    another order. The breakdown keeps its execution order through the file."""
    shape = parse_shape("8x1024")
    written = Latency(
        0.5,
        0.002,
        "measured",
        "NVIDIA H200",
        "bf16",
        shape,
        breakdown=(("embed", 0.1), ("attention", 0.3), ("head", 0.1)),
        versions=(("torch", "2.11.0"), ("triton", "3.6.0"), ("kernels", "0123456789ab")),
        notes=(("replays", "30"), ("input_copies", "4")),
    )
    cache = LatencyCache(tmp_path / "lat.json")
    key = cache_key("abc", shape, "bf16", "NVIDIA H200", "2.11.0", "3.6.0", "0123456789ab")
    cache.put(key, written)
    read = LatencyCache(tmp_path / "lat.json").get(key)
    assert read == written
    assert hash(read) == hash(written)
    assert [op for op, _ in read.breakdown] == ["embed", "attention", "head"]
    assert Latency.from_dict(written.to_dict()) == written


def test_kernel_code_is_part_of_the_key(tmp_path):
    """The fingerprint changes with any kernel file's code or name and with a new file; it is
    stable otherwise (a reformat, comment or docstring is not code); the real one covers kernels/
    and the Triton model's forward."""
    from nas.latency._measure import kernels_fingerprint, source_fingerprint

    (tmp_path / "kernels" / "linear").mkdir(parents=True)
    a, b = tmp_path / "kernels" / "linear" / "configs.py", tmp_path / "kernels" / "triton.py"
    a.write_text("HOPPER = (1, 2)\n")
    b.write_text("def f(): pass\n")
    base = source_fingerprint([a, b], tmp_path)
    assert source_fingerprint([b, a], tmp_path) == base  # order-free
    a.write_text("HOPPER = (1, 3)\n")
    assert source_fingerprint([a, b], tmp_path) != base
    a.write_text("HOPPER = (1, 2)\n")
    assert source_fingerprint([a, b], tmp_path) == base
    a.write_text('"""Tilings."""\n\n# sm_90\nHOPPER = (\n    1,\n    2,\n)\n')  # docstring, comment, format
    assert source_fingerprint([a, b], tmp_path) == base
    a.write_text('HOPPER = (1, 2)\nSMALL = "not a docstring"\n')  # a string that is code
    assert source_fingerprint([a, b], tmp_path) != base
    a.write_text("HOPPER = (1, 2)\n")
    c = tmp_path / "kernels" / "extra.py"
    c.write_text("")
    assert source_fingerprint([a, b, c], tmp_path) != base
    b.rename(tmp_path / "kernels" / "triton2.py")
    assert source_fingerprint([a, tmp_path / "kernels" / "triton2.py"], tmp_path) != base
    real = kernels_fingerprint()
    assert len(real) == 12 and int(real, 16) >= 0


def _forward_tree(tmp_path):
    """A copy of what ``kernels_fingerprint`` hashes (kernels/**/*.py and the Triton model) under
    ``tmp_path``, as (files, root)."""
    import shutil
    from pathlib import Path

    import kernels
    import nas.models.triton_model as triton_model

    repo = Path(kernels.__file__).resolve().parent.parent
    shutil.copytree(repo / "kernels", tmp_path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "nas" / "models").mkdir(parents=True)
    shutil.copy(Path(triton_model.__file__), tmp_path / "nas" / "models" / "triton_model.py")
    return [*(tmp_path / "kernels").rglob("*.py"), tmp_path / "nas" / "models" / "triton_model.py"], tmp_path


def test_forward_fingerprint_is_the_calibrated_one_and_ignores_decode_code(tmp_path):
    """The forward fingerprint equals the one the H100 calibration recorded; editing decode-only
    code (a whole decode file, a decode name in a forward file) leaves it, editing a forward
    kernel changes it."""
    from pathlib import Path

    import yaml

    from nas.latency._measure import DECODE_ONLY_FILES, kernels_fingerprint, source_fingerprint

    profile = Path(__file__).resolve().parents[2] / "hardware_profiles" / "h100_sxm.yaml"
    recorded = yaml.safe_load(profile.read_text())["calibrated"]["kernels_fingerprint"]
    assert kernels_fingerprint() == recorded
    files, root = _forward_tree(tmp_path)
    assert source_fingerprint(files, root) == recorded
    for rel in sorted(DECODE_ONLY_FILES):
        assert (root / rel).exists(), rel
        (root / rel).write_text((root / rel).read_text() + "\nEDITED = 1\n")
    configs = root / "kernels" / "attention" / "configs.py"
    configs.write_text(configs.read_text().replace("DECODE_LONG_SLICE = 1024", "DECODE_LONG_SLICE = 2048"))
    assert "DECODE_LONG_SLICE = 2048" in configs.read_text()
    assert source_fingerprint(files, root) == recorded
    optim = root / "kernels" / "optim" / "triton.py"  # training-only: no latency times it
    assert optim.exists()
    optim.write_text(optim.read_text() + "\nEDITED = 1\n")
    assert source_fingerprint(files, root) == recorded
    forward = root / "kernels" / "attention" / "triton.py"
    forward.write_text(forward.read_text().replace("_LOG2E = 1.4426950408889634", "_LOG2E = 1.4426950408889"))
    assert source_fingerprint(files, root) != recorded


def test_cache_survives_a_corrupt_file(tmp_path, monkeypatch):
    path = tmp_path / "lat.json"
    path.write_text("{not json")
    monkeypatch.setenv("NAS_LATENCY_CACHE", str(path))
    cache = LatencyCache()
    assert cache.path == path and cache.get("k") is None
    cache.put("k", _latency(0.3))
    assert cache.get("k").median_ms == 0.3


@pytest.mark.gpu
@requires_cuda
def test_measure_on_gpu_is_measured_cached_and_stable(tmp_path):
    arch = ArchSpec(
        128,
        [
            LayerSpec("attention", 2, None, 4, 4.0),
            LayerSpec("linear_attention", 2, "elu+1", 4, 4.0),
            LayerSpec("none", mlp_ratio=4.0),
            LayerSpec("attention", 4, None, 4, 4.0),
        ],
        256,
        256,
    )
    cache = LatencyCache(tmp_path / "lat.json")
    lat = measure(build(arch, seed=0), parse_shape("1x256"), cache=cache)
    assert lat.source == "measured" and lat.device == torch.cuda.get_device_name() and lat.median_ms > 0
    assert lat.iqr_ms <= 0.05 * lat.median_ms or dict(lat.notes).get("remeasured") == "yes"
    assert measure(build(arch, seed=1), parse_shape("1x256"), cache=cache) == lat  # cached by arch, not weights


def test_measure_follows_the_device_it_is_given(tmp_path, monkeypatch):
    """CPU stand-in for two GPUs: ``measure(..., device="cuda:1")`` names, keys and times the GPU
    it was given, not the current one (the search passes ``--device cuda:N``)."""
    import kernels.device as dev
    import nas.latency._measure as m

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: asked.append(d) or f"GPU{torch.device(d).index}")
    monkeypatch.setattr(m, "kernels_fingerprint", lambda: "f" * 12)
    import triton

    arch = ArchSpec(32, [LayerSpec("attention", 2)], 16, 16)
    shape = parse_shape("1x8")
    cache = LatencyCache(tmp_path / "lat.json")
    stored = Latency(0.25, 0.0, "measured", "GPU1", "bf16", shape)
    cache.put(
        cache_key(m.arch_hash(arch), shape, "bf16", "GPU1", torch.__version__, triton.__version__, "f" * 12), stored
    )
    assert measure(build(arch, seed=0), shape, device="cuda:1", cache=cache) == stored
    assert asked == [torch.device("cuda", 1)]
    assert dev.resolve("cuda") == torch.device("cuda", 0)  # a bare "cuda" is the current GPU, by index
    with pytest.raises(dev.DeviceError, match="2 CUDA device"):
        dev.resolve("cuda:2")
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        measure(build(arch, seed=0), shape, device="cpu", cache=cache)


@pytest.mark.gpu
@requires_cuda
def test_measure_on_gpu_follows_an_explicit_device(tmp_path):
    arch = ArchSpec(64, [LayerSpec("attention", 2), LayerSpec("linear_attention", 2, "elu+1")], 64, 64)
    index = torch.cuda.device_count() - 1
    lat = measure(
        build(arch, seed=0), parse_shape("1x64"), device=f"cuda:{index}", cache=LatencyCache(tmp_path / "lat.json")
    )
    assert lat.source == "measured" and lat.device == torch.cuda.get_device_name(index)


def test_fingerprint_text_is_the_same_on_every_python():
    """The code form behind the fingerprint names no empty field (3.12 gave every function
    ``type_params=[]``; 3.13 changed ``ast.dump``'s defaults) and no position, so a calibration
    taken under one Python matches the kernels under another."""
    import ast

    from nas.latency._measure import _canonical

    tree = ast.parse("def f(x: int) -> int:\n    return x + 1\n")
    tree.body[0].type_params = []  # what 3.12+ parses; must not show
    assert _canonical(tree) == (
        "Module(body=[FunctionDef(name='f',args=arguments(args=[arg(arg='x',annotation=Name(id='int',ctx=Load()))]),"
        "body=[Return(value=BinOp(left=Name(id='x',ctx=Load()),op=Add(),right=Constant(value=1)))],"
        "returns=Name(id='int',ctx=Load()))])"
    )


def test_decode_only_code_is_not_part_of_the_forward_fingerprint(tmp_path):
    """Editing the decode step (``DECODE_ONLY``) leaves forward calibrations valid; editing the
    forward beside it, or the same name in another file, does not."""
    from nas.latency._measure import DECODE_ONLY, source_fingerprint

    rel = "kernels/linear_attention/triton.py"
    assert "_step_kernel" in DECODE_ONLY[rel]
    path = tmp_path / rel
    path.parent.mkdir(parents=True)
    forward = "from kernels.configs import ChunkConfig, step_config\n\ndef _forward_kernel(x):\n    return x + 1\n"
    path.write_text(forward + "\ndef _step_kernel(x):\n    return x * 2\n")
    base = source_fingerprint([path], tmp_path)
    path.write_text(
        forward + "\ndef _step_kernel(x, y):\n    return x * y\n\ndef linear_attention_step(x):\n    pass\n"
    )
    assert source_fingerprint([path], tmp_path) == base
    path.write_text(forward.replace("step_config", "step_config, StepConfig") + "\ndef _step_kernel(x):\n    pass\n")
    assert source_fingerprint([path], tmp_path) == base  # a decode-only name imported
    path.write_text(forward.replace("x + 1", "x + 2") + "\ndef _step_kernel(x):\n    return x * 2\n")
    assert source_fingerprint([path], tmp_path) != base
    other = tmp_path / "kernels" / "attention" / "triton.py"
    other.parent.mkdir(parents=True)
    other.write_text("def _step_kernel(x):\n    return x\n")
    before = source_fingerprint([other], tmp_path)
    other.write_text("def _step_kernel(x):\n    return -x\n")
    assert source_fingerprint([other], tmp_path) != before


def test_report_only_code_is_in_neither_fingerprint_and_no_timed_code_calls_it(tmp_path):
    """``REPORT_ONLY`` names (what the autotuner chose, for benchmarks' reports) can be fixed
    without invalidating a calibration; that is sound only while nothing in ``kernels/`` or
    ``nas/`` calls them, which this checks over the real tree."""
    import ast
    from pathlib import Path

    from nas.latency._measure import REPORT_ONLY, decode_source_fingerprint, source_fingerprint

    rel = "kernels/linear/triton.py"
    assert "last_tuned_config" in REPORT_ONLY[rel]
    path = tmp_path / rel
    path.parent.mkdir(parents=True)
    timed = "def linear(x):\n    return x + 1\n"
    path.write_text(timed + "\ndef last_tuned_config():\n    return None\n")
    base = (source_fingerprint([path], tmp_path), decode_source_fingerprint([path], tmp_path))
    path.write_text(timed + "\ndef last_tuned_config():\n    return 3\n")
    assert (source_fingerprint([path], tmp_path), decode_source_fingerprint([path], tmp_path)) == base
    path.write_text(timed.replace("x + 1", "x + 2") + "\ndef last_tuned_config():\n    return None\n")
    changed = (source_fingerprint([path], tmp_path), decode_source_fingerprint([path], tmp_path))
    assert changed[0] != base[0] and changed[1] != base[1]

    repo = Path(__file__).resolve().parents[2]
    names = set().union(*REPORT_ONLY.values())
    uses = []
    for file in [*(repo / "kernels").rglob("*.py"), *(repo / "nas").rglob("*.py")]:
        for node in ast.walk(ast.parse(file.read_text())):
            used = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if used in names:
                uses.append(f"{file.relative_to(repo)}:{node.lineno} {used}")
    assert not uses, f"timed code reads report-only names: {uses}"
    for rel, defined in REPORT_ONLY.items():
        tree = ast.parse((repo / rel).read_text())
        assert defined <= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, rel


def test_decode_fingerprint_is_the_calibrated_one_and_no_decode_step_reads_forward_only_code(tmp_path):
    """The decode fingerprint equals the one the H100 decode calibration recorded; editing a
    ``FORWARD_ONLY`` name leaves it (and changes the forward's); that is sound only while no code
    a measured decode step runs — the step kernels and their wrappers, ``nas/models/triton_decode.py``
    and ``nas/latency/_measure_decode.py`` — reads those names, which this checks over the real tree."""
    import ast
    from pathlib import Path

    import yaml

    from nas.latency._measure import (
        FORWARD_ONLY,
        PRECISION_ONLY_FILES,
        decode_fingerprint,
        decode_source_fingerprint,
        source_fingerprint,
    )

    repo = Path(__file__).resolve().parents[2]
    profile = yaml.safe_load((repo / "hardware_profiles" / "h100_sxm.yaml").read_text())
    assert decode_fingerprint() == profile["calibrated"]["decode_model"]["kernels_fingerprint"]

    rel = "kernels/linear_attention/triton.py"
    path = tmp_path / rel
    path.parent.mkdir(parents=True)
    step = "def linear_attention_step(x):\n    return x + 1\n"
    path.write_text(step + "\ndef _prefix(x):\n    return x\n")
    base = (source_fingerprint([path], tmp_path), decode_source_fingerprint([path], tmp_path))
    path.write_text(step + "\ndef _prefix(x):\n    return 2 * x\n")
    after = (source_fingerprint([path], tmp_path), decode_source_fingerprint([path], tmp_path))
    assert after[0] != base[0] and after[1] == base[1]
    path.write_text(step.replace("x + 1", "x + 2") + "\ndef _prefix(x):\n    return x\n")
    assert decode_source_fingerprint([path], tmp_path) != base[1]

    step_names = {"_step_kernel", "linear_attention_step", "_step_tickets", "_feature", "_feature_args"}
    names = set().union(*FORWARD_ONLY.values()) - {"__all__"}
    uses = []
    la = ast.parse((repo / rel).read_text())
    bodies = [n for n in la.body if isinstance(n, ast.FunctionDef) and n.name in step_names]
    assert {n.name for n in bodies} == step_names
    stored = ("nas/models/triton_decode_stored.py", *sorted(PRECISION_ONLY_FILES))  # a stored decode's code
    for file in ("nas/models/triton_decode.py", "nas/latency/_measure_decode.py", *stored):
        bodies.append(ast.parse((repo / file).read_text()))
    for body in bodies:
        for node in ast.walk(body):
            used = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            used = used or (node.name if isinstance(node, ast.alias) else None)
            if used in names:
                uses.append(f"{getattr(body, 'name', 'module')}:{getattr(node, 'lineno', '?')} {used}")
    assert not uses, f"decode-timed code reads forward-only names: {uses}"
    for rel, defined in FORWARD_ONLY.items():
        tree = ast.parse((repo / rel).read_text())
        top = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        top |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        top |= {t.target.id for t in tree.body if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)}
        top |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        assert defined - {"prefers_two_pass"} <= top, (rel, sorted(defined - top))


def test_precision_only_kernels_are_in_neither_fingerprint_and_no_timed_code_imports_them():
    """``PRECISION_ONLY_FILES`` (kernels only a decode at a stored precision runs) can be added and
    changed without invalidating a full-precision calibration, and do change the stored decode's
    fingerprint; sound only while no file the full-precision fingerprints cover imports them,
    which this checks over the real tree."""
    import ast
    from pathlib import Path

    from nas.latency._measure import (
        _DECODE_MODEL_FILES,
        PRECISION_ONLY_FILES,
        decode_source_fingerprint,
        source_fingerprint,
    )

    repo = Path(__file__).resolve().parents[2]
    timed = [repo / "kernels" / "attention" / "decode.py"]
    base = (source_fingerprint(timed, repo), decode_source_fingerprint(timed, repo))
    for rel in sorted(PRECISION_ONLY_FILES):
        assert (repo / rel).is_file(), rel
        files = [*timed, repo / rel]
        assert (source_fingerprint(files, repo), decode_source_fingerprint(files, repo)) == base
        # a decode at a stored precision runs them: its fingerprint covers them
        assert decode_source_fingerprint(files, repo, precision=True) != base[1]
    modules = {rel.removesuffix(".py").replace("/", ".") for rel in PRECISION_ONLY_FILES}
    covered = [
        f
        for f in [*(repo / "kernels").rglob("*.py"), *(repo / "nas" / "models" / n for n in _DECODE_MODEL_FILES)]
        if f.relative_to(repo).as_posix() not in PRECISION_ONLY_FILES
    ]
    imports = []
    for file in covered:
        for node in ast.walk(ast.parse(file.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            imports += [f"{file.relative_to(repo)}:{node.lineno} {n}" for n in names if n in modules]
    assert not imports, f"timed code imports precision-only kernels: {imports}"
