"""Prep rate as a function of CPU cores, fitted from the measured points P(k).

Plumber (Kuchnik et al., MLSys 2022) models each pipeline stage by its rate per core and the cores
it gets. Prep does not scale perfectly: workers contend for the memory bus, the collate/IPC path of
the main process is serial, and so on. We fit the Universal Scalability Law to the measured points::

    P(k) = lam * k / (1 + sigma * (k - 1) + kappa * k * (k - 1))

``lam`` is the rate of one core, ``sigma`` the serial (contention) fraction, ``kappa`` the
coherence cost that makes a pipeline slow down past a peak. The fit is linear least squares on
``k / P(k) = (1 + sigma (k-1) + kappa k (k-1)) / lam`` with sigma, kappa >= 0. Only points with
k <= the physical cores of the measured machine are used: beyond that workers time-share cores and
say nothing about per-core scaling. With one point, sigma = kappa = 0 (a line through the origin):
the report says so, because that is the least informed prediction.

Predicting for more cores than the curve's peak returns the peak (nobody would add workers that make
prep slower).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["PrepScaling"]


@dataclass(frozen=True)
class PrepScaling:
    """Fitted prep-rate curve: samples/s on ``k`` cores (one worker per core)."""

    rate_one_core_per_s: float
    sigma: float = 0.0
    kappa: float = 0.0
    fitted_points: int = 1

    @classmethod
    def fit(
        cls, workers: list[int], samples_per_s: list[float], physical_cores: int | None = None
    ) -> PrepScaling:
        """Fit the curve to measured (workers, samples/s) pairs."""
        if len(workers) != len(samples_per_s):
            raise ValueError(
                f"prep_scaling: {len(workers)} worker counts but {len(samples_per_s)} rates; they must pair up"
            )
        points = [
            (int(k), float(r))
            for k, r in zip(workers, samples_per_s, strict=True)
            if k >= 1 and r > 0 and math.isfinite(r) and (physical_cores is None or k <= physical_cores)
        ]
        if not points:
            raise ValueError(
                f"prep_scaling: no usable point (need k >= 1 and rate > 0) in workers={workers}, "
                f"samples_per_s={samples_per_s}"
            )
        ks = np.array([k for k, _ in points], dtype=float)
        inv = ks / np.array([r for _, r in points])  # seconds per sample per core: linear in the params
        if len(set(ks.tolist())) == 1:
            return cls(rate_one_core_per_s=float(1.0 / inv.mean()), fitted_points=len(points))
        columns = [np.ones_like(ks), ks - 1, ks * (ks - 1)]
        if len(set(ks.tolist())) == 2:
            columns = columns[:2]  # two distinct k: kappa is not identifiable
        coef = cls._nonnegative_lstsq(np.stack(columns, axis=1), inv)
        a = coef[0]
        sigma = coef[1] / a if len(coef) > 1 else 0.0
        kappa = coef[2] / a if len(coef) > 2 else 0.0
        return cls(
            rate_one_core_per_s=float(1.0 / a),
            sigma=float(sigma),
            kappa=float(kappa),
            fitted_points=len(points),
        )

    @staticmethod
    def _nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Least squares with coefficients >= 0, by dropping negative terms (at most 3 columns)."""
        active = list(range(x.shape[1]))
        while True:
            coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
            negative = [i for i, c in zip(active, coef, strict=True) if c < 0 and i != 0]
            if not negative or coef[0] <= 0:
                break
            active.remove(negative[-1])
        full = np.zeros(x.shape[1])
        full[active] = coef
        if full[0] <= 0:  # degenerate data (rate rising faster than linear): fall back to the mean per core
            full[:] = 0.0
            full[0] = float(np.mean(y))
        return full

    def _raw(self, k: float) -> float:
        return self.rate_one_core_per_s * k / (1 + self.sigma * (k - 1) + self.kappa * k * (k - 1))

    def peak_cores(self) -> float:
        """Core count at which the curve peaks (infinite when kappa is 0)."""
        if self.kappa <= 0:
            return math.inf
        return max(1.0, math.sqrt(max(0.0, 1 - self.sigma) / self.kappa))

    def rate(self, cores: float) -> float:
        """Predicted prep samples/s with ``cores`` cores (and as many workers)."""
        if cores <= 0:
            raise ValueError(f"cores must be positive, got {cores}")
        return self._raw(min(cores, self.peak_cores()))

    def max_rate(self) -> float:
        """The rate no number of cores exceeds (``lam / sigma`` when kappa is 0)."""
        if self.kappa > 0:
            return self._raw(self.peak_cores())
        return math.inf if self.sigma <= 0 else self.rate_one_core_per_s / self.sigma

    def cores_for_rate(self, target_per_s: float, max_cores: int = 4096) -> int | None:
        """Fewest whole cores whose predicted rate reaches ``target_per_s`` (None: never)."""
        for k in range(1, max_cores + 1):
            if self.rate(k) >= target_per_s * (1 - 1e-9):
                return k
            if k > self.peak_cores():
                return None
        return None

    def params(self) -> dict:
        """JSON-ready parameters (stored in report.json under ``model.prep_scaling``)."""
        return {
            "law": "usl",
            "rate_one_core_per_s": self.rate_one_core_per_s,
            "sigma": self.sigma,
            "kappa": self.kappa,
            "fitted_points": self.fitted_points,
        }
