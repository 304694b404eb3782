"""Registers, spills and shared memory of the Triton kernels' launch configs, compiled offline for
sm_90 (H100/H200) — no GPU needed, so config ideas can be screened before device time is spent.

    PYTHONPATH=$PWD python benchmarks/kernel_resources.py [--out DIR] [--arch 90]

Compiles (Triton → PTX → ptxas, the ptxas Triton itself uses for that arch) every linear tiling in
``kernels.linear.configs.SWEEP`` (bf16, bias + GELU epilogue, with and without a residual) and
every linear-attention tiling of ``configs.HOPPER`` (bf16, each feature map), and reads
``ptxas -v``; and pass 1 of the two-pass forward at every ``TWO_PASS_HOPPER`` tiling, specialised
as launched (16-divisible pointers and strides), with how many of its loads the software
pipeline prefetches (``async_copies``) and how many stay synchronous, beside the transposed-k
experiment of ``linear_attention_pass_variants.py``, and the same for the prefix forward's loop
(every ``PREFIX_HOPPER`` launch). Registers per thread bound the programs an
SM can hold (65536 / (regs · threads));
spills mean local-memory traffic in the main loop. Not a timing: a compiler report, deterministic
for a Triton/ptxas version. Writes ``kernel_resources_sm<arch>.json`` into ``--out`` (default
benchmarks/results). Must run without TRITON_INTERPRET.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from kernels.linear import configs as linear_configs
from kernels.linear import triton as linear_kernels
from kernels.linear_attention import configs as la_configs
from kernels.linear_attention import triton as la_kernels

RESULTS = Path(__file__).resolve().parent / "results"


def _compile(
    fn, types: dict[str, str], const: dict, arch: int, num_warps: int, num_stages: int, specialize: bool = False
) -> dict:
    """``specialize``: pointers and ``stride_*`` arguments marked divisible by 16, as a launch with
    aligned tensors and strides specialises them (without it the loads cannot be vectorised or
    prefetched the way they run). The report then also counts the kernel's async copies (loads
    the software pipeline prefetches into shared memory) and the loads left synchronous."""
    if "PDL" in fn.arg_names:
        const = {**const, "PDL": 2 if arch >= 90 else 0}  # sm_90+: PDL, the wait and the early trigger
    attrs = None
    if specialize:
        aligned = [k for k, t in types.items() if t.startswith("*") or k.startswith("stride")]
        attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in aligned}
    src = ASTSource(
        fn,
        {**types, **dict.fromkeys(const, "constexpr")},
        {(fn.arg_names.index(k),): v for k, v in const.items()},
        attrs,
    )
    compiled = triton.compile(
        src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=num_warps, num_stages=num_stages)
    )
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(compiled.asm["ptx"])
        out = subprocess.run(
            [get_ptxas(arch).path, f"-arch=sm_{arch}a", "-v", str(ptx), "-o", str(ptx.with_suffix(".cubin"))],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores", out)
    report = {
        "registers": int(regs.group(1)) if regs else None,
        "spill_store_bytes": int(spills.group(1)) if spills else 0,
        "shared_bytes": compiled.metadata.shared,
        "threads": 32 * num_warps,
    }
    if specialize:
        ttgir = compiled.asm["ttgir"]
        report["async_copies"] = ttgir.count("ttg.async_copy_global_to_local")
        report["synchronous_loads"] = len(re.findall(r"= tt\.load ", ttgir))
    return report


def linear_rows(arch: int) -> list[dict]:
    rows = []
    for c in linear_configs.SWEEP:
        for residual in (False, True):
            const = dict(
                ACTIVATION="gelu",
                HAS_BIAS=True,
                HAS_RESIDUAL=residual,
                PRECISION="tf32",
                UPCAST=False,
                BLOCK_M=c.block_m,
                BLOCK_N=c.block_n,
                BLOCK_K=c.block_k,
                GROUP_M=c.group_m,
            )
            names = ["M", "N", "K", "stride_xm", "stride_wn", "stride_rm", "stride_ym", "M_BUCKET"]
            if c.tma:
                fn = linear_kernels._linear_tma_kernel
                const.update(FLATTEN=c.flatten, WARP_SPECIALIZE=c.warp_specialize, PERSISTENT=c.persistent)
            else:
                fn = linear_kernels._linear_kernel
                const.update(EVEN_K=True)
                names = [
                    "M",
                    "N",
                    "K",
                    "stride_xm",
                    "stride_xk",
                    "stride_wn",
                    "stride_wk",
                    "stride_rm",
                    "stride_ym",
                    "M_BUCKET",
                ]
            types = {**dict.fromkeys(("x", "w", "b", "r", "y"), "*bf16"), **dict.fromkeys(names, "i32")}
            row = {"kernel": "linear", "config": repr(c), "residual": residual}
            try:
                row.update(_compile(fn, types, const, arch, c.num_warps, c.num_stages))
            except Exception as err:  # noqa: BLE001 - a config that does not compile is a finding
                row["error"] = f"{type(err).__name__}: {err}"[:300]
            rows.append(row)
    return rows


def _la_const(head_dim: int, c, feature: str, **extra) -> dict:
    """A linear-attention launch's constexprs: ``c``'s chunk and value block at ``head_dim``."""
    return dict(
        HEAD_DIM=head_dim,
        BLOCK_V=min(c.block_v, head_dim),
        CHUNK=c.chunk,
        FEATURE=feature,
        NORMALIZE=feature != "identity",
        **extra,
    )


def linear_attention_rows(arch: int) -> list[dict]:
    rows = []
    names = [
        "stride_qb",
        "stride_qh",
        "stride_qt",
        "stride_kb",
        "stride_kh",
        "stride_kt",
        "stride_vb",
        "stride_vh",
        "stride_vt",
        "H",
        "T",
        "BH",
        "SPLIT",
    ]
    types = {
        **dict.fromkeys(("Q", "K", "V", "O"), "*bf16"),
        "S_OUT": "*fp32",
        "Z_OUT": "*fp32",
        **dict.fromkeys(names, "i32"),
        "q_scale": "fp32",
    }
    for head_dim, tilings in la_configs.HOPPER.items():
        for c in tilings:
            for feature in la_kernels.FEATURE_MAPS:
                const = _la_const(head_dim, c, feature, STORE_STATE=False)
                row = {"kernel": "linear_attention", "config": repr(c), "head_dim": head_dim, "feature_map": feature}
                try:
                    row.update(_compile(la_kernels._chunked_fwd_kernel, types, const, arch, c.num_warps, c.num_stages))
                except Exception as err:  # noqa: BLE001
                    row["error"] = f"{type(err).__name__}: {err}"[:300]
                rows.append(row)
    return rows


def two_pass_states_rows(arch: int, head_dims=None, stages_tried=None) -> list[dict]:
    """Pass 1 of the two-pass linear attention at every ``TWO_PASS_HOPPER`` tiling, at the
    plan's two pipeline depths (pass 2's, and TWO_PASS_DEEP_STAGES on sparse grids), each map,
    specialised as launched. Whether k is prefetched shows in ``async_copies`` /
    ``synchronous_loads``."""
    strides = ["stride_kb", "stride_kh", "stride_kt", "stride_vb", "stride_vh", "stride_vt"]
    rows = []
    for head_dim, tilings in la_configs.TWO_PASS_HOPPER.items():
        if head_dims is not None and head_dim not in head_dims:
            continue
        for c in tilings:
            bk, bv = min(c.block_k, head_dim), min(c.block_v, head_dim)
            warps = c.states_warps or c.num_warps
            # the plan's two depths (``two_pass_states_stages``) unless told
            for stages in stages_tried or sorted({c.num_stages, la_configs.TWO_PASS_DEEP_STAGES}):
                for feature in la_kernels.FEATURE_MAPS:
                    base = {"config": repr(c), "head_dim": head_dim, "num_stages": stages, "feature_map": feature}
                    scalars = dict.fromkeys([*strides, "H", "T", "NC"], "i32")
                    dims = dict(HEAD_DIM=head_dim, BLOCK_K=bk, BLOCK_V=bv, CHUNK=c.chunk)
                    fn = la_kernels._two_pass_states_kernel
                    ptrs = {"K": "*bf16", "V": "*bf16", "HS": "*bf16", "ZS": "*fp32", "TOTALS": "*fp32"}
                    types = {**ptrs, **scalars, "GROUP": "i32"}
                    normalize = feature != "identity"
                    row_len = head_dim * head_dim + (min(head_dim * head_dim, 256) if normalize else 0)
                    const = {**dims, "CARRY": True, "ROW": row_len, "FEATURE": feature, "NORMALIZE": normalize}
                    row = {"kernel": "two_pass_states", **base}
                    try:
                        row.update(_compile(fn, types, const, arch, warps, stages, specialize=True))
                    except Exception as err:  # noqa: BLE001
                        row["error"] = f"{type(err).__name__}: {err}"[:300]
                    rows.append(row)
    return rows


def prefix_rows(arch: int) -> list[dict]:
    """The prefix forward (pass 2's kernel with PREFIX: each program sums its chunk's state in a
    loop over the chunks before it) at every ``PREFIX_HOPPER`` launch, each map, specialised as
    launched: whether that loop prefetches k as well as v."""
    strides = [f"stride_{t}{d}" for t in "qkv" for d in "bht"]
    ptrs = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "HS": "*bf16", "ZS": "*fp32", "TOTALS": "*fp32", "O": "*bf16"}
    types = {**ptrs, **dict.fromkeys([*strides, "H", "T", "NC", "GROUP"], "i32"), "q_scale": "fp32"}
    rows = []
    for head_dim, launches in la_configs.PREFIX_HOPPER.items():
        for c in launches:
            for feature in la_kernels.FEATURE_MAPS:
                const = _la_const(head_dim, c, feature, CARRY=False, ROW=head_dim * head_dim, PREFIX=True)
                row = {"kernel": "prefix", "config": repr(c), "head_dim": head_dim, "feature_map": feature}
                row["num_stages"] = c.num_stages
                try:
                    row.update(
                        _compile(la_kernels._two_pass_out_kernel, types, const, arch, c.num_warps, c.num_stages, True)
                    )
                except Exception as err:  # noqa: BLE001
                    row["error"] = f"{type(err).__name__}: {err}"[:300]
                rows.append(row)
    return rows


def main(out_dir: str | Path = RESULTS, arch: int = 90) -> Path:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("benchmarks/kernel_resources.py compiles kernels: run it without TRITON_INTERPRET=1")
    rows = linear_rows(arch) + linear_attention_rows(arch) + two_pass_states_rows(arch) + prefix_rows(arch)
    for r in rows:
        what = r["config"] + (
            f" residual={r['residual']}" if "residual" in r else f" D={r['head_dim']} {r['feature_map']}"
        )
        if "async_copies" in r:
            what += f" s{r['num_stages']}: {r['async_copies']} async copies, {r['synchronous_loads']} sync loads"
        print(
            f"{r['kernel']:<17}{what:<110}"
            + (
                r["error"]
                if "error" in r
                else f"{r['registers']:>4} regs {r['spill_store_bytes']:>5} B spilled "
                f"{r['shared_bytes'] // 1024:>4} KB smem"
            )
        )
    import json
    import platform

    path = Path(out_dir) / f"kernel_resources_sm{arch}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "what": "offline compile report (no GPU): ptxas -v of each launch config",
                "arch": f"sm_{arch}a",
                "triton": triton.__version__,
                "ptxas": get_ptxas(arch).version if hasattr(get_ptxas(arch), "version") else None,
                "python": platform.python_version(),
                "results": rows,
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(RESULTS), help="folder for kernel_resources_sm<arch>.json")
    parser.add_argument("--arch", type=int, default=90, help="compute capability as an integer (90 = sm_90)")
    args = parser.parse_args()
    print(main(args.out, args.arch))
