"""``model.onnx`` of an export bundle: written with dynamic ``batch`` and ``seq`` axes, then run in
onnxruntime against the torch model at several lengths before the bundle is kept.

The check exists because torch's ONNX exporter does not fail when the model takes a Python
decision on the sequence length: the decision is taken once, at the traced length, the condition
is not part of the graph, and the graph holds only where the same decision would be taken again.
A linear-attention model traced at 16 tokens that way ran at multiples of its 64-token chunk and
failed in a Reshape at every other length above it.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import torch

from kernels.linear_attention.reference import CHUNK
from nas.models import HybridModel

__all__ = ["ONNX_OPSET", "TRACE_LEN", "check_onnx", "write_onnx"]

ONNX_OPSET = 18
# Past one chunk and off a multiple of it: within one chunk (N = 1) or at a multiple (no padding)
# a trace can take a special case and write it down as the rule, as the task's length (16) did.
TRACE_LEN = 2 * CHUNK + 37
# (batch, seq) run in both runtimes: one token of one sequence (both axes at the size exporters
# specialise), within a chunk, the chunk, one past it, the trace length; plus the task's length.
CHECK_SHAPES = ((1, 1), (2, CHUNK // 2 + 1), (2, CHUNK), (2, CHUNK + 1), (2, TRACE_LEN))
MAX_CHECK_LEN = 1024  # the task's length is checked up to this: softmax attention is O(T²) on the CPU
RTOL, ATOL = 1e-3, 1e-4  # fp32 in both; ATOL is scaled by the largest logit


def write_onnx(model: HybridModel, path: Path) -> None:
    """torch.export-based ONNX of ``model`` (eval, CPU) with dynamic ``batch`` and ``seq`` axes on
    ``tokens`` and ``logits``, traced at ``TRACE_LEN`` tokens."""
    example = torch.randint(0, model.arch.vocab_size, (2, TRACE_LEN))
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", min=1)  # a sequence has a token
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)  # it notes every optional op set it skips (e.g. torchvision)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecations inside torch.export's pytree
            torch.onnx.export(
                model,
                (example,),
                str(path),
                input_names=["tokens"],
                output_names=["logits"],
                dynamic_shapes={"tokens": {0: batch, 1: seq}},
                opset_version=ONNX_OPSET,
                dynamo=True,
                external_data=False,
                verbose=False,
            )
    finally:
        exporter_log.setLevel(level)


def check_onnx(model: HybridModel, path: Path, seq_len: int | None = None) -> str | None:
    """Where onnxruntime's run of ``path`` and ``model`` (eval, CPU) disagree, as one line, or None.

    Runs ``CHECK_SHAPES`` and ``[2, seq_len]`` (the task's length, at most ``MAX_CHECK_LEN``) on
    random tokens; outputs agree within ``RTOL`` and ``ATOL`` times the largest logit, NaN with NaN.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: a failed run is reported in the one line returned
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own types per failure
        return f"onnxruntime cannot load {path.name} ({_one_line(e)})"
    shapes = list(CHECK_SHAPES)
    if seq_len is not None and (2, min(seq_len, MAX_CHECK_LEN)) not in shapes:
        shapes.append((2, min(seq_len, MAX_CHECK_LEN)))
    gen = torch.Generator().manual_seed(0)
    for batch, seq in shapes:
        tokens = torch.randint(0, model.arch.vocab_size, (batch, seq), generator=gen)
        with torch.no_grad():
            want = model(tokens).numpy()
        at = f"{path.name} at tokens [{batch}, {seq}]"
        try:
            got = session.run(None, {"tokens": tokens.numpy()})[0]
        except Exception as e:  # e.g. a Reshape the trace fixed to another length
            return f"onnxruntime cannot run {at} ({_one_line(e)})"
        if got.shape != want.shape:
            return f"{at} gives logits {list(got.shape)}, the torch model {list(want.shape)}"
        largest = float(np.nanmax(np.abs(want), initial=0.0))
        if not np.allclose(got, want, rtol=RTOL, atol=ATOL * max(1.0, largest), equal_nan=True):
            diff = float(np.nanmax(np.abs(got - want)))
            return f"{at} differs from the torch model by up to {diff:.3g} (largest logit {largest:.3g})"
    return None


def _one_line(e: Exception) -> str:
    """The error on one line, its start (which node) and its end (which shapes) if it is long."""
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else f"{text[:120]} ... {text[-160:]}"
