"""What every optimizer here shares: the gradient pipeline (norm → clip → noise) run in ``step``.

``step`` gathers, per param group, the params that have a grad, their grads and states, and
hands them with one :class:`GradTransform` to ``_update_group``. There a group whose tensors
the fused kernel supports (fp32/bf16, contiguous, on CUDA) is updated by ``kernels/optim/triton``
in one launch, the clip scale and noise folded in; any other group loops over tensors and calls
``kernels.optim.reference``. The global grad norm follows suit: one fused sum-of-squares pass when
every grad is fused-capable. The constructors' ``fused`` picks the path: None (default) fuses
CUDA groups unless the environment sets ``NAS_OPTIM_FUSED=0`` (A/B runs); False never fuses;
True demands the kernel for every group, which on CPU runs only under ``TRITON_INTERPRET=1``.

Noise on the fused path is drawn in-kernel from Philox keyed by (seed, step, group), not from the
``torch.Generator`` the reference path uses: same distribution, different draws; resuming from a
state dict is exact on both paths.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from types import ModuleType
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from kernels.optim.reference import clip_scale, compute_dtype, effective_grad, global_grad_norm, grad_noise_std
from nas import settings

__all__ = ["GradOptions", "GradTransform", "OptimizerBase"]

_EXTRA_KEY = "nas_optim"  # state_dict entry holding the noise step and generator states
FUSED_ENV = "NAS_OPTIM_FUSED"  # "0": every optimizer takes the reference path (A/B tests)


def fused_kernels() -> ModuleType:
    """``kernels.optim.triton``, imported on first use: importing it decorates the kernels, which
    must come after a test sets TRITON_INTERPRET, and a CPU-only run never needs it."""
    from kernels.optim import triton as fused  # noqa: PLC0415

    return fused


def noise_seed(seed: int, step: int, group: int) -> int:
    """The fused path's Philox key for one step and param group: a hash, below 2**31 (int32)."""
    digest = hashlib.blake2b(f"{seed}:{step}:{group}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def check(cond: bool, msg: str) -> None:
    """Raise ``ValueError(msg)`` unless ``cond`` (a user mistake in a hyperparameter)."""
    if not cond:
        raise ValueError(msg)


def check_betas(betas: tuple[float, float]) -> None:
    for i, beta in enumerate(betas):
        check(0.0 <= beta < 1.0, f"betas[{i}] must be in [0, 1), got {beta}")


@dataclass(frozen=True)
class GradOptions:
    """What ``step`` does to the raw gradients before the update.

    max_norm: clip the global L2 norm over all params of all groups to this (0 = off).
    noise: η of annealed Gaussian gradient noise, variance η / (1 + t)^noise_gamma, where t is
        the number of earlier ``step`` calls (0 on the first), Neelakantan et al. 2015 (0 = off).
    seed: seeds the noise generator (one ``torch.Generator`` per device).
    """

    max_norm: float = 0.0
    noise: float = 0.0
    noise_gamma: float = 0.55
    seed: int = 0

    def __post_init__(self) -> None:
        check(self.max_norm >= 0, f"max_norm must be >= 0 (0 = off), got {self.max_norm}")
        check(self.noise >= 0, f"noise must be >= 0 (0 = off), got {self.noise}")
        check(self.noise_gamma >= 0, f"noise_gamma must be >= 0, got {self.noise_gamma}")


@dataclass(frozen=True)
class GradTransform:
    """This step's ``g ← g·scale + noise_std·z`` for one group.

    scale: 0-dim clip scale, None when clipping is off. fused: the group runs through the fused
    kernel, whose noise comes from Philox key ``seed``; otherwise ``generator`` draws z (None
    iff no noise).
    """

    scale: Tensor | None
    noise_std: float
    generator: torch.Generator | None
    fused: bool = False
    seed: int = 0
    row: Tensor | None = None  # rows in memory: the launch's step row (its values come from there)

    def kernel_args(self) -> dict[str, Any]:
        """The gradient pipeline as the fused kernels' keyword arguments."""
        # checked: the optimizer verified every tensor with ``supports`` this step (``_runs_fused``)
        args = {"clip_scale": self.scale, "noise_std": self.noise_std, "seed": self.seed, "checked": True}
        return args if self.row is None else {**args, "row": self.row}

    def apply(self, grad: Tensor) -> Tensor:
        """The grad to feed the update, in the compute dtype; ``grad`` itself is left untouched."""
        return effective_grad(grad, scale=self.scale, noise_std=self.noise_std, generator=self.generator)


class _StepRows:
    """The device buffer of a rows-in-memory step's rows, refilled by ``write`` each step. On a
    GPU the rows go through a ring of pinned host slots, each reused only after its copy has
    landed, so the host never waits for the device unless it is a whole ring ahead."""

    SLOTS = 64

    def __init__(self) -> None:
        self.device_rows: Tensor | None = None
        self.noise_std = 0.0
        self.ready = False
        self._ring: Tensor | None = None
        self._events: list[torch.cuda.Event | None] = []
        self._next = 0

    def write(self, rows: list[list[int]], device: torch.device) -> None:
        host = torch.tensor(rows, dtype=torch.int32).reshape(len(rows), -1)
        if self.device_rows is None:
            self.device_rows = torch.zeros(host.shape, dtype=torch.int32, device=device)
            if device.type == "cuda":
                self._ring = torch.zeros((self.SLOTS, *host.shape), dtype=torch.int32).pin_memory()
                self._events = [None] * self.SLOTS
        check(host.shape == self.device_rows.shape, "the launches of a step changed since the first step")
        if self._ring is None:
            self.device_rows.copy_(host)
        else:
            slot = self._next % self.SLOTS
            if self._events[slot] is not None:
                self._events[slot].synchronize()  # its copy has landed
            self._ring[slot].copy_(host)
            self.device_rows.copy_(self._ring[slot], non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._events[slot] = event
            self._next += 1
        self.ready = True


def _undecorated(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` without the wrapper ``functools.wraps`` recorded (``__wrapped__``), if any."""
    return getattr(method, "__wrapped__", method)


class OptimizerBase(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` whose ``step`` clips and perturbs gradients before updating.

    Gradients (``p.grad``) are never modified. After each ``step``, ``last_grad_norm`` holds the
    global L2 norm of the raw gradients as a 0-dim tensor (no host sync), so a trainer can test
    it for NaN/inf whenever it likes. A non-finite norm means this step's update (and with
    clipping on, every param's update) was non-finite: the trainer should stop or restore.
    """

    def __init__(
        self, params: ParamsT, defaults: dict[str, Any], grad_options: GradOptions, fused: bool | None = None
    ) -> None:
        check(defaults["lr"] >= 0, f"lr must be >= 0, got {defaults['lr']}")
        check(defaults["weight_decay"] >= 0, f"weight_decay must be >= 0, got {defaults['weight_decay']}")
        check(fused in (None, True, False), f"fused must be None (auto), True or False, got {fused!r}")
        super().__init__(params, defaults)
        self.grad_options = grad_options
        self.fused = fused
        self.last_grad_norm: Tensor | None = None
        self._noise_t = 0  # step() calls so far: the t of the noise schedule on the next call
        self._generators: dict[str, torch.Generator] = {}
        self.lr_multipliers: tuple[float, ...] | None = None  # a population's per-variant lr factors
        self._variant_states: list[dict[int, dict[str, Any]]] = []  # a population's state, per variant
        self._rows: _StepRows | None = None  # set by ``rows_in_memory``

    def population(self, lr_multipliers: Sequence[float]) -> OptimizerBase:
        """Step a population: every param is ``[P, *]``, P variants of one model stacked, and
        variant i trains at ``lr · lr_multipliers[i]``, clipped by its own gradient norm
        (``last_grad_norm`` becomes ``[P]``). Weight decay, betas and the schedule are shared.
        Each variant is stepped as the optimizer steps one model, on its rows of the params
        (views) with its own state: one fused launch per variant and group where the kernel
        takes them (``fused`` as for one model), else the reference math."""
        multipliers = tuple(float(m) for m in lr_multipliers)
        check(bool(multipliers) and all(m > 0 for m in multipliers), "lr_multipliers must be positive")
        for group in self.param_groups:
            for p in group["params"]:
                check(
                    p.dim() >= 1 and p.shape[0] == len(multipliers),
                    f"a population of {len(multipliers)} needs every param's leading dim to be "
                    f"{len(multipliers)}, got shape {tuple(p.shape)}",
                )
        self.lr_multipliers = multipliers
        self._variant_states = [{} for _ in multipliers]
        return self

    def rows_in_memory(self) -> OptimizerBase:
        """Make every step capturable in a CUDA graph: a step becomes ``prepare`` (host: the
        step's values — lr, bias corrections, noise σ and seed — written to a device buffer, state
        counters advanced) then ``launch`` (device only: gradient norm, clip scale and the fused
        launches, which read their values from that buffer). Capture ``launch`` once and, per
        step, call ``prepare`` and replay: the graph's launches keep their captured arguments, the
        buffer brings this step's values. ``step`` does both, so eager steps give the same
        numbers. Every group must take the fused path (CUDA, or the interpreter)."""
        self._rows = _StepRows()
        return self

    def prepare(self) -> None:
        """The host half of a step in rows-in-memory mode (see ``rows_in_memory``)."""
        check(self._rows is not None, "prepare() needs rows_in_memory() first")
        noise_std = grad_noise_std(self.grad_options.noise, self.grad_options.noise_gamma, self._noise_t)
        launches = self._launches()
        check(bool(launches), "prepare() needs gradients: call it after the first backward")
        # the first step settles the path and creates the states (from each variant's views);
        # later steps, one per graph replay, skip both: they are host time on every step
        first = not self._rows.ready
        if first:
            fused = self.rows_fused()
            check(fused, f"{type(self).__name__}: rows in memory need the fused kernel for every param group")
        rows = []
        for variant, index, group, params in launches:
            views = [p[variant] for p in params] if first and variant is not None else params
            key = index if variant is None else index * len(self.lr_multipliers) + variant
            multiplier = 1.0 if variant is None else self.lr_multipliers[variant]
            seed = noise_seed(self.grad_options.seed, self._noise_t, key)
            group_lr = {**group, "lr": group["lr"] * multiplier}
            rows.append(self._row(group_lr, views, self._states_of(params, variant), noise_std, seed))
        self._rows.write(rows, launches[0][3][0].device)
        self._rows.noise_std = noise_std
        self._noise_t += 1

    def launch(self) -> None:
        """The device half of a step in rows-in-memory mode: capturable (no host sync, no
        allocation outside the caching allocator, no host-to-device copy)."""
        check(self._rows is not None and self._rows.ready, "launch() needs prepare() first")
        launches = self._launches()
        grads = [p.grad for variant, _, _, params in launches if variant in (None, 0) for p in params]  # each once
        if self.lr_multipliers is None:
            self.last_grad_norm = fused_kernels().grad_norm(grads, checked=True)
        else:
            self.last_grad_norm = self._population_norm(grads)
        opts = self.grad_options
        scale = clip_scale(self.last_grad_norm, opts.max_norm) if opts.max_norm > 0 else None
        for row, (variant, _, group, params) in enumerate(launches):
            transform = GradTransform(
                None if scale is None else (scale if variant is None else scale[variant]),
                self._rows.noise_std,
                None,
                fused=True,
                row=self._rows.device_rows[row],
            )
            views = params if variant is None else [p[variant] for p in params]
            view_grads = [p.grad if variant is None else p.grad[variant] for p in params]
            self._update_group(group, views, view_grads, self._states_of(params, variant), transform)

    def rows_fused(self) -> bool:
        """Whether every launch of a step (params with a grad) takes the fused kernel: what
        ``rows_in_memory`` needs."""
        for variant, _, _, params in self._launches():
            if variant is None and not self._runs_fused(params):
                return False
            if variant is not None and not self._views_fused(
                [p[variant] for p in params], [p.grad[variant] for p in params]
            ):
                return False
        return True

    def _launches(self) -> list[tuple[int | None, int, dict[str, Any], list[Tensor]]]:
        """(variant or None, group index, group, its params with a grad) per launch of a step, in
        the order of its rows: variant-major for a population."""
        work = [(i, g, [p for p in g["params"] if p.grad is not None]) for i, g in enumerate(self.param_groups)]
        work = [(i, g, params) for i, g, params in work if params]
        if self.lr_multipliers is None:
            return [(None, i, g, params) for i, g, params in work]
        return [(v, i, g, params) for v in range(len(self.lr_multipliers)) for i, g, params in work]

    def _states_of(self, params: list[Tensor], variant: int | None) -> list[dict[str, Any]]:
        if variant is None:
            return [self.state[p] for p in params]
        return [self._variant_states[variant].setdefault(id(p), {}) for p in params]

    def _row(
        self, group: dict[str, Any], params: list[Tensor], states: list[dict[str, Any]], noise_std: float, seed: int
    ) -> list[int]:
        """One launch's step row (``kernels.optim.triton.step_row``) for this step; creates the
        state tensors on the first step (the only use of ``params``, shaped like the states) and
        advances the state's step counters (the launch of a rows-in-memory step does neither)."""
        raise NotImplementedError

    def _population_norm(self, grads: list[Tensor]) -> Tensor:
        dtype = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
        per_param = [torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1, dtype=dtype) for g in grads]
        return torch.linalg.vector_norm(torch.stack(per_param), dim=0)  # [P]

    def _views_fused(self, views: Sequence[Tensor], grads: Sequence[Tensor]) -> bool:
        """``_runs_fused`` for one variant's rows (views carry no ``.grad`` of their own)."""
        if self.fused is False or (self.fused is None and settings.get().optim_fused is False):
            return False
        if self.fused is None and not all(v.is_cuda for v in views):
            return False
        supported = all(fused_kernels().supports(v, g) for v, g in zip(views, grads, strict=True))
        check(
            supported or self.fused is not True,
            f"{type(self).__name__}(fused=True): a variant's rows are not supported",
        )
        return supported

    def _step_population(self, work: list[tuple[dict[str, Any], list[Tensor]]], noise_std: float) -> None:
        """One step of each variant: its rows of every param, grad and state, its own lr and clip."""
        self.last_grad_norm = self._population_norm([p.grad for _, params in work for p in params])
        opts = self.grad_options
        scale = clip_scale(self.last_grad_norm, opts.max_norm) if opts.max_norm > 0 else None
        for i, multiplier in enumerate(self.lr_multipliers):
            states = self._variant_states[i]
            for index, (group, params) in enumerate(work):
                if not params:
                    continue
                views, view_grads = [p[i] for p in params], [p.grad[i] for p in params]
                variant_scale = None if scale is None else scale[i]
                if self._views_fused(views, view_grads):
                    key = index * len(self.lr_multipliers) + i  # each variant and group its own noise
                    transform = GradTransform(
                        variant_scale, noise_std, None, fused=True, seed=noise_seed(opts.seed, self._noise_t, key)
                    )
                else:
                    generator = self._generator(params[0].device) if noise_std > 0 else None
                    transform = GradTransform(variant_scale, noise_std, generator)
                self._update_group(
                    {**group, "lr": group["lr"] * multiplier},
                    views,
                    view_grads,
                    [states.setdefault(id(p), {}) for p in params],
                    transform,
                )

    def _update_group(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        states: list[dict[str, Any]],
        transform: GradTransform,
    ) -> None:
        """Update one group's ``params`` (those with a grad, on one device) in place; ``grads`` and
        ``states`` align.

        Everything the update needs arrives here at once (hyperparameters in ``group``, clip
        scale, noise and the path to take in ``transform``): with ``transform.fused`` one kernel
        launch updates the whole group, otherwise a loop over the reference math.
        """
        raise NotImplementedError

    def _runs_fused(self, params: Sequence[Tensor]) -> bool:
        """Whether these params (each with a grad) go through the fused kernel on this step."""
        if self.fused is False or (self.fused is None and settings.get().optim_fused is False):
            return False
        if self.fused is None and not all(p.is_cuda for p in params):
            return False
        supports = fused_kernels().supports
        unsupported = [p for p in params if not supports(p, p.grad)]
        if self.fused is True and unsupported:
            p = unsupported[0]
            raise ValueError(
                f"{type(self).__name__}(fused=True): a {p.dtype} param of shape {tuple(p.shape)} on {p.device} is not "
                "supported by the fused kernel (fp32/bf16, contiguous, grad of the same dtype, on CUDA or under "
                "TRITON_INTERPRET=1); use fused=None to fall back to the reference path"
            )
        return not unsupported

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._rows is not None:
            self.prepare()
            self.launch()
            return loss
        work = [(group, [p for p in group["params"] if p.grad is not None]) for group in self.param_groups]
        grads = [p.grad for _, params in work for p in params]
        check(not any(g.is_sparse for g in grads), f"{type(self).__name__} does not support sparse gradients")
        if self.lr_multipliers is not None and grads:
            self._step_population(
                work, grad_noise_std(self.grad_options.noise, self.grad_options.noise_gamma, self._noise_t)
            )
            self._noise_t += 1
            return loss
        fused = [bool(params) and self._runs_fused(params) for _, params in work]
        all_fused = all(f for f, (_, params) in zip(fused, work, strict=True) if params) and bool(grads)
        self.last_grad_norm = fused_kernels().grad_norm(grads, checked=True) if all_fused else global_grad_norm(grads)
        opts = self.grad_options
        scale = clip_scale(self.last_grad_norm, opts.max_norm) if opts.max_norm > 0 else None
        noise_std = grad_noise_std(opts.noise, opts.noise_gamma, self._noise_t)
        for index, ((group, params), group_fused) in enumerate(zip(work, fused, strict=True)):
            if not params:
                continue
            if group_fused:
                transform = GradTransform(
                    scale, noise_std, None, fused=True, seed=noise_seed(opts.seed, self._noise_t, index)
                )
            else:
                generator = self._generator(params[0].device) if noise_std > 0 else None
                transform = GradTransform(scale, noise_std, generator)
            group_grads = [p.grad for p in params]
            self._update_group(group, params, group_grads, [self.state[p] for p in params], transform)
        self._noise_t += 1
        return loss

    def _generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed(self.grad_options.seed)
        return self._generators[key]

    # torch wraps these two in torch._disable_dynamo, whose first call imports torch._dynamo, a large
    # share of a training process's start, for a guard that matters only while dynamo traces the
    # optimizer, which nothing here does (NAS_TRAIN_COMPILE compiles the model's forward alone). So
    # the methods themselves run; torch versions without the wrapper give the method unchanged.
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _undecorated(torch.optim.Optimizer.add_param_group)(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _undecorated(torch.optim.Optimizer.zero_grad)(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict plus the noise step and generator states, so a resume is exact."""
        state = super().state_dict()
        generators = {key: gen.get_state() for key, gen in self._generators.items()}
        state[_EXTRA_KEY] = {"noise_t": self._noise_t, "generators": generators}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        extra = state_dict.pop(_EXTRA_KEY, None)
        check(extra is not None, f"state_dict has no {_EXTRA_KEY!r} entry: not saved by a nas.optim optimizer")
        super().load_state_dict(state_dict)
        self._restore_state_dtypes(state_dict)
        self._noise_t = int(extra["noise_t"])
        self._generators = {}
        for key, gen_state in extra["generators"].items():
            self._generators[key] = torch.Generator(device=key)
            self._generators[key].set_state(gen_state)

    def _restore_state_dtypes(self, state_dict: dict[str, Any]) -> None:
        """torch casts loaded state to the param dtype; ours lives in the compute dtype (fp32 for
        bf16 params), so recast from the saved tensors before any precision is lost."""
        saved_ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        for pid, p in zip(saved_ids, params, strict=True):
            if p.dtype == compute_dtype(p):
                continue
            for key, value in state_dict["state"].get(pid, {}).items():
                if isinstance(value, Tensor) and value.is_floating_point():
                    self.state[p][key] = value.to(device=p.device, dtype=compute_dtype(p))
