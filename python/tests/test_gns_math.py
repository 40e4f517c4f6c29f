"""aggswitch.torch.GradientNoiseScale and AdaptiveBatch on synthetic
statistics (pure torch, no switch): the estimators recover a known |G|² and
tr Σ, buckets add up, the moving averages and the policy's decisions. The
statistics from the switch itself are test_gns.py's."""

import math

import pytest

from conftest import SECRET, require_torch

torch = require_torch()

import aggswitch.torch as agt  # noqa: E402


def stats_of(grads):
    """The switch's numbers for rank gradients `grads` (n × d, float64):
    Σᵢ‖gᵢ‖² and ‖Σᵢ gᵢ‖²."""
    return float((grads**2).sum()), float((grads.sum(0) ** 2).sum()), grads.shape[0]


def stats_for(grad_sq, trace, n, b):
    """S and Q whose estimates are exactly `grad_sq` and `trace`: the
    inverse of (Q − S)/(n(n−1)) and b(nS − Q)/(n(n−1))."""
    c = n * (n - 1) * grad_sq  # Q − S
    a = n * (n - 1) * trace / b  # nS − Q
    s = (a + c) / (n - 1)
    return s, s + c, n


def test_the_estimators_recover_a_known_gradient_and_noise():
    # Each rank's gradient is the mean over b samples of G + ξ, ξ ~ N(0, Σ)
    # with Σ diagonal (λ_k): gᵢ = G + N(0, Σ/b). Then E[|G|² estimate] = |G|²
    # and E[tr Σ estimate] = Σλ_k, and with c_k = λ_k/b their variances per
    # step are (Gaussian moments; derivation in the estimator's terms
    # (Q − S)/(n(n−1)) = Σ_{i≠j} gᵢ·gⱼ/(n(n−1)) and b(nS − Q)/(n(n−1)) = b ×
    # the unbiased sample variance of the gᵢ summed over coordinates):
    #   Var |G|²^ = 4 Σ_k G_k² c_k / n + 2 Σ_k c_k² / (n(n−1))
    #   Var trΣ^  = 2 Σ_k λ_k² / (n−1)
    # The mean of T independent steps is within 5 standard errors of the
    # truth except with probability < 1e-6 (the seed is fixed, so the test
    # is deterministic; 5σ says a correct estimator passes for any seed).
    n, b, d, steps = 4, 8, 1000, 400
    gen = torch.Generator().manual_seed(7)
    lam = torch.rand(d, generator=gen, dtype=torch.float64) * 2.0  # per-sample variances, mean 1
    G = torch.randn(d, generator=gen, dtype=torch.float64) * 0.1  # |G|² ≈ 10
    true_g2, true_tr = float((G**2).sum()), float(lam.sum())
    c = lam / b
    sd_g2 = math.sqrt(4 * float((G**2 * c).sum()) / n + 2 * float((c**2).sum()) / (n * (n - 1)))
    sd_tr = math.sqrt(2 * float((lam**2).sum()) / (n - 1))

    gns = agt.GradientNoiseScale(batch_per_rank=b, beta=0.99)
    g2s, trs, naive = [], [], []
    for _ in range(steps):
        grads = G + torch.randn(n, d, generator=gen, dtype=torch.float64) * c.sqrt()
        s, q, _ = stats_of(grads)
        gns.add(s, q, n)
        gns.step()
        g2s.append(gns.last_grad_sq)
        trs.append(gns.last_trace)
        naive.append(q / n**2)  # |G_big|² alone: biased by tr Σ / (n b)
    mean_g2, mean_tr = sum(g2s) / steps, sum(trs) / steps
    tol_g2, tol_tr = 5 * sd_g2 / math.sqrt(steps), 5 * sd_tr / math.sqrt(steps)
    assert abs(mean_g2 - true_g2) < tol_g2, (mean_g2, true_g2, tol_g2)
    assert abs(mean_tr - true_tr) < tol_tr, (mean_tr, true_tr, tol_tr)
    # The tolerance tells a biased estimator from the right one: |G_big|²
    # alone is off by tr Σ/(n b) ≈ 31, against a tolerance of about 0.5.
    assert abs(sum(naive) / steps - true_g2) > 10 * tol_g2
    # The smoothed values (EMA, time constant 100 steps) are near the truth
    # too: their spread is about 1/√(2 × 100) of a step's.
    assert gns.grad_sq == pytest.approx(true_g2, abs=5 * sd_g2 / math.sqrt(50))
    assert gns.trace == pytest.approx(true_tr, abs=5 * sd_tr / math.sqrt(50))
    assert gns.noise_scale == pytest.approx(true_tr / true_g2, rel=0.2)


def test_a_steps_statistics_are_the_sums_over_its_buckets():
    # Buckets hold disjoint parameters: their S and Q add up to the whole's.
    n, b = 3, 5
    grads = torch.randn(n, 1000, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 0.3
    whole = agt.GradientNoiseScale(batch_per_rank=b, beta=0.0)
    whole.add(*stats_of(grads))
    whole.step()
    split = agt.GradientNoiseScale(batch_per_rank=b, beta=0.0)
    for part in grads.split([100, 250, 650], dim=1):
        split.add(*stats_of(part))
    split.step()
    assert split.last_grad_sq == pytest.approx(whole.last_grad_sq, rel=1e-12)
    assert split.last_trace == pytest.approx(whole.last_trace, rel=1e-12)
    # and the closed forms: |G|² = mean over i≠j of gᵢ·gⱼ, tr Σ = b × the
    # unbiased variance of the gᵢ summed over coordinates
    cross = sum(float(grads[i] @ grads[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    assert whole.last_grad_sq == pytest.approx(cross, rel=1e-12)
    assert whole.last_trace == pytest.approx(b * float(grads.var(0, unbiased=True).sum()), rel=1e-12)


def test_the_moving_averages_are_bias_corrected_and_b_noise_is_their_ratio():
    n, b, beta = 4, 16, 0.9
    gns = agt.GradientNoiseScale(batch_per_rank=b, beta=beta)
    assert (gns.noise_scale, gns.grad_sq, gns.trace) == (None, None, None)
    gns.add(*stats_for(2.0, 100.0, n, b))
    assert gns.step() == pytest.approx(50.0)
    # one step: the bias-corrected averages are that step's values
    assert gns.grad_sq == pytest.approx(2.0) and gns.trace == pytest.approx(100.0)
    gns.add(*stats_for(4.0, 500.0, n, b))
    gns.step()
    w = (1 - beta) / (1 - beta**2)  # weight of the first step after correction
    assert gns.grad_sq == pytest.approx(2.0 * beta * w + 4.0 * (1 - beta) / (1 - beta**2))
    assert gns.trace == pytest.approx(100.0 * beta * w + 500.0 * (1 - beta) / (1 - beta**2))
    # the ratio of the averages (not the average of the ratios 50 and 125)
    assert gns.noise_scale == pytest.approx(gns.trace / gns.grad_sq)
    assert gns.noise_scale != pytest.approx((50.0 * beta + 125.0 * (1 - beta)) / (beta + 1 - beta))


def test_a_change_of_batch_is_taken_at_the_next_step():
    n = 2
    gns = agt.GradientNoiseScale(batch_per_rank=8, beta=0.0)
    gns.add(*stats_for(1.0, 64.0, n, 8))
    gns.step()
    gns.batch_per_rank = 32
    gns.add(*stats_for(1.0, 64.0, n, 32))  # the same noise measured with 4× the batch
    assert gns.step() == pytest.approx(64.0)


def test_edge_cases_say_what_is_wrong():
    gns = agt.GradientNoiseScale(batch_per_rank=4)
    assert gns.step() is None and gns.steps == 0  # no bucket: a no_sync() backward
    gns.add(1.0, 1.0, 1)
    with pytest.raises(ValueError, match="needs at least 2"):
        gns.step()
    gns.add(1.0, 1.0, 4)
    with pytest.raises(ValueError, match="covers 3 ranks, an earlier one of this step 4"):
        gns.add(1.0, 1.0, 3)
    gns.step()
    # Q < S: the gradients cancel, |G|² ≤ 0: B_noise is infinite, not negative
    g2 = agt.GradientNoiseScale(batch_per_rank=4, beta=0.0)
    g2.add(10.0, 1.0, 4)
    assert g2.step() == math.inf
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="positive int"):
            agt.GradientNoiseScale(batch_per_rank=bad)
    with pytest.raises(ValueError, match="beta=1.0"):
        agt.GradientNoiseScale(batch_per_rank=4, beta=1.0)


def test_a_state_feeds_one_estimator():
    state = agt.AggSwitchState("127.0.0.1:48879", job=1, secret=SECRET, rank=0, world_size=2)
    gns = agt.GradientNoiseScale(state, batch_per_rank=4)
    assert state._gns is gns
    with pytest.raises(ValueError, match="already feeds a GradientNoiseScale"):
        agt.GradientNoiseScale(state, batch_per_rank=4)
    state.close()


def policy(b_noise, *, b=8, n=4, max_b=64, **kw):
    """An AdaptiveBatch over an estimator fed a constant B_noise."""
    gns = agt.GradientNoiseScale(batch_per_rank=b, beta=0.5)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    pol = agt.AdaptiveBatch(gns, opt, max_batch_per_rank=max_b, **kw)

    def step():
        gns.add(*stats_for(1.0, b_noise, n, gns.batch_per_rank))
        gns.step()
        return pol.step()

    return pol, step


def test_adaptive_batch_grows_while_b_noise_exceeds_the_global_batch_up_to_the_max():
    pol, step = policy(1000.0, warmup=3, patience=2)  # B_noise 1000, global 32
    recs = [step() for _ in range(12)]
    grew = [r["step"] for r in recs if r["grew"]]
    # decisions from the 3rd step, then one per 2 steps: 8 → 16 → 32 → 64 (max)
    assert grew == [2, 4, 6]
    assert [r["batch_per_rank"] for r in recs[:8]] == [8, 8, 8, 16, 16, 32, 32, 64]
    assert recs[-1]["global_batch"] == 4 * 64 and pol.batch_per_rank == 64
    assert pol.lr == pytest.approx(0.1 * math.sqrt(64 / 8))  # sqrt scaling (default)
    assert recs[-1]["b_noise"] == pytest.approx(1000.0)


def test_adaptive_batch_stops_where_the_global_batch_reaches_b_noise_over_k():
    # B_noise 200, k 2: grow while 4·b < 100, i.e. 8 → 16 → 32 (4·32 = 128 ≥ 100)
    pol, step = policy(200.0, k=2.0, warmup=1, patience=1, max_b=1024, lr_scaling="linear")
    for _ in range(10):
        step()
    assert pol.batch_per_rank == 32
    assert pol.lr == pytest.approx(0.1 * 32 / 8)


def test_adaptive_batch_keeps_the_batch_while_b_noise_is_small():
    pol, step = policy(20.0, warmup=1, patience=1)
    assert not any(step()["grew"] for _ in range(10))
    assert pol.batch_per_rank == 8 and pol.lr == 0.1


def test_adaptive_batch_refuses_bad_settings():
    gns = agt.GradientNoiseScale(batch_per_rank=8)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="expected 'sqrt' or 'linear'"):
        agt.AdaptiveBatch(gns, opt, max_batch_per_rank=64, lr_scaling="cube")
    with pytest.raises(ValueError, match="at least the estimator's batch_per_rank"):
        agt.AdaptiveBatch(gns, opt, max_batch_per_rank=4)
    with pytest.raises(ValueError, match="growth=1"):
        agt.AdaptiveBatch(gns, opt, max_batch_per_rank=64, growth=1)
