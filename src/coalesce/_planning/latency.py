"""A learned latency model of one provider model, pure (no clock, no I/O).

A call's duration is modelled as::

    ttft  = overhead + prefill_per_token * input_tokens
    total = ttft + decode_per_token * output_tokens

The three coefficients start from a :class:`LatencyPrior` and are calibrated online from
measured calls by a robust, forgetting, prior-regularised least squares fit (see
``docs/latency-model.md``). Predictions are high quantiles (p95 by default): the larger
of the mean prediction times a margin learned from the ratios of observed to predicted
durations, and the mean plus a slack learned from their differences in seconds.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from coalesce._batching.quantile import WindowQuantile
from coalesce._exceptions import ConfigurationError

__all__ = ["LatencyModel", "LatencyParameters", "LatencyPrior", "Prediction"]

_Vec = tuple[float, float, float]
# Smallest coefficient scales: a prior of 0 must not freeze its coefficient at 0.
_SCALE_FLOOR: _Vec = (0.01, 1e-6, 1e-4)
_HUBER_K = 1.345  # 95% efficiency under Gaussian noise
_SCALE_ALPHA = 0.05  # smoothing of the residual scale (about 20 observations)
_DRIFT_ALPHA = 0.1  # smoothing of the residual bias (about 10 observations)
# A bias above this (in sigmas; noise alone gives about 0.2 sd) means drift: old
# observations are then forgotten at ``_FAST_FORGETTING`` until the fit catches up.
_DRIFT_THRESHOLD = 0.6
_FAST_FORGETTING = 0.9
_MIN_PREDICTION = 1e-3
# The prior's weight is forgotten like an observation, down to this floor: enough to pin
# directions the data never explores (collinear sizes), too little to bias a fit.
_PRIOR_FLOOR = 1e-3  # seconds; floor of the relative-error denominator
# How the prior's errors go together: a provider faster or slower than the prior tends
# to be so in all three coefficients at once (its hardware, its load, its distance).
# In units of the prior, the prior's covariance is ``I + c 11'`` with ``c`` this much, so
# a first reply that measures only a total (no TTFT) moves all three coefficients, not
# mostly the largest share of that total. Its inverse is the ridge penalty's matrix.
_COMMON_SPEED = 2.0
_PRIOR_PRECISION = [
    [(1.0 if i == j else 0.0) - _COMMON_SPEED / (1 + 3 * _COMMON_SPEED) for j in range(3)]
    for i in range(3)
]


@dataclass(frozen=True)
class LatencyPrior:
    """Prior (declared or default) latency coefficients of a provider model.

    The defaults describe a typical hosted chat model reached over the public internet,
    on the slow side of the median: public measurements of the small and mid-size
    hosted models (gpt-4o-mini, gpt-4.1-mini, claude haiku class; the Artificial
    Analysis leaderboards, 2025-2026) put output speed mostly between 60 and 110
    tokens/s and time to first token between 0.3 and 0.7 s. So: 0.45 s of overhead
    (network, queueing, first token), prefill at 10,000 input tokens/s and decode at
    75 output tokens/s. Until enough replies are measured, predictions carry a wide
    margin (``LatencyModel.default_margin``) for the prior's uncertainty; the first
    replies correct both.

    Attributes:
        overhead: Seconds per call regardless of size.
        prefill_per_token: Seconds per input token until the first output token.
        decode_per_token: Seconds per output token after the first token.

    Raises:
        ConfigurationError: If a coefficient is negative or not finite.
    """

    overhead: float = 0.45
    prefill_per_token: float = 1e-4
    decode_per_token: float = 1 / 75

    def __post_init__(self) -> None:
        for name in ("overhead", "prefill_per_token", "decode_per_token"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigurationError(
                    f"LatencyPrior.{name} must be finite and >= 0, got {value!r}"
                )


class Prediction(NamedTuple):
    """A predicted call duration, in seconds."""

    ttft: float
    """Time to the first output token."""
    total: float
    """Time until the whole reply is received."""


class LatencyParameters(NamedTuple):
    """The current estimates of a :class:`LatencyModel`."""

    overhead: float
    """Seconds per call regardless of size."""
    prefill_per_token: float
    """Seconds per input token (time to first token grows by this much per token)."""
    decode_per_token: float
    """Seconds per output token."""
    total_margin: float
    """Factor from the mean to the predicted quantile of total time."""
    ttft_margin: float
    """Factor from the mean to the predicted quantile of time to first token."""
    observations: int
    """Calls observed so far (ignored invalid ones excluded)."""


class _RobustScale:
    """Running scale and bias of one equation's relative residuals.

    The scale sets the Huber threshold; the bias (a running mean of Huber-clipped,
    standardised residuals) detects drift: sporadic outliers barely move it, while a
    provider that got slower pushes every residual the same way.
    """

    def __init__(self, initial: float) -> None:
        self.mean_abs = initial
        self.bias = 0.0
        self.seen = 0

    @property
    def drifting(self) -> bool:
        """Whether recent residuals are consistently on one side."""
        return abs(self.bias) > _DRIFT_THRESHOLD

    def weight(self, residual: float) -> float:
        """Huber weight of ``residual`` (relative), then update scale and bias."""
        sigma = 1.25 * self.mean_abs  # mean |e| = 0.8 sigma for Gaussian noise
        size = abs(residual)
        # The first residual measures the prior's error, not the calls' noise: an
        # outlier is told from the calls seen so far, and there are none yet.
        first, self.seen = not self.seen, self.seen + 1
        weight = 1.0 if first or size <= _HUBER_K * sigma else _HUBER_K * sigma / size
        clipped = max(-_HUBER_K, min(_HUBER_K, residual / sigma))
        self.bias = (1 - _DRIFT_ALPHA) * self.bias + _DRIFT_ALPHA * clipped
        # Clipped at 4x so a single wild outlier barely moves the scale, while a
        # persistent shift (drift) grows it geometrically and regains full weight.
        size = min(size, 4.0 * self.mean_abs)
        self.mean_abs = max(1e-3, (1 - _SCALE_ALPHA) * self.mean_abs + _SCALE_ALPHA * size)
        return weight


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Solve a small linear system by Gaussian elimination; ``None`` if singular."""
    n = len(rhs)
    a = [[*row, r] for row, r in zip(matrix, rhs, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= f * a[col][c]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (a[r][n] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x


def _nonnegative_minimiser(m: Sequence[Sequence[float]], b: Sequence[float]) -> list[float]:
    """Minimise ``u'Mu/2 - b'u`` over ``u >= 0`` for a small positive-definite ``M``.

    The optimum is the unconstrained optimum on one face of the orthant; with three
    variables trying all eight faces is exact and cheap.
    """
    n = len(b)
    unconstrained = _solve([list(row) for row in m], list(b))
    if unconstrained is not None and min(unconstrained) >= 0:
        return unconstrained  # the common case: no bound is active
    best, best_value = [0.0] * n, 0.0
    for size in range(1, n + 1):
        for free in itertools.combinations(range(n), size):
            sub = _solve([[m[i][j] for j in free] for i in free], [b[i] for i in free])
            if sub is None or min(sub) < 0:
                continue
            u = [0.0] * n
            for i, v in zip(free, sub, strict=True):
                u[i] = v
            value = 0.5 * sum(u[i] * m[i][j] * u[j] for i in range(n) for j in range(n))
            value -= sum(b[i] * u[i] for i in range(n))
            if value < best_value:
                best, best_value = u, value
    return best


class LatencyModel:
    """Online latency model of one provider model; pure, times are passed in.

    The fit minimises Huber-weighted *relative* squared errors (call-time noise grows
    with the call's duration), with exponential forgetting of old observations (drift)
    and a ridge penalty pulling each coefficient toward the prior (few or collinear
    observations stay near the prior instead of blowing up). Coefficients are never
    negative.

    Args:
        prior: Starting coefficients; :class:`LatencyPrior` defaults if ``None``.
        quantile: The quantile :meth:`predict` returns, in ``(0.5, 1)``.
        forgetting: Per-observation decay of old observations' weight, in ``(0, 1]``;
            ``0.99`` remembers about the last 100 calls.
        prior_weight: Initial strength of the prior, worth about this many
            observations per coefficient; it is forgotten like an observation, down to a
            small floor that keeps unexplored directions at the prior.
        margin_window: How many recent observed/predicted ratios set the margin.
        min_margin_samples: Ratios needed before the learned margin replaces
            ``default_margin``.
        default_margin: Factor from mean to quantile before enough ratios.

    Raises:
        ConfigurationError: If an argument is out of range.
    """

    def __init__(
        self,
        prior: LatencyPrior | None = None,
        *,
        quantile: float = 0.95,
        forgetting: float = 0.99,
        prior_weight: float = 1.0,
        margin_window: int = 100,
        min_margin_samples: int = 20,
        default_margin: float = 1.3,
    ) -> None:
        _check_range("quantile", quantile, 0.5, 1.0, closed=False)
        _check_range("forgetting", forgetting, 0.0, 1.0, closed=True)
        _check_range("prior_weight", prior_weight, 0.0, math.inf, closed=False)
        _check_range("default_margin", default_margin, 0.0, math.inf, closed=False)
        if not 1 <= min_margin_samples <= margin_window:
            raise ConfigurationError(
                f"min_margin_samples must be in [1, margin_window={margin_window}],"
                f" got {min_margin_samples!r}"
            )
        self.prior = prior or LatencyPrior()
        self.quantile = quantile
        self.forgetting = forgetting
        self.prior_weight = prior_weight
        self.min_margin_samples = min_margin_samples
        self.default_margin = default_margin
        p = self.prior
        raw = (p.overhead, p.prefill_per_token, p.decode_per_token)
        # The fit works in units of the prior (theta = scale * u), so the three
        # coefficients, six orders of magnitude apart, are equally well conditioned.
        self._scale: _Vec = (
            max(raw[0], _SCALE_FLOOR[0]),
            max(raw[1], _SCALE_FLOOR[1]),
            max(raw[2], _SCALE_FLOOR[2]),
        )
        self._u0 = [r / s for r, s in zip(raw, self._scale, strict=True)]
        self._info = [[0.0] * 3 for _ in range(3)]  # forgotten data information
        self._moment = [0.0] * 3
        self._theta: _Vec = raw
        self._ttft_scale = _RobustScale(0.2)
        self._decode_scale = _RobustScale(0.2)
        self._total_scale = _RobustScale(0.2)
        # Recent measurements, re-scored against the *current* fit whenever the margin
        # is needed: ratios frozen at observation time would keep the errors of the
        # calibration transient (a cold prior) in the margin for a whole window.
        self.margin_window = margin_window
        self._recent: deque[tuple[int, int, float, float | None]] = deque(maxlen=margin_window)
        self._margin_cache: tuple[float, float, float] | None = None
        self._observations = 0
        self._prior_strength = prior_weight

    # -- predictions -------------------------------------------------------------

    def predict_mean(self, input_tokens: float, output_tokens: float) -> Prediction:
        """Return the expected (mean) durations of a call of this size.

        Args:
            input_tokens: Prompt tokens of the call.
            output_tokens: Output tokens the call is expected to produce.
        """
        a, b, c = self._theta
        ttft = a + b * max(input_tokens, 0.0)
        return Prediction(ttft, ttft + c * max(output_tokens, 0.0))

    def predict(self, input_tokens: float, output_tokens: float) -> Prediction:
        """Return the ``quantile`` (p95 by default) durations of a call of this size.

        Args:
            input_tokens: Prompt tokens of the call.
            output_tokens: Output tokens the call is expected to produce.
        """
        mean = self.predict_mean(input_tokens, output_tokens)
        margin, first, slack = self._margins()
        total = max(mean.total * margin, mean.total + slack)
        ttft = min(mean.ttft * first, total)
        return Prediction(ttft, total)

    def parameters(self) -> LatencyParameters:
        """Return the current coefficient and margin estimates."""
        return LatencyParameters(*self._theta, self._total_margin(), self._ttft_margin(),
                                 self._observations)  # fmt: skip

    def _total_margin(self) -> float:
        return self._margins()[0]

    def _ttft_margin(self) -> float:
        return self._margins()[1]

    def _margins(self) -> tuple[float, float, float]:
        """(total, ttft) margins and the total's slack in seconds, from the recent
        measurements under the current coefficients (cached until the next observation).

        The margins are conformal quantiles of observed/predicted ratios: errors that
        grow with a call's size (a provider slower than the fit). The slack is the same
        quantile of observed minus predicted seconds: delays that do not (the network,
        the caller's own event loop), which a ratio learned on long calls understates
        for a short one. A prediction is the larger of the two bounds."""
        if self._margin_cache is None:
            totals = WindowQuantile(self.margin_window)
            ttfts = WindowQuantile(self.margin_window)
            excess = WindowQuantile(self.margin_window)
            for input_tokens, output_tokens, seconds, ttft in self._recent:
                mean = self.predict_mean(input_tokens, output_tokens)
                totals.add(seconds / max(mean.total, _MIN_PREDICTION))
                excess.add(seconds - mean.total)
                if ttft is not None:
                    ttfts.add(ttft / max(mean.ttft, _MIN_PREDICTION))
            total = (
                self.default_margin
                if len(totals) < self.min_margin_samples
                else _conformal_quantile(totals, self.quantile)
            )
            first = (
                total
                if len(ttfts) < self.min_margin_samples
                else _conformal_quantile(ttfts, self.quantile)
            )
            slack = (
                0.0
                if len(excess) < self.min_margin_samples
                else max(0.0, _conformal_quantile(excess, self.quantile))
            )
            self._margin_cache = (total, first, slack)
        return self._margin_cache

    # -- calibration -------------------------------------------------------------

    def observe(
        self, input_tokens: int, output_tokens: int, seconds: float, ttft: float | None = None
    ) -> None:
        """Calibrate from one measured call.

        Invalid measurements (non-finite or non-positive ``seconds``, negative token
        counts) are ignored rather than raised: they come from plumbing, not users. A
        ``ttft`` outside ``(0, seconds]`` is treated as missing.

        Args:
            input_tokens: Prompt tokens the call actually used.
            output_tokens: Output tokens the call actually produced.
            seconds: Measured duration of the whole call.
            ttft: Measured time to the first token, when streaming.
        """
        if not (math.isfinite(seconds) and seconds > 0) or min(input_tokens, output_tokens) < 0:
            return
        if ttft is not None and not (math.isfinite(ttft) and 0 < ttft <= seconds):
            ttft = None
        self._recent.append((input_tokens, output_tokens, seconds, ttft))
        self._margin_cache = None
        if ttft is None:
            rows = [self._row((1.0, input_tokens, output_tokens), seconds, self._total_scale)]
        else:
            rows = [self._row((1.0, input_tokens, 0.0), ttft, self._ttft_scale)]
            if output_tokens > 0:
                decode = seconds - ttft
                rows.append(self._row((0.0, 0.0, output_tokens), decode, self._decode_scale))
        self._decay()
        for weight, z, target in rows:
            self._accumulate(weight, z, target)
        self._observations += 1
        self._refit()

    def _decay(self) -> None:
        """Forget old observations, faster while a drift is being caught up with."""
        scales = (self._ttft_scale, self._decode_scale, self._total_scale)
        drifting = any(scale.drifting for scale in scales)
        lam = min(self.forgetting, _FAST_FORGETTING) if drifting else self.forgetting
        self._prior_strength = max(_PRIOR_FLOOR, lam * self._prior_strength)
        for row in self._info:
            row[:] = [lam * v for v in row]
        self._moment = [lam * v for v in self._moment]

    def _row(
        self, x: Sequence[float], y: float, scale: _RobustScale
    ) -> tuple[float, list[float], float]:
        """Weight, design row and target of the equation ``x . theta = y``.

        The equation is divided by its current prediction (relative errors) and the row
        is expressed in units of the prior (``theta = scale * u``).
        """
        predicted = max(
            sum(xi * ti for xi, ti in zip(x, self._theta, strict=True)), _MIN_PREDICTION
        )
        weight = scale.weight(y / predicted - 1.0)
        z = [xi * si / predicted for xi, si in zip(x, self._scale, strict=True)]
        return weight, z, y / predicted

    def _accumulate(self, weight: float, z: list[float], target: float) -> None:
        for i in range(3):
            self._moment[i] += weight * z[i] * target
            for j in range(3):
                self._info[i][j] += weight * z[i] * z[j]

    def _refit(self) -> None:
        pw = self._prior_strength
        m = [
            [v + pw * _PRIOR_PRECISION[i][j] for j, v in enumerate(row)]
            for i, row in enumerate(self._info)
        ]
        pu0 = [sum(p * u for p, u in zip(row, self._u0, strict=True)) for row in _PRIOR_PRECISION]
        b = [v + pw * x for v, x in zip(self._moment, pu0, strict=True)]
        u = _nonnegative_minimiser(m, b)
        self._theta = (u[0] * self._scale[0], u[1] * self._scale[1], u[2] * self._scale[2])

    def __repr__(self) -> str:
        a, b, c = self._theta
        return (
            f"<LatencyModel overhead={a:.3f}s prefill={b * 1000:.4f}ms/token"
            f" decode={c * 1000:.2f}ms/token margin={self._total_margin():.2f}x"
            f" observations={self._observations}>"
        )


def _conformal_quantile(window: WindowQuantile, q: float) -> float:
    """The ``q`` quantile with split-conformal rank ``ceil((n + 1) q)``.

    For exchangeable ratios this covers a fresh one with probability at least ``q``.
    """
    n = len(window)
    return window.quantile(min(1.0, q * (n + 1) / n))


def _check_range(name: str, value: float, low: float, high: float, *, closed: bool) -> None:
    """Raise if ``value`` is not in ``(low, high)`` (``(low, high]`` when ``closed``)."""
    ok = low < value <= high if closed else low < value < high
    if not (ok and not math.isnan(value)):
        bracket = "]" if closed else ")"
        raise ConfigurationError(f"{name} must be in ({low}, {high}{bracket}, got {value!r}")
