"""Optimizer-step benchmark: the fused Triton steps (kernels/optim/triton.py) vs torch.optim.

    PYTHONPATH=$PWD python benchmarks/optimizers.py [--params 25000000] [--tensors 50] [--sweep] [--out DIR]
        [--profile FILE]

One step over ``--params`` fp32 params split into ``--tensors`` tensors of uneven, odd sizes,
with random non-zero params, grads and state. Every implementation is first checked against a
reference step on the same inputs; then each is timed in the same run:

- device time per step, from CUDA events between back-to-back steps queued behind a long
  ``torch.cuda._sleep`` (so launch gaps, not host speed, separate the steps): median and IQR
  over ``--reps`` × ``--rounds`` steps after warm-up. Not graph replay (``_timing.time_graph``):
  torch's optimizers refuse capture unless ``capturable`` (other kernels), and every step here
  changes host-side scalars. ``host_bound`` flags a round whose enqueueing outlasted the sleep
  (its samples then include host time); ``host_us`` is the CPU time to enqueue one step.
- ``eager_us``: wall-clock per step of a plain Python loop (host overhead included).

``adamw-fp32+clip`` is a whole training-default step (grad_clip 1.0): ``nas.optim.AdamW`` with
``max_norm=1`` (fused grad norm, clip scale, fused update) vs ``clip_grad_norm_`` + fused AdamW.

Bandwidth counts the fewest bytes a step must move (each input read once, each output written
once; ``bytes/elem`` column) and is compared with a device-to-device copy timed in the same run.
Writes ``optimizers_<gpu>.json`` into ``--out`` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks._timing import RESULTS, Timing, device_slug, environment
from kernels.optim import triton as fused
from kernels.optim.configs import NORM_SWEEP, SWEEP, StepConfig, norm_config, step_config
from nas.optim import AdamW, GradOptions

_SLEEP_CYCLES = 500_000_000  # ~0.25 s at H200 clocks: longer than enqueueing a round of steps
_TARGETS = {("adamw-fp32", "torch-fused"): 1.5, ("lion-fp32", "torch-foreach"): 1.5}
_CLIP = 1.0


@dataclass(frozen=True)
class Measured:
    device: Timing  # per step, from CUDA events
    host_us: float  # CPU time to enqueue one step (median over rounds)
    eager_us: float  # wall clock per step of a plain loop
    host_bound: bool


@dataclass(frozen=True)
class Row:
    case: str
    impl: str
    bytes_per_elem: int
    timing: Measured
    tbps: float
    copy_fraction: float
    validated_max_rel_err: float | None  # ours vs a torch step on the same inputs (fp32 cases)


def _sizes(total: int, count: int) -> list[int]:
    """``count`` uneven sizes summing to ``total``; all odd but the last, which takes the rest."""
    weights = [1 + (i * 7) % 11 for i in range(count)]
    sizes = [max(1, total * w // sum(weights)) | 1 for w in weights]
    sizes[-1] += total - sum(sizes)
    return sizes


def _randn(sizes: list[int], dtype: torch.dtype, scale: float = 1.0) -> list[torch.Tensor]:
    return [(torch.randn(n, device="cuda") * scale).to(dtype) for n in sizes]


def _time(step: Callable[[], None], reps: int, rounds: int, warmup: int = 10) -> Measured:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    samples, host_bound, host_us = [], False, []
    for _ in range(rounds):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 2)]
        events[0].record()
        torch.cuda._sleep(_SLEEP_CYCLES)
        events[1].record()
        start = time.perf_counter()
        for i in range(reps):
            step()
            events[i + 2].record()
        enqueue_ms = (time.perf_counter() - start) * 1e3
        host_us.append(enqueue_ms / reps * 1e3)
        torch.cuda.synchronize()
        host_bound |= enqueue_ms > events[0].elapsed_time(events[1])
        samples += [events[i + 1].elapsed_time(events[i + 2]) * 1e3 for i in range(reps)]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        step()
    torch.cuda.synchronize()
    eager_us = (time.perf_counter() - start) / reps * 1e6
    q1, median, q3 = statistics.quantiles(samples, n=4)
    return Measured(Timing(median, q1, q3, q3 - q1, len(samples)), statistics.median(host_us), eager_us, host_bound)


def _copy_tbps(nbytes: int, reps: int) -> tuple[float, Measured]:
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    timing = _time(lambda: dst.copy_(src), reps=reps, rounds=1)
    return 2 * nbytes / (timing.device.median_us * 1e-6) / 1e12, timing  # read + write


def _max_rel_err(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    num = max((a.float() - e.float()).abs().max().item() for a, e in zip(actual, expected, strict=True))
    den = max(e.float().abs().max().item() for e in expected)
    return num / den


# ---------------------------------------------------------------------------------------------
# Peers
# ---------------------------------------------------------------------------------------------


def _lion_foreach(params, grads, exp_avgs, *, lr: float, beta1: float, beta2: float, weight_decay: float) -> None:
    """Lion with torch._foreach ops (as lion-pytorch's foreach path): 5 multi-tensor passes."""
    torch._foreach_mul_(params, 1 - lr * weight_decay)
    update = torch._foreach_lerp(exp_avgs, grads, 1 - beta1)
    torch._foreach_sign_(update)
    torch._foreach_add_(params, update, alpha=-lr)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta2)


def _torch_step(opt_cls: type, params: list[torch.Tensor], grads: list[torch.Tensor], **kw) -> Callable[[], None]:
    leaves = [torch.nn.Parameter(p, requires_grad=True) for p in params]  # shares storage with params
    for leaf, g in zip(leaves, grads, strict=True):
        leaf.grad = g
    opt = opt_cls(leaves, **kw)
    return opt.step


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------


@dataclass
class Problem:
    params: list[torch.Tensor]
    grads: list[torch.Tensor]
    states: list[list[torch.Tensor]]

    def clone(self) -> Problem:
        return Problem(
            [p.clone() for p in self.params],
            [g.clone() for g in self.grads],
            [[s.clone() for s in column] for column in self.states],
        )


def _problem(sizes: list[int], dtype: torch.dtype, n_state: int) -> Problem:
    states = [_randn(sizes, torch.float32, 1e-3)]
    if n_state == 2:
        states.append([torch.rand(n, device="cuda") * 1e-6 for n in sizes])  # exp_avg_sq ≥ 0
    return Problem(_randn(sizes, dtype), _randn(sizes, dtype, 1e-2), states[:n_state])


class _Counter:
    """Steps 1, 2, 3, …: the bias corrections change every call, as in training."""

    def __init__(self, n: int) -> None:
        self.n, self.t = n, 0

    def __call__(self) -> list[int]:
        self.t += 1
        return [self.t] * self.n


_ADAM = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
_TORCH_ADAM = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
_LION = dict(lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.1)
_SGD = dict(lr=1e-3, momentum=0.9, nesterov=False, weight_decay=0.0)


def _ours(case: str, prob: Problem, config: StepConfig | None = None) -> Callable[[], None]:
    ps, gs, ss = prob.params, prob.grads, prob.states
    if case.startswith("adamw") or case.startswith("radam"):
        fn, steps = (fused.adamw_step_ if case.startswith("adamw") else fused.radam_step_), _Counter(len(ps))
        return lambda: fn(ps, gs, ss[0], ss[1], steps(), config=config, **_ADAM)
    if case.startswith("lion"):
        return lambda: fused.lion_step_(ps, gs, ss[0], config=config, **_LION)
    return lambda: fused.sgd_step_(ps, gs, ss[0], decoupled_weight_decay=False, config=config, **_SGD)


def _peers(case: str, prob: Problem) -> dict[str, Callable[[], None]]:
    ps, gs, ss = prob.params, prob.grads, prob.states
    if case.startswith("adamw"):
        return {
            "torch-fused": _torch_step(torch.optim.AdamW, ps, gs, fused=True, **_TORCH_ADAM),
            "torch-foreach": _torch_step(torch.optim.AdamW, ps, gs, foreach=True, **_TORCH_ADAM),
        }
    if case.startswith("radam"):
        return {
            "torch-foreach": _torch_step(
                torch.optim.RAdam, ps, gs, foreach=True, decoupled_weight_decay=True, **_TORCH_ADAM
            )
        }
    if case.startswith("lion"):
        return {"torch-foreach": lambda: _lion_foreach(ps, gs, ss[0], **_LION)}
    sgd = dict(lr=_SGD["lr"], momentum=_SGD["momentum"])
    return {
        "torch-fused": _torch_step(torch.optim.SGD, ps, gs, fused=True, **sgd),
        "torch-foreach": _torch_step(torch.optim.SGD, ps, gs, foreach=True, **sgd),
    }


def _validate(case: str, prob: Problem) -> float:
    """One step of ours vs torch (its foreach path; Lion: the foreach peer) on copies of the
    first few tensors, with fresh state (torch's optimizers start from zero state)."""
    small = Problem(prob.params[:3], prob.grads[:3], [column[:3] for column in prob.states]).clone()
    for column in small.states:
        for s in column:
            s.zero_()
    expected = small.clone()
    if case.startswith("lion"):
        _lion_foreach(expected.params, expected.grads, expected.states[0], **_LION)
    else:
        _peers(case, expected)["torch-foreach"]()  # torch's first SGD step clones g: our zero buffer's 0.9·0 + g
    _ours(case, small)()
    return _max_rel_err(small.params, expected.params)


_CASES = {  # case: (param dtype, state tensors, bytes per element)
    "adamw-fp32": (torch.float32, 2, 28),
    "adamw-bf16": (torch.bfloat16, 2, 22),
    "radam-fp32": (torch.float32, 2, 28),
    "lion-fp32": (torch.float32, 1, 20),
    "sgd-momentum-fp32": (torch.float32, 1, 20),
}


def _row(
    case: str, impl: str, bytes_per_elem: int, n: int, timing: Measured, copy_tbps: float, err: float | None = None
) -> Row:
    tbps = bytes_per_elem * n / (timing.device.median_us * 1e-6) / 1e12
    return Row(case, impl, bytes_per_elem, timing, tbps, tbps / copy_tbps, err)


def _sweep_entry(case: str, config: StepConfig, timing: Measured, nbytes: int, copy_tbps: float) -> dict:
    tbps = nbytes / (timing.device.median_us * 1e-6) / 1e12
    return {"case": case, "config": asdict(config), "timing": asdict(timing), "copy_fraction": tbps / copy_tbps}


def _whole_step_rows(
    prob: Problem, n: int, copy_tbps: float, reps: int, rounds: int, profile: Path | None
) -> list[Row]:
    """The training-default step (grad_clip 1.0): nas.optim.AdamW vs clip_grad_norm_ + fused AdamW.
    Both read g once more for the norm: 32 B per element."""
    opt = AdamW([torch.nn.Parameter(p) for p in prob.params], grad_options=GradOptions(max_norm=_CLIP), **_TORCH_ADAM)
    for leaf, g in zip(opt.param_groups[0]["params"], prob.grads, strict=True):
        leaf.grad = g
    leaves = [torch.nn.Parameter(p) for p in prob.params]
    for leaf, g in zip(leaves, prob.grads, strict=True):
        leaf.grad = g
    peer = torch.optim.AdamW(leaves, fused=True, **_TORCH_ADAM)

    def torch_step() -> None:
        torch.nn.utils.clip_grad_norm_(leaves, _CLIP, foreach=True)
        peer.step()

    # clip_grad_norm_ scales the grads in place: give it its own copies so ours sees the originals.
    for leaf in leaves:
        leaf.grad = leaf.grad.clone()
    rows = [
        _row("adamw-fp32+clip", "ours: nas.optim.AdamW.step", 32, n, _time(opt.step, reps, rounds), copy_tbps),
        _row("adamw-fp32+clip", "torch-fused + clip_grad_norm_", 32, n, _time(torch_step, reps, rounds), copy_tbps),
    ]
    if profile is not None:
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [opt.step() for _ in range(50)])
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
        profile.write_text(text.getvalue())
    return rows


def _kernel_facts() -> list[dict]:
    """What the compiler made of each fused-step variant: registers, spills, 16-B vector loads."""
    facts = []
    for kernel in fused._step_kernel.device_caches[torch.cuda.current_device()][0].values():
        ptx = kernel.asm.get("ptx", "")
        facts.append(
            {
                "name": kernel.name,
                "n_regs": getattr(kernel, "n_regs", None),
                "n_spills": getattr(kernel, "n_spills", None),
                "ld_global_v4": len(re.findall(r"ld\.global(?:\.\w+)*\.v4", ptx)),
                "ld_global_all": len(re.findall(r"ld\.global", ptx)),
            }
        )
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=int, default=25_000_000)
    parser.add_argument("--tensors", type=int, default=50)
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sweep", action="store_true", help="also time every StepConfig in configs.SWEEP (AdamW)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--profile", type=Path, help="write a cProfile summary of nas.optim.AdamW.step here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/optimizers.py needs a CUDA device")
    torch.manual_seed(0)
    sizes = _sizes(args.params, args.tensors)
    n = sum(sizes)
    copy_tbps, copy_timing = _copy_tbps(1 << 30, reps=50)
    rows: list[Row] = []
    sweep: list[dict] = []
    for case, (dtype, n_state, nbytes) in _CASES.items():
        prob = _problem(sizes, dtype, n_state)
        err = _validate(case, prob) if dtype == torch.float32 else None
        rows.append(_row(case, "ours", nbytes, n, _time(_ours(case, prob), args.reps, args.rounds), copy_tbps, err))
        if dtype == torch.float32:
            for impl, step in _peers(case, prob).items():
                rows.append(_row(case, impl, nbytes, n, _time(step, args.reps, args.rounds), copy_tbps))
        if case == "adamw-fp32":
            rows += _whole_step_rows(prob, n, copy_tbps, args.reps, args.rounds, args.profile)
            if args.sweep:
                for config in SWEEP:
                    timing = _time(_ours(case, prob, config), args.reps, 1)
                    sweep.append(_sweep_entry("adamw-fp32", config, timing, nbytes * n, copy_tbps))
        del prob
        torch.cuda.empty_cache()
    grads = _randn(sizes, torch.float32)
    rows.append(
        _row("grad-norm-fp32", "ours", 4, n, _time(lambda: fused.grad_norm(grads), args.reps, args.rounds), copy_tbps)
    )
    rows.append(
        _row(
            "grad-norm-fp32",
            "torch-foreach",
            4,
            n,
            _time(lambda: torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2))), args.reps, args.rounds),
            copy_tbps,
        )
    )
    if args.sweep:
        for config in NORM_SWEEP:
            timing = _time(lambda c=config: fused.grad_norm(grads, c), args.reps, 1)
            sweep.append(_sweep_entry("grad-norm-fp32", config, timing, 4 * n, copy_tbps))

    ours = {r.case: r.timing.device.median_us for r in rows if r.impl.startswith("ours")}
    speedups = {
        f"{r.case} vs {r.impl}": r.timing.device.median_us / ours[r.case] for r in rows if r.impl.startswith("torch")
    }
    targets = {}
    for (case, impl), target in _TARGETS.items():
        speedup = speedups[f"{case} vs {impl}"]
        targets[f"{case} vs {impl}"] = {"target": target, "speedup": speedup, "met": speedup >= target}
    env, device = environment(), torch.device("cuda")
    result = {
        **env,
        "benchmark": "optimizers",
        "capability": list(torch.cuda.get_device_capability()),
        "params": n,
        "tensors": len(sizes),
        "config": {"step": asdict(step_config(device)), "norm": asdict(norm_config(device))},
        "copy": {"bytes": 2 << 30, "tbps": copy_tbps, "timing": asdict(copy_timing)},
        "rows": [asdict(r) for r in rows],
        "speedups": speedups,
        "targets": targets,
        "sweep": sweep,
        "kernels": _kernel_facts(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"optimizers_{device_slug(env['gpu'])}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")

    print(
        f"{env['gpu']}  torch {env['torch']}  triton {env['triton']}  {n / 1e6:.1f}M params in {len(sizes)} "
        f"tensors  copy {copy_tbps:.2f} TB/s"
    )
    if sweep:
        print("\nsweep (ours)     block  warps  median µs   IQR µs   copy fraction")
        for s in sweep:
            c = s["config"]
            d = s["timing"]["device"]
            print(
                f"  {s['case']:<15} {c['block']:>5} {c['num_warps']:>6} {d['median_us']:10.1f} "
                f"{d['iqr_us']:8.1f}   {s['copy_fraction']:.2f}"
            )
    print(
        f"\n{'case':<18} {'impl':<34} {'B/el':>4} {'median µs':>10} {'IQR µs':>7} {'host µs':>8} {'eager µs':>9} "
        f"{'TB/s':>6} {'of copy':>7} {'speedup':>8}"
    )
    for r in rows:
        t, d = r.timing, r.timing.device
        speedup = f"{d.median_us / ours[r.case]:.2f}x" if r.impl.startswith("torch") else ""
        flag = " host-bound" if t.host_bound else ""
        print(
            f"{r.case:<18} {r.impl:<34} {r.bytes_per_elem:>4} {d.median_us:10.1f} {d.iqr_us:7.1f} {t.host_us:8.1f} "
            f"{t.eager_us:9.1f} {r.tbps:6.2f} {r.copy_fraction:7.2f} {speedup:>8}{flag}"
        )
    for name, t in targets.items():
        print(f"target {name}: ≥{t['target']}x → {t['speedup']:.2f}x {'met' if t['met'] else 'NOT met'}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
