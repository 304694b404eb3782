"""Proxy fidelity: how well the search's short-run accuracy ranks a study's architectures.

The search scores each candidate after a short training (the proxy); ``nas verify``
(``nas.results.verify``) retrains the front and a few random trials for longer and stores their
accuracies in the study (``nas.search.record.verified``). Here the two are compared by rank:
Spearman's ρ and Kendall's τ (τ-b, which counts ties) between the search's accuracy and the long
run's, beside the same two numbers for the parameter count — how well plain model size ranks the
same trials, the baseline a proxy has to beat to be worth its training.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from nas.search.record import TrialRecord, Verified, records, verified, verify_settings

__all__ = [
    "FIDELITY_FLOOR",
    "MIN_RANKED",
    "Correlation",
    "Fidelity",
    "fidelity",
    "pairs",
    "rank_correlation",
]

MIN_RANKED = 3  # two points always rank perfectly (ρ = ±1): no evidence either way
FIDELITY_FLOOR = 0.7  # a Spearman ρ below this is called out: the proxy reorders a good share of pairs


@dataclass(frozen=True)
class Correlation:
    """Rank agreement of ``n`` (x, y) pairs. ``spearman``/``kendall`` are None when they say
    nothing: fewer than ``MIN_RANKED`` pairs, or one side all equal (no order to agree with)."""

    n: int
    spearman: float | None
    kendall: float | None

    @property
    def too_few(self) -> bool:
        return self.n < MIN_RANKED

    def text(self) -> str:
        """``Spearman ρ 0.82, Kendall τ 0.71``, or why there is no number."""
        if self.too_few:
            return f"too few trials to rank ({self.n} < {MIN_RANKED})"
        if self.spearman is None or self.kendall is None:
            return "no ranking: one side has the same value for every trial"
        return f"Spearman ρ {self.spearman:.2f}, Kendall τ {self.kendall:.2f}"


def rank_correlation(x: Sequence[float], y: Sequence[float]) -> Correlation:
    """Spearman's ρ (average ranks for ties) and Kendall's τ-b between ``x`` and ``y`` (equal lengths)."""
    from scipy.stats import kendalltau, spearmanr

    if len(x) != len(y):
        raise ValueError(f"rank_correlation needs pairs: {len(x)} x values, {len(y)} y values")
    n = len(x)
    if n < MIN_RANKED or len(set(x)) == 1 or len(set(y)) == 1:
        return Correlation(n, None, None)
    with warnings.catch_warnings():  # constant input is handled above; scipy's warning would repeat it
        warnings.simplefilter("ignore")
        rho = float(spearmanr(x, y).statistic)
        tau = float(kendalltau(x, y).statistic)
    return Correlation(n, rho if math.isfinite(rho) else None, tau if math.isfinite(tau) else None)


@dataclass(frozen=True)
class Fidelity:
    """A study's proxy fidelity over its verified trials (``ranked`` of them with a long-run
    accuracy; ``failed`` long runs diverged or ran out of memory and are left out)."""

    steps_factor: float
    ranked: int
    failed: int
    proxy: Correlation  # the search's accuracy vs the long run's
    params: Correlation  # the parameter count vs the long run's accuracy

    @property
    def poor(self) -> bool:
        """The short run ranks the trials worse than ``FIDELITY_FLOOR`` (Spearman)."""
        return self.proxy.spearman is not None and self.proxy.spearman < FIDELITY_FLOOR

    def lines(self) -> list[str]:
        """What a terminal, a report or a card says: the proxy's numbers, the parameter-count
        baseline's, and a warning in words when the proxy ranks poorly."""
        failed = f"; {self.failed} long run(s) failed, left out" if self.failed else ""
        out = [
            f"proxy fidelity over {self.ranked} trial(s) retrained at {self.steps_factor:g}× steps{failed} "
            f"(short-run vs long-run accuracy): {self.proxy.text()}",
        ]
        if self.proxy.too_few:
            return out
        out.append(f"parameter-count baseline (params vs long-run accuracy): {self.params.text()}")
        if self.poor:
            out.append(
                f"the short-run accuracy ranks these architectures poorly (ρ {self.proxy.spearman:.2f} < "
                f"{FIDELITY_FLOOR:g}): trust the front's order less than its latencies"
            )
        if (
            self.proxy.spearman is not None
            and self.params.spearman is not None
            and self.params.spearman > self.proxy.spearman
        ):
            out.append("plain parameter count ranks them better than the short training does")
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fidelity:
        """Inverse of ``to_dict`` (an export bundle's ``proxy_fidelity``)."""
        n = int(data["trials"])
        return cls(
            steps_factor=float(data["steps_factor"]),
            ranked=n,
            failed=int(data.get("failed", 0)),
            proxy=Correlation(n, data.get("spearman"), data.get("kendall")),
            params=Correlation(n, data.get("params_spearman"), data.get("params_kendall")),
        )

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "steps_factor": self.steps_factor,
            "trials": self.ranked,
            "failed": self.failed,
            "spearman": self.proxy.spearman,
            "kendall": self.proxy.kendall,
            "params_spearman": self.params.spearman,
            "params_kendall": self.params.kendall,
        }


def pairs(study: optuna.Study) -> list[tuple[TrialRecord, Verified]]:
    """Each verified trial's record beside its long run, in trial order."""
    rows = verified(study)
    done = {r.number: r for r in records(study, (TrialState.COMPLETE,)) if r.trained}
    return [(done[n], row) for n, row in rows.items() if n in done]


def fidelity(study: optuna.Study) -> Fidelity | None:
    """The study's proxy fidelity, or None before its first ``nas verify``."""
    settings = verify_settings(study)
    if settings is None:
        return None
    both = pairs(study)
    ok = [(r, row.accuracy) for r, row in both if row.accuracy is not None]
    long = [a for _, a in ok]
    return Fidelity(
        steps_factor=settings.steps_factor,
        ranked=len(ok),
        failed=len(both) - len(ok),
        proxy=rank_correlation([r.accuracy for r, _ in ok], long),
        params=rank_correlation([float(r.params) for r, _ in ok], long),
    )
