"""Programmatic dependent launch (``kernels._common.pdl``, ``kernels._pdl.enter``).

A kernel launched with ``launch_pdl=True`` may start before the previous kernel in the stream
has finished; it is correct only if it waits (``gdc_wait``) before touching memory. These tests
hold the three parts of that contract: every model kernel starts with the wait (its source),
every launch the model and the decoder make carries the PDL keywords where ``pdl`` gives them
(run under the interpreter with the wait recorded), and on a GPU a PDL graph replays the plain
launches' result.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import kernels._common as common
from nas.models import TritonDecoder, build, to_triton
from nas.spec import ArchSpec, LayerSpec
from tests.kernels._support import requires_cuda, requires_interpreter

ROOT = Path(__file__).resolve().parents[2]
KERNEL_DIRS = ("attention", "conv", "linear", "linear_attention", "norm")  # the model's kernels (not optim)
MIXED = ArchSpec(
    48,
    [
        LayerSpec("attention", 2, None, 4, 1.0, "gelu", "layernorm"),  # head dim 24, run as 32
        LayerSpec("linear_attention", 2, "elu+1", 4, 0.0),
        LayerSpec("linear_attention", 3, "identity", 0, 2.0, "silu", "rmsnorm"),
        LayerSpec("none", mlp_ratio=1.5, activation="relu"),
    ],
    37,
    37,
    "token",
)


def _kernels(path: Path) -> list[ast.FunctionDef]:
    tree = ast.parse(path.read_text())
    return [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef)
        and n.name.endswith("_kernel")
        and any("triton.jit" in ast.unparse(d) for d in n.decorator_list)
    ]


def test_every_model_kernel_waits_before_anything_else():
    found = 0
    for folder in KERNEL_DIRS:
        for path in sorted((ROOT / "kernels" / folder).glob("*.py")):
            for fn in _kernels(path):
                found += 1
                where = f"{path.relative_to(ROOT)}:{fn.name}"
                params = [a.arg for a in fn.args.args]
                assert "PDL" in params, f"{where} has no PDL parameter"
                body = (
                    fn.body[1:]
                    if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant)
                    else fn.body
                )
                assert ast.unparse(body[0]) == "enter(PDL)", (
                    f"{where} starts with {ast.unparse(body[0])!r}, not enter(PDL)"
                )
    assert found >= 15  # the forward's and the decoder's kernels


def _carries_pdl(call: ast.Call, pdl_dicts: set[str]) -> bool:
    """``call`` passes ``**pdl(...)`` (or ``**after_library(...)``, the plain launch chosen after a
    library kernel), or ``**name`` where ``name`` was built with it."""
    for kw in call.keywords:
        if kw.arg is None:
            v = kw.value
            if isinstance(v, ast.Call) and ast.unparse(v.func) in ("pdl", "after_library"):
                return True
            if isinstance(v, ast.Name) and v.id in pdl_dicts:
                return True
    return False


def test_every_kernel_launch_site_passes_the_pdl_keywords():
    """Every ``*_kernel[grid](...)`` launch in the model's kernel folders passes ``**pdl(...)``
    (directly or through a keyword dict built with it), including routes the model test below does
    not reach at its shapes (the TMA linear, split epilogues, two-pass linear attention, the
    decode combine): one without it is a plain launch, which is safe but forgoes the overlap."""
    sites, missing = 0, []
    for folder in KERNEL_DIRS:
        for path in sorted((ROOT / "kernels" / folder).glob("*.py")):
            tree = ast.parse(path.read_text())
            for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
                pdl_dicts = {
                    t.id
                    for node in ast.walk(fn)
                    if isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Call)
                    and _carries_pdl(node.value, set())
                    for t in node.targets
                    if isinstance(t, ast.Name)
                }
                for node in ast.walk(fn):
                    if (
                        isinstance(node, ast.Call)
                        and isinstance(node.func, ast.Subscript)
                        and ast.unparse(node.func.value).endswith("_kernel")
                    ):
                        sites += 1
                        if not _carries_pdl(node, pdl_dicts):
                            missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node.func.value)}")
    assert missing == [], f"kernel launches without **pdl(...): {missing}"
    assert sites >= 17, sites


def test_pdl_keywords_follow_the_device_the_switch_and_the_scope(monkeypatch):
    cpu = torch.zeros(1)
    assert common.pdl(cpu) == {}
    fake_gpu = SimpleNamespace(device=torch.device("cuda", 0))
    monkeypatch.setattr(common, "_interpreted", lambda: False)
    monkeypatch.setattr(common, "_pdl_capable", lambda index: index == 0)
    wait, early = {"PDL": 1, "launch_pdl": True}, {"PDL": 2, "launch_pdl": True}
    try:
        assert common.pdl(fake_gpu) == wait  # outside any scope: the wait only
        with common.pdl_early(True):
            assert common.pdl(fake_gpu) == early
            with common.pdl_early(False):
                assert common.pdl(fake_gpu) == wait
            assert common.pdl(fake_gpu) == early
            assert common.pdl(SimpleNamespace(device=torch.device("cuda", 1))) == {}  # a GPU without it
        assert common.pdl(fake_gpu) == wait
        common.set_pdl(False)
        with common.pdl_early(True):
            assert common.pdl(fake_gpu) == {}
        common.set_pdl(True)
        assert common.pdl(fake_gpu) == wait
        common.set_pdl("early")
        assert common.pdl(fake_gpu) == early
        common.set_pdl("wait")
        with common.pdl_early(True):
            assert common.pdl(fake_gpu) == wait
        with pytest.raises(ValueError, match="set_pdl: use must be None, True, False, 'wait' or 'early'"):
            common.set_pdl("yes")
    finally:
        common.set_pdl(None)


@requires_interpreter
@pytest.mark.parametrize("early_max", [18, 17], ids=["forward-at-the-limit-early", "forward-past-it-waits"])
def test_every_launch_of_the_model_and_the_decoder_waits(monkeypatch, early_max):
    """With ``pdl`` saying yes (as on an H200), every kernel the forward and a decode step launch
    gets ``PDL`` and ``launch_pdl`` and runs the wait, with the early trigger where the step has at
    most ``PDL_EARLY_MAX_TOKENS`` tokens (the forward: 18, a decode step: 2); the results equal
    the plain launches'."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    from nas.models import triton_decode, triton_model

    model = build(MIXED, seed=3).eval()
    tokens = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(1))
    phase = ["forward"]

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        tm = to_triton(model, dtype=torch.float32)
        phase[0] = "forward"
        logits = tm(tokens)
        _, cache = model.prefill(tokens[:, :8])
        decoder = TritonDecoder(tm, batch=2, capacity=10)
        decoder.load(cache)
        phase[0] = "decode"
        return logits, decoder.step(tokens[:, 8])

    plain = run()
    launches: list[tuple[str, str, object, object]] = []
    counts = {"wait": 0, "trigger": 0}
    real_run = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        launches.append((phase[0], self.fn.__name__, kwargs.get("PDL"), kwargs.get("launch_pdl")))
        return real_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", recording_run)
    monkeypatch.setattr(
        tl.extra.cuda, "gdc_wait", lambda: counts.__setitem__("wait", counts["wait"] + 1), raising=False
    )
    monkeypatch.setattr(
        tl.extra.cuda,
        "gdc_launch_dependents",
        lambda: counts.__setitem__("trigger", counts["trigger"] + 1),
        raising=False,
    )
    monkeypatch.setattr(triton_model, "PDL_EARLY_MAX_TOKENS", early_max)
    monkeypatch.setattr(triton_decode, "PDL_EARLY_MAX_TOKENS", early_max)
    patched, original = 0, common.pdl
    for name, module in list(sys.modules.items()):
        if name.startswith("kernels.") and name != "kernels._common" and getattr(module, "pdl", None) is original:
            monkeypatch.setattr(module, "pdl", lambda t: common._pdl_keywords())  # as on a GPU that has it
            patched += 1
    assert patched >= 8
    with_pdl = run()
    names = {name for _, name, _, _ in launches}
    assert {"_linear_kernel", "_flash_fwd_kernel", "_causal_conv_kernel", "_chunked_fwd_kernel"} <= names
    assert {"_rows_kernel", "_rope_append_kernel", "_decode_split_kernel", "_conv_step_kernel", "_step_kernel"} <= names
    expect = {"forward": 2 if 2 * 9 <= early_max else 1, "decode": 2}
    wrong = [(p, n, m, lp) for p, n, m, lp in launches if not (m == expect[p] and lp is True)]
    assert wrong == [], f"launched without the expected PDL keywords {expect}: {wrong}"
    assert counts["wait"] >= len(launches)  # one wait per program
    assert 0 < counts["trigger"] < counts["wait"] if early_max < 18 else counts["trigger"] == counts["wait"]
    for got, expected in zip(with_pdl, plain, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 256), (3, 333)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_pdl_graph_replays_the_plain_launches_result(shape):
    """On sm_90+ the kernels launch with PDL by default: a captured forward, replayed over fresh
    tokens, gives what plain launches give on the same tokens (a missing wait would race)."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90+")
    model = build(MIXED, seed=5).cuda().eval()
    tm = to_triton(model)
    gen = torch.Generator(device="cuda").manual_seed(7)
    static = torch.randint(0, 37, shape, device="cuda", generator=gen)
    assert common.pdl(static) == {"PDL": 1, "launch_pdl": True}
    with common.pdl_early(True):
        assert common.pdl(static) == {"PDL": 2, "launch_pdl": True}
    replay = tm.capture(static)
    for _ in range(5):
        static.copy_(torch.randint(0, 37, shape, device="cuda", generator=gen))
        got = replay().clone()
        common.set_pdl(False)
        try:
            expected = tm(static)
        finally:
            common.set_pdl(None)
        err = ((got.float() - expected.float()).norm() / expected.float().norm()).item()
        assert err < 1e-3, err


def test_after_a_library_kernel_pdl_only_in_an_early_scope(monkeypatch):
    fake_gpu = SimpleNamespace(device=torch.device("cuda", 0))
    monkeypatch.setattr(common, "_interpreted", lambda: False)
    monkeypatch.setattr(common, "_pdl_capable", lambda index: index == 0)
    try:
        assert common.pdl(fake_gpu) == {"PDL": 1, "launch_pdl": True} and common.after_library(fake_gpu) == {}
        with common.pdl_early(True):
            assert common.after_library(fake_gpu) == {"PDL": 2, "launch_pdl": True}
            assert common.after_library(SimpleNamespace(device=torch.device("cuda", 1))) == {}  # no PDL there
        common.set_pdl(False)
        with common.pdl_early(True):
            assert common.after_library(fake_gpu) == {}
        common.set_pdl("early")
        assert common.after_library(fake_gpu) == {"PDL": 2, "launch_pdl": True}
    finally:
        common.set_pdl(None)
    assert common.after_library(torch.zeros(1)) == {}


@requires_interpreter
@pytest.mark.parametrize("early", [False, True], ids=["no-scope", "early-scope"])
@pytest.mark.parametrize("residual", [False, True], ids=["gelu", "gelu+residual"])
def test_the_epilogue_pass_after_cublas_uses_pdl_only_in_an_early_scope(monkeypatch, residual, early):
    """The linear's cuBLAS route (forced; torch's matmul under the interpreter) launches its
    epilogue pass plain outside a ``pdl_early`` scope and with the early trigger inside one, as
    ``after_library`` says on an H200; the fused route's launch carries PDL either way; both give
    the reference's numbers."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    import kernels.linear.triton as lt
    from kernels.linear.reference import linear as linear_ref

    gen = torch.Generator().manual_seed(5)
    x, w, b = torch.randn(7, 24, generator=gen), torch.randn(40, 24, generator=gen), torch.randn(40, generator=gen)
    r = torch.randn(7, 40, generator=gen) if residual else None
    launches: list[tuple[str, object, object]] = []
    real_run = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        launches.append((self.fn.__name__, kwargs.get("PDL"), kwargs.get("launch_pdl")))
        return real_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", recording_run)
    monkeypatch.setattr(tl.extra.cuda, "gdc_wait", lambda: None, raising=False)
    monkeypatch.setattr(tl.extra.cuda, "gdc_launch_dependents", lambda: None, raising=False)
    for module in (common, lt):  # pdl answers as on a GPU that has it (after_library asks common's)
        monkeypatch.setattr(module, "pdl", lambda t: common._pdl_keywords())
    expected = linear_ref(x, w, b, activation="gelu", residual=r)
    try:
        with common.pdl_early(early):
            for route in ("cublas", "triton"):
                lt.set_route(route)
                got = lt.linear(x, w, b, activation="gelu", residual=r)
                torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    finally:
        lt.set_route(None)
    epilogues = [launch for launch in launches if launch[0].startswith("_epilogue")]
    fused = [launch for launch in launches if launch[0] == "_linear_kernel"]
    want = 2 if early else 1
    assert epilogues == [("_epilogue_flat_kernel", 2, True) if early else ("_epilogue_flat_kernel", None, None)]
    assert fused and all(pdl == want and launch_pdl is True for _, pdl, launch_pdl in fused)


@pytest.mark.parametrize(("capability", "capable"), [((9, 0), True), ((10, 0), True), ((8, 9), False)])
def test_pdl_needs_sm_90_or_later(capability, capable, monkeypatch) -> None:
    """The capability check itself (the other tests fake ``_pdl_capable`` whole): Hopper and later
    launch with PDL, Ada (8.9) does not."""
    monkeypatch.setattr(common.torch.cuda, "get_device_capability", lambda index: capability)
    common._pdl_capable.cache_clear()
    try:
        assert common._pdl_capable(0) is capable
    finally:
        common._pdl_capable.cache_clear()
