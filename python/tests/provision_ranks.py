"""What one rank of the self-provisioned-job tests runs
(test_provisioned.py starts the ranks from the forkserver): a few DDP
steps through a state of tenant `vision` with or without a job name.
Not a test file."""

import hashlib

import torch
import torch.distributed as dist


def ddp_steps(rank, world, port, address, key_file, job_name, steps, q):
    """`steps` DDP steps of a small MLP with the aggswitch hook on a
    self-provisioned job; puts the weights' digest, the job's name and id
    and the state's counters on q."""
    import aggswitch.torch as agt

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 257), torch.nn.ReLU(), torch.nn.Linear(257, 3))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
    state = agt.AggSwitchState(
        address, job=1, secret=None, tenant="vision", tenant_key_file=key_file, job_name=job_name,
        fallback=False, join_timeout=30.0,
    )
    ddp.register_comm_hook(state, agt.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(32, 20, generator=g)
        y = torch.randint(3, (32,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
    job = state._worker.job if state._worker is not None else None
    out = dict(rank=rank, digest=h.hexdigest(), job_name=state.job_name, job=job, stats=state.stats())
    state.close()
    q.put(out)
    dist.destroy_process_group()
