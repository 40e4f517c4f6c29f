"""What one rank of the host-path tests runs (test_host_path.py starts the
ranks from the forkserver): a small DDP training whose weights' digest is
compared across modes. Not a test file."""

import hashlib
import time

import torch
import torch.distributed as dist

SECRET = "f8d62ed1d1c316f8e2e3117ac0506fa4cc16a8cbb5810625d69f1dc586d27f3c"


def _digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def ddp_train(rank, world, port, address, mode, dtype, steps, gate, state_kw, q):
    """Trains an MLP for `steps` steps with the aggswitch DDP hook; puts the
    weights' digest and the state's counters on q. `gate`: an optional
    (step, event_to_set, event_to_wait) pair: rank 0 sets the first at that
    step and every rank waits for the second (the test kills or restarts
    the switch in between)."""
    import aggswitch.torch as agt

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 257), torch.nn.ReLU(), torch.nn.Linear(257, 3))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
    state = agt.AggSwitchState(address, job=1, secret=SECRET, mode=mode, dtype=dtype, **state_kw)
    hook = {"f32": agt.allreduce_hook, "bf16": agt.bf16_compress_hook, "f16": agt.fp16_compress_hook}[dtype]
    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    events = []
    for step in range(steps):
        if gate is not None:
            for at, fire, wait in gate:
                if step == at:
                    if rank == 0 and fire is not None:
                        fire.set()
                    if wait is not None:
                        wait.wait(60)
        x = torch.randn(32, 20, generator=g)
        y = torch.randint(3, (32,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        events.append(state.stats().get("path"))
    stats = state.stats()
    state.close()
    q.put(dict(rank=rank, digest=_digest(model), stats=stats, paths=events))
    dist.destroy_process_group()


def host_stats(rank, world, port, elems, chunk, q):
    """One host-path all-reduce of a fixed input with statistics: the sum's
    bits and the (sum_of_squares, square_of_sum, ranks) it gives."""
    from aggswitch import _hosts

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    x = torch.randn(elems, generator=torch.Generator().manual_seed(rank))
    stats = _hosts.all_reduce(x, rank, world, "f32", None, stats_chunk=chunk)
    q.put(dict(rank=rank, sum=x.numpy().tobytes(), stats=stats))
    dist.destroy_process_group()


def join_outcome(rank, world, port, address, bad_rank, fallback, q):
    """One DDP step where rank `bad_rank` holds a wrong secret: reports what
    this rank raised (and when), or the state's counters."""
    import aggswitch.torch as agt

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    secret = SECRET if rank != bad_rank else "1" + SECRET[1:]
    model = torch.nn.Linear(8, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = agt.AggSwitchState(address, job=1, secret=secret, fallback=fallback, join_timeout=30.0)
    ddp.register_comm_hook(state, agt.allreduce_hook)
    t0 = time.monotonic()
    out = dict(rank=rank)
    try:
        ddp(torch.ones(4, 8)).sum().backward()
        out.update(error=None, stats=state.stats())
    except RuntimeError as e:
        err = state.error
        out.update(error=type(err).__name__, reason=getattr(err, "reason", None), message=str(err), raw=str(e)[:200])
    out["seconds"] = time.monotonic() - t0
    state.close()
    q.put(out)
    dist.destroy_process_group()
