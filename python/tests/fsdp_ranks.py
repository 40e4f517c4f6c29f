"""What one rank of the FSDP2 tests runs (test_fsdp.py starts the ranks as
processes from a forkserver that has imported torch once). Not a test file:
each function trains and puts a dict of results on the queue.

The model is an MLP whose layer widths do not divide by the world size, so
FSDP pads its shards; the data are random but fixed by the seed, each rank
its own samples."""

import hashlib
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

SECRET = "f8d62ed1d1c316f8e2e3117ac0506fa4cc16a8cbb5810625d69f1dc586d27f3c"
IN, OUT = 12, 5


def _data(seed, n=512, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, IN, generator=g)
    w = torch.randn(IN, OUT, generator=g)
    return x.to(device), (x @ w + 0.1 * torch.randn(n, OUT, generator=g)).argmax(1).to(device)


def _model(seed, mesh=None, mp=None, device="cpu"):
    """The MLP, sharded over `mesh` (default: every rank, on `device`)."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(IN, 37), nn.ReLU(), nn.Linear(37, 29), nn.ReLU(), nn.Linear(29, OUT))
    if mesh is None:  # explicit: fully_shard's default is CUDA where there is one
        mesh = init_device_mesh(device, (dist.get_world_size(),))
    kw = {"mesh": mesh}
    if mp is not None:
        kw["mp_policy"] = mp
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def _digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _full_params(model):
    """The unsharded parameters as the model's all-gather gives them (the
    switch's when registered), fetched with async unshards of every block."""
    mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
    handles = [m.unshard(async_op=True) for m in mods]
    for h in handles:
        if h is not None:
            h.wait()
    full = [p.detach().cpu().clone() for p in model.parameters()]
    for m in mods:
        m.reshard()
    assert not any(isinstance(t, DTensor) for t in full), "unshard left sharded parameters"
    return full


def _init(rank, world, port):
    torch.set_num_threads(1)  # one rank per core; CPU kernels' sums in one order
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def _train(model, rank, steps, seed, lr=0.1, die_at=None, q=None, device="cpu"):
    x, y = _data(seed, device=device)
    batches = torch.Generator().manual_seed(seed * 1000 + rank)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        if step == die_at:
            _put_and_exit(q, dict(rank=rank, died_at=time.monotonic()))
        idx = torch.randint(len(x), (16,), generator=batches)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return nn.functional.cross_entropy(model(x).float(), y).item()


def fsdp_runs(rank, world, port, runs, steps, q):
    """runs: list of (name, switch address or None for gloo or "hosts" for
    the host path, job dtype, MixedPrecisionPolicy kwargs or None). The same
    seed for every run."""
    import aggswitch.torch as agt

    _init(rank, world, port)
    out = dict(rank=rank)
    for name, address, dtype, mp in runs:
        t0 = time.monotonic()
        mp_policy = None if mp is None else MixedPrecisionPolicy(**{k: getattr(torch, v) for k, v in mp.items()})
        model = _model(0, mp=mp_policy)
        state = None
        if address == "hosts":
            state = agt.AggSwitchState(None, job=1, secret=None, mode="hosts", dtype=dtype)
            agt.register_fsdp_comms(model, state)
        elif address is not None:
            state = agt.AggSwitchState(address, job=1, secret=SECRET, dtype=dtype, join_timeout=30.0)
            agt.register_fsdp_comms(model, state)
        loss = _train(model, rank, steps, seed=1)
        full = _full_params(model)
        out[name] = dict(
            loss=loss,
            full=_digest(full),
            # the sharded parameters gathered by gloo (DTensor), in the
            # dtype FSDP gathers (MixedPrecisionPolicy.param_dtype)
            gloo_full=_digest(p.full_tensor().to(f.dtype) for p, f in zip(model.parameters(), full)),
            stats=state.stats() if state is not None else {},
            seconds=time.monotonic() - t0,
        )
        if state is not None:
            state.close()
    q.put(out)
    dist.destroy_process_group()


def killed_rank(rank, world, port, address, die_at, q):
    """Rank world-1 exits at step die_at; the others report what they raised."""
    import aggswitch.torch as agt

    _init(rank, world, port)
    model = _model(0)
    state = agt.AggSwitchState(address, job=1, secret=SECRET, stall_timeout=2.0, join_timeout=30.0)
    agt.register_fsdp_comms(model, state)
    try:
        _train(model, rank, 10**6, seed=1, die_at=die_at if rank == world - 1 else None, q=q)
        _put_and_exit(q, dict(rank=rank, error=None))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        _put_and_exit(q, dict(rank=rank, error=type(e).__name__, message=str(e), at=time.monotonic()))


def _put_and_exit(q, report):
    """Reports, then exits at once: the process group has (or will have) a
    dead member, so nothing may wait on it."""
    q.put(report)
    q.close()
    q.join_thread()  # the queue's feeder thread has written the report
    os._exit(0)


def hsdp(rank, world, port, addresses, steps, q):
    """2 nodes x 2 ranks: shard within a node (gloo), the replicas' all-reduce
    through the switch; addresses[s] serves the replica group of shard s."""
    import aggswitch.torch as agt
    from torch.distributed.device_mesh import init_device_mesh

    _init(rank, world, port)
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    shard = mesh["shard"].get_local_rank()
    model = _model(0, mesh=mesh["shard"])
    hosts = addresses[shard] == "hosts"
    state = agt.AggSwitchState(
        None if hosts else addresses[shard], job=1, secret=None if hosts else SECRET,
        group=mesh["replicate"].get_group(), join_timeout=30.0, mode="hosts" if hosts else "switch",
    )
    agt.register_hsdp_all_reduce(model, state)
    loss = _train(model, rank, steps, seed=1)
    q.put(dict(
        rank=rank,
        shard=shard,
        loss=loss,
        local=_digest(p.to_local() for p in model.parameters()),
        full=_digest(_full_params(model)),
        collectives=state.stats().get("collectives", 0) + state.stats().get("host_collectives", 0),
    ))
    state.close()
    dist.destroy_process_group()


def cuda_runs(rank, world, port, addresses, steps, q):
    """On one GPU shared by the ranks (gloo process group): 1-D FSDP through
    the switch on CPU and on CUDA (tensors staged through host memory), and
    a 2 x 2 HSDP on CUDA with the replicas' all-reduce through the switch.
    addresses: [cpu job, cuda job, hsdp shard 0, hsdp shard 1]."""
    import aggswitch.torch as agt
    from torch.distributed.device_mesh import init_device_mesh

    _init(rank, world, port)
    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    out = dict(rank=rank)
    for name, address, device in (("cpu", addresses[0], "cpu"), ("cuda", addresses[1], "cuda")):
        model = _model(0, device=device)
        state = agt.AggSwitchState(address, job=1, secret=SECRET, join_timeout=30.0)
        agt.register_fsdp_comms(model, state)
        loss = _train(model, rank, steps, seed=1, device=device)
        out[name] = dict(loss=loss, full=_digest(_full_params(model)),
                         on=str(next(model.parameters()).device), collectives=state.stats()["collectives"])
        state.close()
    mesh = init_device_mesh("cuda", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    shard = mesh["shard"].get_local_rank()
    model = _model(0, mesh=mesh["shard"])
    state = agt.AggSwitchState(addresses[2 + shard], job=1, secret=SECRET,
                               group=mesh["replicate"].get_group(), join_timeout=30.0)
    agt.register_hsdp_all_reduce(model, state)
    loss = _train(model, rank, steps, seed=1, device="cuda")
    out["hsdp"] = dict(loss=loss, shard=shard, local=_digest(p.to_local().cpu() for p in model.parameters()),
                       full=_digest(_full_params(model)), collectives=state.stats()["collectives"])
    state.close()
    q.put(out)
    dist.destroy_process_group()
