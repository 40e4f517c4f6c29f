"""One rank of `scripts/bench fsdp`: reduce-scatter and all-gather of one
tensor, or FSDP2 training steps, through the switch (--comm switch) or gloo
(--comm gloo), with the gloo process group from the environment (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT) as torchrun would set it.

--mode collectives: per op (reduce-scatter of n x m float32 into m, then
all-gather of m into n x m), one warm-up and --repeats timed calls; each call
is timed on every rank and the slowest rank's time is the call's time (the
ranks gather their times through gloo after the timed loop). Every output is
compared with the exact expected values (small integers, so every float32
sum is exact) and a wrong element fails the run.

--mode fsdp: the MLP of examples/train_ddp.py (digits, shipped data) with
fully_shard on every Linear and the root; --comm switch registers the
switch's reduce-scatter and all-gather (aggswitch.torch.register_fsdp_comms).
Step time (forward, backward with the reduce-scatter, optimizer step, the
next forward's all-gathers) per rank; the report takes the slowest rank's
median after --warmup steps. Also the final loss and a digest of the full
parameters, which must be the same on every rank.

Writes one JSON per rank (--out)."""
import argparse, hashlib, json, time

import torch, torch.distributed as dist, torch.nn as nn

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--mode", choices=["collectives", "fsdp"], required=True)
p.add_argument("--comm", choices=["switch", "gloo"], required=True)
p.add_argument("--mib", type=int, default=64, help="collectives: MiB of float32 per rank's full tensor")
p.add_argument("--repeats", type=int, default=5)
p.add_argument("--steps", type=int, default=20, help="fsdp: timed steps")
p.add_argument("--warmup", type=int, default=3, help="fsdp: steps left out of the statistics")
p.add_argument("--hidden", type=int, default=5000, help="fsdp: width of the 2 hidden layers")
p.add_argument("--batch", type=int, default=32)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--out", required=True)
a = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
result = dict(rank=rank, world=world, comm=a.comm, mode=a.mode)


def slowest(times):
    """Per call, the slowest rank's seconds."""
    every = [None] * world
    dist.all_gather_object(every, times)
    return [max(col) for col in zip(*every)]


if a.mode == "collectives":
    n_elems = a.mib * 1024 * 1024 // 4
    m = n_elems // world
    full = torch.arange(m * world, dtype=torch.float32).remainder_(1000.0).add_(rank)
    shard = torch.empty(m, dtype=torch.float32)
    gathered = torch.empty(m * world, dtype=torch.float32)
    if a.comm == "switch":
        import os
        import aggswitch

        worker = aggswitch.Worker(os.environ["AGGSWITCH_SWITCH"], int(os.environ["AGGSWITCH_JOB"]),
                                  rank, world, os.environ["AGGSWITCH_SECRET"])
        rs = lambda: worker.reduce_scatter(full.numpy(), shard.numpy())
        ag = lambda: worker.all_gather(shard.numpy(), gathered.numpy())
    else:
        rs = lambda: dist.reduce_scatter_tensor(shard, full)
        ag = lambda: dist.all_gather_into_tensor(gathered, shard)
    base = torch.arange(m * world, dtype=torch.float32).remainder_(1000.0)
    want_shard = (base[rank * m:(rank + 1) * m] * world + sum(range(world)))
    want_gathered = (base * world + sum(range(world)))
    for name, op, out, want in (("reduce_scatter", rs, shard, want_shard),
                                ("all_gather", ag, gathered, want_gathered)):
        times = []
        for k in range(a.repeats + 1):
            out.fill_(float("nan"))
            if name == "all_gather":
                shard.copy_(want_shard)
            dist.barrier()
            t0 = time.perf_counter()
            op()
            if k > 0:
                times.append(time.perf_counter() - t0)
            if not torch.equal(out, want):
                bad = (out != want).nonzero()[0].item()
                raise SystemExit(f"rank {rank}: {name} element {bad} is {out[bad].item()}, expected {want[bad].item()}")
        result[name] = dict(elements_in=full.numel() if name == "reduce_scatter" else m,
                            seconds=slowest(times))
        if a.comm == "switch":  # this rank's running totals after the op (resends, ECE, ...)
            result[name]["worker_stats"] = dict(worker.stats())
else:
    from sklearn.datasets import load_digits
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(a.seed)
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    dims = [64, a.hidden, a.hidden]
    model = nn.Sequential(*[m for i, o in zip(dims, dims[1:]) for m in (nn.Linear(i, o), nn.ReLU())], nn.Linear(dims[-1], 10))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    if a.comm == "switch":
        import aggswitch.torch as agt

        agt.register_fsdp_comms(model, agt.state_from_env())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = torch.Generator().manual_seed(a.seed * 1000 + rank)
    step_times = []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        idx = torch.randint(len(x), (a.batch,), generator=batches)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step_times.append(time.perf_counter() - t0)
    with torch.no_grad():
        full_loss = nn.functional.cross_entropy(model(x), y).item()
    weights = b"".join(t.full_tensor().detach().numpy().tobytes() for t in model.parameters())
    result.update(params=sum(t.numel() for t in model.parameters()), loss=full_loss,
                  digest=hashlib.sha256(weights).hexdigest(), warmup=a.warmup,
                  step_seconds=slowest(step_times[a.warmup:]))
with open(a.out, "w") as f:
    json.dump(result, f)
# Every rank past its last collective before any tears gloo down: a rank
# that destroyed its group while another still finished FSDP's last
# all-gather aborted once ("terminate called without an active exception").
dist.barrier()
dist.destroy_process_group()
