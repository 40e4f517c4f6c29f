"""aggswitch.torch.GradientNoiseScale fed by the switch: 4 ranks as processes
(gloo process group on 127.0.0.1) train with DDP through the loopback
stand-in switch of a stats job; the switch's statistics, and the gradient
noise scale from them, equal what every rank's full gradient gathered with
gloo gives. The rank side is gns_ranks.py; the estimator's math on
synthetic gradients is test_gns_math.py."""

import json
import math
import os
import re
import subprocess
import sys
import threading

import pytest

from conftest import SECRET, launch, require_torch

torch = require_torch()

import aggswitch  # noqa: E402
import aggswitch.torch as agt  # noqa: E402
import gns_ranks  # noqa: E402

WORLD = 4
# Both sides add positive float64 terms (squares of float32 values, exact in
# float64), ~5,900 of them per step, in different orders (the switch: 8
# lanes per chunk, ranks, chunks, buckets; torch: its own reduction). Each
# sum is within d·2⁻⁵³ ≈ 7e-13 relative of the exact one, so 1e-10 leaves a
# margin of 100; a lost, doubled or mis-scaled bucket moves S or Q by far
# more (one bucket holds a third of the parameters).
REL = 1e-10


@pytest.fixture(scope="module")
def runs():
    made = []

    def sw(**kw):
        s = aggswitch.LoopbackSwitch(job=1, world_size=WORLD, secret=SECRET, stats=True, **kw)
        made.append(s)
        return s.address

    plan = [
        ("f32", sw(elems_per_chunk=100), "f32"),
        ("f32_lossy", sw(elems_per_chunk=100, drop_every=30), "f32"),
        ("bf16", sw(elems_per_chunk=100, dtype="bf16"), "bf16"),
        # The host path: the same statistics, bit for bit
        ("f32_hosts", "hosts:100", "f32"),
        ("bf16_hosts", "hosts:100", "bf16"),
    ]
    got = launch(gns_ranks.gns_runs, WORLD, plan, timeout=240.0)
    for s in made:
        s.close()
    for name, *_ in plan:
        steps = got[0][name]["steps"]
        rel = [max(abs(r["switch"][k] / r["ref"][k] - 1) for r in steps) for k in ("sum_of_squares", "square_of_sum")]
        print(f"{name}: largest relative difference switch/gloo: S {rel[0]:.1e}, Q {rel[1]:.1e}; "
              f"B_noise after {len(steps)} steps {steps[-1]['noise_scale']:.1f}")
    return {r["rank"]: r for r in got}


@pytest.mark.parametrize("name", ["f32", "f32_lossy", "bf16"])
def test_the_switch_statistics_equal_the_gathered_gradients(runs, name):
    for step, rec in enumerate(runs[0][name]["steps"]):
        sw, ref = rec["switch"], rec["ref"]
        assert sw["n"] == WORLD
        # DDP's first backward has all parameters in one bucket; it then
        # rebuilds them by bucket_cap_mb: several per step to sum.
        assert sw["buckets"] >= (1 if step == 0 else 2), step
        assert sw["sum_of_squares"] == pytest.approx(ref["sum_of_squares"], rel=REL), step
        assert sw["square_of_sum"] == pytest.approx(ref["square_of_sum"], rel=REL), step
        # Against the float64 sum of the gradients, Q differs by the float32
        # rounding of Σᵢ gᵢ, within its bound (gns_ranks._reference).
        assert abs(sw["square_of_sum"] - ref["square_of_exact_sum"]) <= ref["rounding_bound"] * (1 + REL), step


@pytest.mark.parametrize("name", ["f32", "f32_lossy", "bf16"])
def test_every_rank_gets_the_same_bits(runs, name):
    if name == "f32_lossy":
        assert runs[0][name]["resent"] > 0, "the lossy run lost nothing"
    for r in range(1, WORLD):
        for a, b in zip(runs[0][name]["steps"], runs[r][name]["steps"]):
            assert a["switch"] == b["switch"]
            assert a["noise_scale"] == b["noise_scale"]


@pytest.mark.parametrize("name", ["f32", "f32_lossy", "bf16"])
def test_the_noise_scale_equals_the_gathered_gradients(runs, name):
    # The estimator fed the reference numbers. Its |G|² = (Q − S)/(n(n−1))
    # and tr Σ = b(nS − Q)/(n(n−1)) differ from the switch's by at most
    # REL·(Q + S)/(n(n−1)) and b·REL·(nS + Q)/(n(n−1)) per step (|ΔS| ≤ REL·S,
    # |ΔQ| ≤ REL·Q), and their moving averages by at most the largest of
    # those; B_noise = tr/|G|² by δtr/|G|² + tr·δG/|G|².
    n, b = WORLD, gns_ranks.BATCH
    ref_gns = agt.GradientNoiseScale(batch_per_rank=b, beta=0.8)
    dg = dt = 0.0
    for step, rec in enumerate(runs[0][name]["steps"]):
        s, q = rec["ref"]["sum_of_squares"], rec["ref"]["square_of_sum"]
        ref_gns.add(s, q, n)
        ref_gns.step()
        dg = max(dg, REL * (q + s) / (n * (n - 1)))
        dt = max(dt, b * REL * (n * s + q) / (n * (n - 1)))
        assert abs(rec["grad_sq"] - ref_gns.grad_sq) <= dg, step
        assert abs(rec["trace"] - ref_gns.trace) <= dt, step
        g, t = ref_gns.grad_sq, ref_gns.trace
        if g > 0:
            assert abs(rec["noise_scale"] - ref_gns.noise_scale) <= dt / g + abs(t) * dg / g**2, step
    # The run measured something: gradients with signal and noise.
    assert ref_gns.trace > 0 and ref_gns.grad_sq > 0, (ref_gns.trace, ref_gns.grad_sq)


def test_a_job_without_stats_fails_the_bucket_with_what_to_do(switch):
    sw = switch(2)  # stats off
    errors = []

    def rank(r):
        state = agt.AggSwitchState(sw.address, job=1, secret=SECRET, rank=r, world_size=2, join_timeout=10.0)
        agt.GradientNoiseScale(state, batch_per_rank=4)
        try:
            agt.allreduce_hook(state, _Bucket(torch.ones(10))).wait()
        except Exception as e:  # noqa: BLE001 - handed to the test
            errors.append(str(e))
        state.close()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(errors) == 2 and all("declare the job with stats = true" in e for e in errors), errors


class _Bucket:
    def __init__(self, tensor):
        self._t = tensor

    def buffer(self):
        return self._t

    def index(self):
        return 0


def test_train_ddp_adaptive_grows_the_batch_and_logs_every_step(tmp_path):
    # examples/train_ddp.py --adaptive under torchrun (4 ranks) against a
    # loopback stats switch: a record per step; the batch doubles only when
    # the record says B_noise exceeded the global batch (k = 1), the lr
    # follows √(b/b₀); every rank ends with the same weights.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    steps, b0, lr0 = 30, 8, 0.05
    log = tmp_path / "gns.jsonl"
    with aggswitch.LoopbackSwitch(job=1, world_size=WORLD, secret=SECRET, stats=True) as sw:
        env = dict(os.environ, AGGSWITCH_SWITCH=sw.address, AGGSWITCH_JOB="1", AGGSWITCH_SECRET=SECRET,
                   OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
               os.path.join(root, "examples", "train_ddp.py"), "--comm", "switch", "--adaptive",
               "--steps", str(steps), "--batch", str(b0), "--lr", str(lr0), "--gns-log", str(log)]
        r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [x["step"] for x in recs] == list(range(steps))
    assert f"step {steps - 1} loss" in r.stdout and "B_noise" in r.stdout and "global_batch" in r.stdout
    b = b0
    for x in recs:
        assert x["batch_per_rank"] == b and x["global_batch"] == WORLD * b
        assert x["lr"] == pytest.approx(lr0 * math.sqrt(b / b0))
        assert math.isfinite(x["b_noise"]) and x["b_noise"] > 0
        if x["grew"]:
            assert x["b_noise"] > WORLD * b
            b *= 2
    assert b > b0, "30 steps of this run grow the batch once (B_noise ≈ 77 > 32 at step 19)"
    digests = re.findall(r"weights sha256 ([0-9a-f]{16})", r.stdout)  # ranks' lines may interleave
    assert len(digests) == WORLD and len(set(digests)) == 1, r.stdout[-2000:]


@pytest.mark.parametrize("hosts, switch", [("f32_hosts", "f32"), ("bf16_hosts", "bf16")])
def test_the_host_path_gives_the_switchs_statistics_bit_for_bit(runs, hosts, switch):
    # An adaptive-batch run decides the same whether the switch or the
    # hosts summed a step.
    for r in range(WORLD):
        for a, b in zip(runs[r][hosts]["steps"], runs[r][switch]["steps"]):
            assert a["switch"] == b["switch"]
            assert a["noise_scale"] == b["noise_scale"]
