"""Train an MLP on scikit-learn's bundled digits with FSDP2 (fully_shard): the
gradient reduce-scatter and parameter all-gather go through the switch
(--comm switch) or gloo (--comm gloo). --hsdp R: R replicas ("nodes") of
world/R shards; with the switch, shards stay on gloo within a node and each
replica group's all-reduce goes through the switch, the group of shard g as
job AGGSWITCH_JOB + g. Launch with torchrun (docs/PYTORCH.md, "Train with FSDP")."""
import argparse, faulthandler, hashlib, json, os, signal, sys, time

import torch, torch.distributed as dist, torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from sklearn.datasets import load_digits

# `kill -USR1 PID` prints every thread's stack to stderr: where a rank that
# seems hung is waiting (the end-to-end tests do this before giving up).
faulthandler.register(signal.SIGUSR1, all_threads=True)

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--comm", choices=["switch", "gloo"], default="switch")
p.add_argument("--steps", type=int, default=100)
p.add_argument("--batch", type=int, default=32, help="samples per rank and step")
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--layers", type=int, default=2, help="hidden layers")
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--hsdp", type=int, default=1, help="replicas (HSDP); 1: plain FSDP over all ranks")
p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to pause after each step (a test's time to act "
               "mid-run, e.g. kill the switch at a given step; the weights do not depend on it)")
p.add_argument("--out", help="write the final loss, a digest of the weights and step times here (JSON)")
a = p.parse_args()

torch.set_num_threads(1)  # one rank per core; also keeps CPU kernels' sums in one order
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if a.hsdp < 1 or world % a.hsdp:
    raise SystemExit(f"--hsdp {a.hsdp}: the world size {world} must be a multiple of it")
torch.manual_seed(a.seed)  # the same initial weights on every rank, sharded below
x, y = load_digits(return_X_y=True)  # 1797 8x8 images, shipped inside scikit-learn
x = torch.tensor(x / 16.0, dtype=torch.float32)
y = torch.tensor(y)
dims = [64] + [a.hidden] * a.layers
model = nn.Sequential(*[m for i, o in zip(dims, dims[1:]) for m in (nn.Linear(i, o), nn.ReLU())], nn.Linear(dims[-1], 10))
mesh = None
if a.hsdp > 1:
    mesh = init_device_mesh("cpu", (a.hsdp, world // a.hsdp), mesh_dim_names=("replicate", "shard"))
shard_on = mesh if mesh is None or a.comm == "gloo" else mesh["shard"]  # gloo: native 2-D HSDP
for layer in [*(m for m in model if isinstance(m, nn.Linear)), model]:
    fully_shard(layer, mesh=shard_on)
if a.comm == "switch":
    import aggswitch.torch as agt
    if mesh is None:
        state = agt.state_from_env()  # the job spans every rank
        agt.register_fsdp_comms(model, state)
    else:
        g = mesh["shard"].get_local_rank()  # replica group g: the ranks that hold shard g
        state = agt.state_from_env(job_offset=g, group=mesh["replicate"].get_group())
        agt.register_hsdp_all_reduce(model, state)
opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
batches = torch.Generator().manual_seed(a.seed * 1000 + rank)  # each rank its own samples
step_times = []
for step in range(a.steps):
    t0 = time.perf_counter()
    idx = torch.randint(len(x), (a.batch,), generator=batches)
    loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()  # gradients averaged over ranks: reduce-scatter (and HSDP all-reduce)
    opt.step()
    step_times.append(time.perf_counter() - t0)
    if rank == 0 and (step % 10 == 0 or step == a.steps - 1):
        print(f"step {step} loss {loss.item():.4f} {step_times[-1] * 1e3:.1f} ms", flush=True)
    if a.step_sleep:
        time.sleep(a.step_sleep)
with torch.no_grad():
    full_loss = nn.functional.cross_entropy(model(x), y).item()
blocks = [m for m in model.modules() if isinstance(m, FSDPModule)]
for m in blocks:  # the full parameters as this rank's forward gets them: through the run's all-gather
    m.unshard()
full = [p.detach().clone() for p in model.parameters()]
for m in blocks:
    m.reshard()
result = dict(rank=rank, world=world, comm=a.comm, hsdp=a.hsdp, steps=a.steps, loss=full_loss,
              params=sum(t.numel() for t in full),
              digest=hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in full)).hexdigest(),
              step_times=step_times)
if a.comm == "switch":  # where the collectives ran: AGGSWITCH_MODE, AGGSWITCH_FALLBACK and the state's counters
    st = state.stats()
    result["path"] = dict(mode=state.mode, fallback=state.fallback, **{k: st[k] for k in (
        "path", "switch_collectives", "host_collectives", "fallbacks", "returns", "failed_returns", "last_fallback_reason",
        "last_fallback_timing")})
print(f"rank {rank}: loss over all {len(x)} samples {full_loss:.4f}, weights sha256 {result['digest'][:16]}", flush=True)
if a.out:
    with open(a.out, "w") as f:
        json.dump(result, f)
if a.comm == "switch":
    state.close()
dist.destroy_process_group()
# Leave without Python's interpreter finalization. gloo's worker threads
# (pt_gloo_runloop) free a finished collective's tensors a moment after the
# caller got its result; freeing one that Python made takes the GIL, and a
# thread taking the GIL while the interpreter finalizes is ended with
# pthread_exit, whose unwinding through a noexcept destructor aborts the
# process ("terminate called without an active exception", SIGABRT) after the
# run succeeded and wrote --out (pytorch/pytorch#190489; destroy_process_group
# does not wait for those threads). Everything this run produces is written
# and flushed by now.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
