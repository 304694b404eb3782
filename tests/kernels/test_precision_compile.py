"""The stored-precision kernels (fp8 KV-cache decode, bf16-state step, fp8 linear) compile for the GPUs that
run them: Triton's own compiler builds each launch the wrappers make down to a cubin for sm_90
(Hopper) and sm_89 (Ada, the first with fp8), on the CPU, no GPU needed. The interpreter tests
check what the kernels compute; this checks that the compiled path exists at all (a conversion or
a ``tl.dot`` operand type the interpreter accepts and the GPU compiler rejects fails here, in CI,
instead of on a leased GPU)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

TARGETS = [(90, "sm_90"), (89, "sm_89")]
SHARED: dict[str, int] = {}  # the largest shared memory each kernel took, per target (printed)


def _compile(fn, signature: dict[str, str], constexprs: dict[str, object], capability: int, **options) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**signature, **dict.fromkeys(constexprs, "constexpr")}
    # as a launch specialises them (torch's allocations are 16-byte aligned, strides of real shapes
    # multiples of 16): the aligned, pipelined variant, whose shared memory must fit
    names = list(inspect.signature(fn.fn).parameters)
    aligned = {
        (names.index(n),): [["tt.divisibility", 16]]
        for n, t in signature.items()
        if t.startswith("*") or n.startswith("stride")
    }
    compiled = triton.compile(
        ASTSource(fn, signature, constexprs, attrs=aligned),
        target=GPUTarget("cuda", capability, 32),
        options=options,
    )
    assert compiled.asm.get("cubin"), "no cubin"
    limit = {90: 232448, 89: 101376}[capability]  # shared memory a block may take (227 KB, 99 KB)
    assert compiled.metadata.shared <= limit, f"{fn.__name__}: {compiled.metadata.shared} B of shared memory"
    key = f"{fn.__name__} sm_{capability}"
    SHARED[key] = max(SHARED.get(key, 0), compiled.metadata.shared)


_I32, _I64 = "i32", "i64"
_DECODE = {
    "Q": "*bf16",
    "KC": "*fp8e4nv",
    "VC": "*fp8e4nv",
    "KS": "*fp32",
    "VS": "*fp32",
    "POS": "*i32",
    "O_PART": "*fp32",
    "LSE": "*fp32",
    "OUT": "*bf16",
    "COUNT": "*i32",
    **dict.fromkeys(("stride_kb", "stride_kh", "stride_kc", "stride_vb", "stride_vh", "stride_vc"), _I64),
    **dict.fromkeys(("H", "C", "split_rows", "splits"), _I32),
    "qk_scale": "fp32",
}


def fp8_decode(capability: int, q_dtype: str) -> None:
    from kernels.attention import decode_fp8
    from kernels.attention.configs import DECODE_MAX_SHARED, DecodeConfig, fit_decode_shared

    signature = {**_DECODE, "Q": f"*{q_dtype}", "OUT": f"*{q_dtype}"}
    # the wrapper's fit: the tile halved until it fits the GPU's shared memory less 16 KB, at q's size
    budget = min(DECODE_MAX_SHARED, {90: 232448, 89: 101376}[capability] - 16 * 1024)
    element = {"bf16": 2, "fp16": 2, "fp32": 4}[q_dtype]
    launches = [
        (True, False, True, 128, 64),
        (True, True, False, 64, 128),
        (False, False, False, 32, 64),
        (False, True, True, 16, 16),
    ]
    if capability == 90 and q_dtype == "bf16":  # the default fp8 launches on sm_90, as decode_config_fp8 makes them
        launches += [(t.dot, False, t.fused, d, t.block_n) for d, t in decode_fp8.DECODE_FP8_HOPPER.items()]
    for dot, direct, fused, head_dim, block_n in launches:
        block_n = fit_decode_shared(DecodeConfig(block_n, 4, 3, 1, dot), head_dim, element, budget).block_n
        constexprs = {
            "DIRECT": direct,
            "FUSED": fused,
            "DOT": dot,
            "PRECISION": "ieee" if q_dtype == "fp32" else None,
            "HEAD_DIM": head_dim,
            "BLOCK_N": block_n,
            "SPLITS_P2": 32,
            "BLOCK_S": 32,
            "F16": q_dtype != "fp32",
            "PDL": False,
        }
        _compile(decode_fp8._decode_fp8_split_kernel, signature, constexprs, capability, num_warps=4, num_stages=3)


def fp8_append(capability: int, rope: bool) -> None:
    from kernels.attention import decode_fp8

    signature = {
        "QKV": "*bf16",
        "KC": "*fp8e4nv",
        "VC": "*fp8e4nv",
        "KS": "*fp32",
        "VS": "*fp32",
        "POS": "*i32",
        "COS": "*fp32",
        "SIN": "*fp32",
        "QO": "*bf16",
        "stride_qkv": _I32,
        **dict.fromkeys(("stride_kb", "stride_kh", "stride_kc", "stride_vb", "stride_vh", "stride_vc"), _I64),
        **dict.fromkeys(("stride_cs", "H", "C"), _I32),
    }
    for head_dim in (16, 128):
        constexprs = {"HEAD_DIM": head_dim, "ROPE": rope, "PDL": False}
        _compile(decode_fp8._rope_append_fp8_kernel, signature, constexprs, capability, num_warps=1)


def bf16_state_step(capability: int, feature_map: str) -> None:
    from kernels.linear_attention import configs as la_configs
    from kernels.linear_attention import step_bf16

    signature = {
        **dict.fromkeys(("Q", "K", "V", "OUT"), "*bf16"),
        **dict.fromkeys(("S", "Z"), "*bf16"),
        "TICKETS": "*i32",
        **dict.fromkeys(("stride_qb", "stride_qh", "stride_kb", "stride_kh", "stride_vb", "stride_vh", "H"), _I32),
        "q_scale": "fp32",
    }
    normalize = feature_map != "identity"
    for head_dim in (32, 128):
        for config in la_configs.step_configs(head_dim):
            constexprs = {
                "HEAD_DIM": head_dim,
                "BLOCK_V": config.block_v,
                "FEATURE": feature_map,
                "NORMALIZE": normalize,
                "HAS_Z": normalize,
                "PDL": False,
            }
            _compile(step_bf16._step_bf16_kernel, signature, constexprs, capability, num_warps=config.num_warps)


def fp8_linear(capability: int, out_dtype: str) -> None:
    from kernels.linear import fp8

    signature = {
        "XQ": "*fp8e4nv",
        "SX": "*fp32",
        "WQ": "*fp8e4nv",
        "SW": "*fp32",
        "BIAS": "*fp32",
        "R": f"*{out_dtype}",
        "Y": f"*{out_dtype}",
        **dict.fromkeys(("M", "N", "K", "stride_xm", "stride_wn", "stride_rm", "stride_ym"), _I32),
    }
    for cfg, activation, bias, residual in (
        (fp8.FP8_HOPPER, None, False, False),
        (fp8.FP8_HOPPER, "gelu", True, True),
        (fp8.Fp8Config(64, 128, 64, 8, 4, 4), "silu", True, False),
        (fp8.FP8_HOPPER_ROWS, None, True, True),  # a decode step's linears
        (fp8.FP8_HOPPER_ROWS, "silu", True, False),
    ):
        constexprs = {
            "ACTIVATION": activation,
            "HAS_BIAS": bias,
            "HAS_RESIDUAL": residual,
            "BLOCK_M": cfg.block_m,
            "BLOCK_N": cfg.block_n,
            "BLOCK_K": cfg.block_k,
            "GROUP_M": cfg.group_m,
            "PDL": False,
        }
        _compile(
            fp8._linear_fp8_kernel,
            signature,
            constexprs,
            capability,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    rows = {
        "X": f"*{out_dtype}",
        "XQ": "*fp8e4nv",
        "SX": "*fp32",
        **dict.fromkeys(("M", "K", "KP", "stride_xm", "stride_qm"), _I32),
    }
    _compile(fp8._quantize_rows_kernel, rows, {"BLOCK_M": 4, "BLOCK_K": 1024, "PDL": False}, capability, num_warps=4)


def main() -> None:
    """Compile every launch above for every target; one line per failure, exit 1 if any."""
    cases = [
        *((fp8_decode, (cap, dtype)) for cap, _ in TARGETS for dtype in ("bf16", "fp16", "fp32")),
        *((fp8_append, (cap, rope)) for cap, _ in TARGETS for rope in (True, False)),
        *((bf16_state_step, (cap, fm)) for cap, _ in TARGETS for fm in ("identity", "elu+1", "relu")),
        *((fp8_linear, (cap, dtype)) for cap, _ in TARGETS for dtype in ("bf16", "fp32")),
    ]
    failed = 0
    for fn, args in cases:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - each failure reported, the rest still compiled
            failed += 1
            print(f"FAILED {fn.__name__}{args}: {type(exc).__name__}: {str(exc)[:2000]}")
    print(f"compiled {len(cases) - failed} of {len(cases)} case groups")
    print("largest shared memory: " + ", ".join(f"{k} {v:,} B" for k, v in sorted(SHARED.items())))
    sys.exit(1 if failed else 0)


@pytest.mark.skipif(
    "nvidia" not in getattr(triton.backends, "backends", {}), reason="this Triton has no CUDA backend to compile with"
)
def test_the_precision_kernels_compile_for_hopper_and_ada() -> None:
    """In a process of its own: the tests run the kernels under the interpreter, and an
    interpreted kernel cannot be handed to the compiler."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"PYTHONPATH": str(root), "TRITON_DEFAULT_FP_FUSION": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "tests.kernels.test_precision_compile"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "compiled 20 of 20 case groups" in run.stdout


if __name__ == "__main__":
    main()
