"""The gradient noise scale: ``GradientNoiseScale`` (the estimator) and
``AdaptiveBatch`` (the batch-size policy). Public through ``aggswitch.torch``.

The switch of a `stats = true` job measures, per collective, Σᵢ‖gᵢ‖² and
‖Σᵢ gᵢ‖² of the raw (not yet averaged) sums, in float64 in one order
(docs/PROTOCOL.md, "Gradient statistics"). Both are additive over disjoint
parameter sets, so a step's numbers are the sums over its buckets. The
estimator turns them into McCandlish et al.'s |G|² and tr Σ; the policy
turns B_noise into a batch size and a learning rate. Nothing here talks to
the network: the DDP hooks (``aggswitch._ddp``) hand the numbers over,
through ``AggSwitchState._feed_gns`` (``aggswitch._state``), which calls
``GradientNoiseScale._add_bucket`` on the state's background thread.

Invariants: every rank gets the same statistics bit for bit, so every
rank's estimator and policy reach the same B_noise and the same decision
without exchanging anything. A step's buckets are folded in only by an
explicit ``step()``. One ``GradientNoiseScale`` per state (its constructor
sets ``state._gns``).

Layering: the bottom of the torch integration; it imports nothing of the
package at run time (``AggSwitchState`` only for type checking). It logs on
the ``aggswitch.torch`` logger, as before the split.
"""

import logging
import math
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ._state import AggSwitchState

_log = logging.getLogger("aggswitch.torch")


class GradientNoiseScale:
    """The gradient noise scale B_noise = tr Σ / |G|² (McCandlish et al.,
    "An Empirical Model of Large-Batch Training", 2018, appendix A), from the
    switch's per-collective statistics: no extra traffic, every rank alike.

    With n ranks each computing its local gradient gᵢ as the mean over
    ``batch_per_rank`` = b samples, B_small = b and B_big = n·b, and the
    switch's S = Σᵢ‖gᵢ‖² and Q = ‖Σᵢ gᵢ‖² give |G_small|² ≈ S/n and
    |G_big|² = Q/n². The two unbiased estimators are then

        |G|²  ≈ (B_big |G_big|² − B_small |G_small|²) / (B_big − B_small)
              = (Q − S) / (n (n − 1))
        tr Σ  ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)
              = b (n S − Q) / (n (n − 1))

    (tr Σ is the per-sample covariance's trace; each step's values are
    unbiased but noisy, |G|² can come out negative). As the paper does, both
    are smoothed separately with an exponential moving average (factor
    ``beta``, bias-corrected as Adam's moments) and B_noise is the ratio of
    the averages.

    Feeding: ``GradientNoiseScale(state, batch_per_rank=b)`` attaches to an
    ``AggSwitchState``; its DDP hooks (``allreduce_hook`` and the compress
    hooks) then add each bucket's statistics. A step ends when the user
    calls ``step()``, after ``backward()`` has returned (DDP waits for every
    bucket before it returns, so all of the step's buckets are in) and
    before the next ``backward()``. An explicit call rather than counting
    buckets, because DDP rebuilds its buckets after the first iteration and
    ``no_sync()`` backwards send none. With gradient accumulation b is the
    samples per rank per synchronised step. The job must be declared
    ``stats = true`` on the switch, else the first bucket fails with an error
    that says so. Without a state (``state=None``) feed ``add()`` directly.

    For the compress hooks the switch sums g/n in bf16/fp16: the statistics
    are multiplied back by n² and carry the half-precision rounding of the
    values (about 2⁻⁹ relative per element for bf16).

    After ``step()``: ``noise_scale``, ``grad_sq`` and ``trace`` (smoothed),
    ``last_grad_sq`` and ``last_trace`` (the step's own), ``last_stats``
    (its S, Q, n and bucket count) and ``world_size`` (n).
    """

    def __init__(
        self,
        state: "AggSwitchState | None" = None,
        *,
        batch_per_rank: int,
        beta: float = 0.95,
    ) -> None:
        if not (0.0 <= beta < 1.0):
            raise ValueError(f"GradientNoiseScale: beta={beta} must be in [0, 1) (0: no smoothing)")
        self.batch_per_rank = batch_per_rank  # checked by the setter
        self.beta = float(beta)
        self._lock = threading.Lock()
        self._pending: list[float] = [0.0, 0.0]  # this step's S and Q so far
        self._pending_n: int | None = None
        self._pending_buckets = 0
        self._ema = [0.0, 0.0]  # EMA of |G|², of tr Σ (not bias-corrected)
        self.steps = 0
        self.world_size: int | None = None
        # The last step's raw numbers: its S, Q, n, and its unsmoothed |G|², tr Σ.
        self.last_stats: dict | None = None
        self.last_grad_sq: float | None = None
        self.last_trace: float | None = None
        if state is not None:
            if state._gns is not None:
                raise ValueError(f"{state!r} already feeds a GradientNoiseScale; make one per state")
            state._gns = self

    @property
    def batch_per_rank(self) -> int:
        """B_small: samples per rank in the step being measured. Set it when
        the batch changes (AdaptiveBatch does), before that step's backward."""
        return self._batch

    @batch_per_rank.setter
    def batch_per_rank(self, b: int) -> None:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"GradientNoiseScale: batch_per_rank={b!r} must be a positive int (samples per rank)")
        self._batch = b

    def _add_bucket(self, sum_of_squares: float, square_of_sum: float, n: int) -> None:
        with self._lock:
            if self._pending_n is not None and n != self._pending_n:
                raise ValueError(
                    f"GradientNoiseScale: a bucket covers {n} ranks, an earlier one of this step "
                    f"{self._pending_n}; the job's ranks changed within a step"
                )
            self._pending_n = n
            self._pending[0] += sum_of_squares
            self._pending[1] += square_of_sum
            self._pending_buckets += 1

    def add(self, sum_of_squares: float, square_of_sum: float, n: int) -> None:
        """Adds one collective's statistics (of disjoint parameters) to the
        current step: Σᵢ‖gᵢ‖², ‖Σᵢ gᵢ‖² of the raw sums, over ``n`` ranks."""
        self._add_bucket(float(sum_of_squares), float(square_of_sum), int(n))

    def step(self) -> float | None:
        """Ends the step: folds its buckets into the moving averages and
        returns B_noise (``noise_scale``), or None when no bucket came since
        the last call (a ``no_sync()`` backward). Raises ValueError when the
        job has fewer than 2 ranks (B_big = B_small: nothing to estimate)."""
        with self._lock:
            s, q = self._pending
            n, buckets = self._pending_n, self._pending_buckets
            self._pending, self._pending_n, self._pending_buckets = [0.0, 0.0], None, 0
        if not buckets:
            return None
        assert n is not None
        if n < 2:
            raise ValueError(
                f"GradientNoiseScale: the statistics cover {n} rank; the estimator compares one "
                "rank's gradient with the sum over several and needs at least 2"
            )
        b = self._batch
        grad_sq = (q - s) / (n * (n - 1))
        trace = b * (n * s - q) / (n * (n - 1))
        self.world_size, self.last_grad_sq, self.last_trace = n, grad_sq, trace
        self.last_stats = {"sum_of_squares": s, "square_of_sum": q, "n": n, "buckets": buckets}
        self.steps += 1
        for i, v in enumerate((grad_sq, trace)):
            self._ema[i] = self.beta * self._ema[i] + (1.0 - self.beta) * v
        return self.noise_scale

    @property
    def grad_sq(self) -> float | None:
        """Smoothed |G|² (bias-corrected EMA), None before the first step."""
        return self._debiased(0)

    @property
    def trace(self) -> float | None:
        """Smoothed tr Σ, per-sample (bias-corrected EMA), None before the first step."""
        return self._debiased(1)

    @property
    def noise_scale(self) -> float | None:
        """B_noise = EMA(tr Σ) / EMA(|G|²), in samples: None before the first
        step; ``math.inf`` while the smoothed |G|² is not positive (the
        noise drowns the signal: the estimate says nothing yet)."""
        if self.steps == 0:
            return None
        g, t = self._ema
        if g <= 0.0:
            return math.inf
        return t / g

    def _debiased(self, i: int) -> float | None:
        if self.steps == 0:
            return None
        return self._ema[i] / (1.0 - self.beta**self.steps)

    def __repr__(self) -> str:
        return (
            f"GradientNoiseScale(batch_per_rank={self._batch}, beta={self.beta}, steps={self.steps}, "
            f"noise_scale={self.noise_scale})"
        )


class AdaptiveBatch:
    """Grows the global batch while the gradient noise scale says a larger
    batch is efficient, in the spirit of KungFu's adaptive batch size: after
    each ``GradientNoiseScale.step()``, call ``step()``; when the global
    batch n·b is below B_noise / ``k``, the per-rank batch b is multiplied by
    ``growth`` (at most ``max_batch_per_rank``) and every param group's
    learning rate rescaled from its value at construction: ``"sqrt"``
    (default) lr₀·√(b/b₀), or ``"linear"`` lr₀·b/b₀ (Goyal et al.; with SGD
    and momentum it usually wants a warm-up, which sqrt does without).

    It waits ``warmup`` steps before the first decision and ``patience``
    steps after each change (default for both: 1/(1 − beta) of the
    estimator, the moving average's time constant) so that B_noise reflects
    the current batch. The batch never shrinks: B_noise grows as training
    goes on (McCandlish et al.), and a noisy dip should not undo a step.

    Every rank gets the same statistics, bit for bit, so every rank's
    estimator and policy reach the same B_noise and the same decision: the
    ranks change batch together without exchanging anything. Read
    ``batch_per_rank`` for the next step's per-rank batch (the estimator's
    is updated too). ``step()`` returns a record of the step
    (``step``, ``b_noise``, ``global_batch``, ``batch_per_rank``, ``lr``,
    ``grew``), also logged at DEBUG on ``aggswitch.torch`` (a change at
    INFO).
    """

    def __init__(
        self,
        gns: GradientNoiseScale,
        optimizer: "torch.optim.Optimizer",
        *,
        max_batch_per_rank: int,
        k: float = 1.0,
        growth: float = 2.0,
        lr_scaling: str = "sqrt",
        warmup: int | None = None,
        patience: int | None = None,
    ) -> None:
        if lr_scaling not in ("sqrt", "linear"):
            raise ValueError(f"AdaptiveBatch: lr_scaling={lr_scaling!r}: expected 'sqrt' or 'linear'")
        if not (k > 0):
            raise ValueError(f"AdaptiveBatch: k={k} must be positive (grow while n·b < B_noise / k)")
        if not (growth > 1):
            raise ValueError(f"AdaptiveBatch: growth={growth} must be above 1")
        b0 = gns.batch_per_rank
        if isinstance(max_batch_per_rank, bool) or not isinstance(max_batch_per_rank, int) or max_batch_per_rank < b0:
            raise ValueError(
                f"AdaptiveBatch: max_batch_per_rank={max_batch_per_rank!r} must be an int at least "
                f"the estimator's batch_per_rank ({b0})"
            )
        settle = max(1, round(1.0 / (1.0 - gns.beta)))
        self.warmup = settle if warmup is None else int(warmup)
        self.patience = settle if patience is None else int(patience)
        self.gns, self.optimizer = gns, optimizer
        self.max_batch_per_rank, self.k, self.growth, self.lr_scaling = max_batch_per_rank, float(k), float(growth), lr_scaling
        self._b0 = b0
        self._base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self.steps = 0
        self._last_change = 0

    @property
    def batch_per_rank(self) -> int:
        """The per-rank batch for the next step."""
        return self.gns.batch_per_rank

    @property
    def lr(self) -> float:
        """The first param group's learning rate (as set for the next step)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def _lr_factor(self, b: int) -> float:
        r = b / self._b0
        return math.sqrt(r) if self.lr_scaling == "sqrt" else r

    def step(self) -> dict:
        """Decides the next step's batch and learning rate from the
        estimator's current B_noise; returns this step's record."""
        self.steps += 1
        gns, b = self.gns, self.gns.batch_per_rank
        n = gns.world_size
        b_noise = gns.noise_scale
        rec = dict(
            step=self.steps - 1,
            b_noise=b_noise,
            global_batch=None if n is None else n * b,
            batch_per_rank=b,
            lr=self.lr,
            grew=False,
        )
        settled = self.steps >= self.warmup and self.steps - self._last_change >= self.patience
        if settled and n is not None and b_noise is not None and b < self.max_batch_per_rank and n * b * self.k < b_noise:
            nb = min(self.max_batch_per_rank, max(b + 1, math.ceil(b * self.growth)))
            gns.batch_per_rank = nb
            for g, lr0 in zip(self.optimizer.param_groups, self._base_lrs):
                g["lr"] = lr0 * self._lr_factor(nb)
            self._last_change = self.steps
            rec["grew"] = True
            _log.info(
                "AdaptiveBatch step %d: B_noise %.1f > %g × global batch %d: batch per rank %d -> %d, lr %.4g",
                rec["step"], b_noise, self.k, n * b, b, nb, self.lr,
            )
        _log.debug("AdaptiveBatch %s", rec)
        return rec
