"""What one rank of test_gns.py runs (started as a process from conftest's
forkserver). Not a test file: it trains a small MLP with DDP through the
switch with a GradientNoiseScale attached, and next to it computes the
reference statistics from every rank's full local gradient gathered with
gloo; it puts both, per step, on the queue.

The reference gradient is a plain copy of the model with the same weights
and batch: on CPU with one thread its backward gives the same bits as the
local gradient DDP hands to the hook (the hook sees raw, not yet averaged,
gradients)."""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

import aggswitch.torch as agt

SECRET = "f8d62ed1d1c316f8e2e3117ac0506fa4cc16a8cbb5810625d69f1dc586d27f3c"
BATCH, STEPS = 16, 12


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))


def _reference(local, world, dtype):
    """S, Q from every rank's gradient gathered with gloo: S = Σᵢ‖gᵢ‖² and
    Q = ‖Σᵢ gᵢ‖² of the float32 rank-order sum (what the switch sums), both
    squared and added in float64; Q_exact of the float64 sum; and the bound
    on |Q − Q_exact| from the float32 rounding of the sum. For a half-
    precision hook the values are what it sends, g/n rounded, widened, and
    S and Q are scaled by n² as the hook scales the switch's."""
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    if dtype != "f32":
        wire = torch.bfloat16 if dtype == "bf16" else torch.float16
        gathered = [g.to(wire).div_(world).float() for g in gathered]
    acc = gathered[0].clone()
    for g in gathered[1:]:
        acc += g  # float32, rank order: the switch's sum
    exact = sum(g.double() for g in gathered)
    # Each element's float32 sum of n terms is off by at most (n−1)·u·Σᵢ|gᵢₖ|
    # (u = 2⁻²⁴, each of the n−1 additions rounds once), so
    # |‖s̃‖² − ‖s‖²| ≤ Σₖ (2|sₖ| eₖ + eₖ²).
    err = (len(gathered) - 1) * 2.0**-24 * sum(g.double().abs() for g in gathered)
    scale = 1.0 if dtype == "f32" else float(world) ** 2
    return dict(
        sum_of_squares=scale * sum(float((g.double() ** 2).sum()) for g in gathered),
        square_of_sum=scale * float((acc.double() ** 2).sum()),
        square_of_exact_sum=scale * float((exact**2).sum()),
        rounding_bound=scale * float((2 * exact.abs() * err + err**2).sum()),
    )


def gns_runs(rank, world, port, plan, q):
    """For each (name, switch address, dtype) in plan: STEPS steps of DDP
    through the switch; per step the switch's statistics (as the
    estimator got them) and the gloo reference."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    out = {"rank": rank}
    for name, address, dtype in plan:
        model = _model()
        ref = copy.deepcopy(model)
        # Small buckets: several per step, so the step's numbers are sums over buckets.
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.008)
        if address.startswith("hosts:"):  # the host path, chunks of the given length
            state = agt.AggSwitchState(None, job=1, secret=None, dtype=dtype, mode="hosts",
                                       elems_per_chunk=int(address.split(":")[1]))
        else:
            state = agt.AggSwitchState(address, job=1, secret=SECRET, dtype=dtype, join_timeout=30.0)
        gns = agt.GradientNoiseScale(state, batch_per_rank=BATCH, beta=0.8)
        hook = {"f32": agt.allreduce_hook, "bf16": agt.bf16_compress_hook}[dtype]
        ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(100 + rank)
        w_true = torch.randn(20, 3, generator=torch.Generator().manual_seed(5))
        steps = []
        for _ in range(STEPS):
            x = torch.randn(BATCH, 20, generator=gen)
            y = (x @ w_true + 0.5 * torch.randn(BATCH, 3, generator=gen)).argmax(1)
            ref.load_state_dict(model.state_dict())
            ref.zero_grad()
            nn.functional.cross_entropy(ref(x), y).backward()
            local = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
            want = _reference(local, world, dtype)
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            gns.step()
            steps.append(dict(switch=gns.last_stats, ref=want, grad_sq=gns.grad_sq, trace=gns.trace,
                              noise_scale=gns.noise_scale))
        out[name] = dict(steps=steps, resent=state.stats().get("chunks_resent", 0))
        state.close()
    q.put(out)
    dist.destroy_process_group()
