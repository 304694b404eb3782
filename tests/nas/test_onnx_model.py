"""``model.onnx``: what onnxruntime runs is the torch model at every sequence length, and
``check_onnx`` reports a graph that is not."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from nas.models import HybridModel, build
from nas.results.onnx_model import TRACE_LEN, check_onnx, write_onnx
from nas.spec import ArchSpec, LayerSpec

LENGTHS = (1, 17, 64, 65, 100, 129)  # one token; below, at and past the 64-token chunk; odd non-multiples


def _linear(heads: int, feature_map: str, short_conv: int, mlp_ratio: float = 0) -> LayerSpec:
    return LayerSpec(
        "linear_attention", heads=heads, feature_map=feature_map, short_conv=short_conv, mlp_ratio=mlp_ratio
    )


# Every feature map, the short conv on and off, head dims the GPU kernels take as they are (16, 32)
# and ones they zero-pad (8, 15, 10), and both readouts.
ARCHS = {
    "token": ArchSpec(
        d_model=32,
        layers=(_linear(2, "identity", 0), _linear(4, "elu+1", 4), _linear(1, "relu", 3, mlp_ratio=2)),
        vocab_size=11,
        n_out=5,
        readout="token",
    ),
    "last": ArchSpec(
        d_model=30, layers=(_linear(2, "relu", 2), _linear(3, "elu+1", 0)), vocab_size=11, n_out=4, readout="last"
    ),
}


@pytest.fixture(scope="module", params=list(ARCHS), ids=lambda r: f"readout-{r}")
def exported(request, tmp_path_factory) -> tuple[HybridModel, Path]:
    """The model (eval) and its graph as ``nas export`` writes it, once per readout."""
    torch.manual_seed(0)
    model = build(ARCHS[request.param]).eval()
    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    write_onnx(model, path)
    return model, path


def test_onnxruntime_matches_torch_at_every_length(exported):
    import onnxruntime as ort

    model, path = exported
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    gen = torch.Generator().manual_seed(1)
    for T in LENGTHS:
        tokens = torch.randint(0, model.arch.vocab_size, (3, T), generator=gen)  # not the traced batch either
        with torch.no_grad():
            want = model(tokens).numpy()
        got = session.run(None, {"tokens": tokens.numpy()})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"T={T}")
    assert check_onnx(model, path, seq_len=100) is None


def test_check_onnx_reports_a_graph_that_computes_something_else(exported):
    """The graph of the model before its head moved: every logit differs, at the first shape checked."""
    model, path = exported
    moved = copy.deepcopy(model)
    with torch.no_grad():
        moved.head.bias += 0.5
    problem = check_onnx(moved, path)
    assert problem is not None and "\n" not in problem
    assert problem.startswith("model.onnx at tokens [1, 1] differs from the torch model by up to 0.5"), problem


def test_check_onnx_reports_a_graph_that_cannot_run_a_length(exported, tmp_path):
    """A graph whose seq axis the trace fixed (as a Reshape to the traced length would) fails in
    onnxruntime at the other lengths; the check says where, in one line."""
    model, path = exported
    graph = onnx.load(str(path))
    graph.graph.input[0].type.tensor_type.shape.dim[1].dim_value = TRACE_LEN
    frozen = tmp_path / "model.onnx"
    onnx.save(graph, str(frozen))
    problem = check_onnx(model, frozen)
    assert problem is not None and "\n" not in problem
    assert problem.startswith("onnxruntime cannot run model.onnx at tokens [1, 1] (") and "tokens" in problem, problem
