"""Train an MLP on scikit-learn's bundled digits with DDP; gradients summed in
the switch (--comm switch) or by DDP's default gloo all-reduce (--comm gloo).
Launch one process per worker with torchrun (docs/PYTORCH.md, "Train with PyTorch").

--adaptive (needs --comm switch and a job declared stats = true) estimates the
gradient noise scale from the switch's statistics and grows the batch with
aggswitch.torch.AdaptiveBatch; rank 0 prints step, loss, B_noise, global
batch and learning rate every step (docs/PYTORCH.md, "Gradient noise scale")."""
import argparse, faulthandler, hashlib, json, os, signal, sys, time

import torch, torch.distributed as dist, torch.nn as nn
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
p.add_argument("--dtype", choices=["f32", "bf16", "f16"], help="gradients on the wire: the switch job's dtype, "
               "or PyTorch's bf16/fp16 compression hook with --comm gloo (default: AGGSWITCH_DTYPE, else f32)")
p.add_argument("--adaptive", action="store_true", help="grow the batch while the gradient noise scale says "
               "larger batches are efficient (--batch is the first per-rank batch)")
p.add_argument("--max-batch", type=int, default=256, help="--adaptive: largest samples per rank and step")
p.add_argument("--gns-k", type=float, default=1.0, help="--adaptive: grow while the global batch < B_noise / k")
p.add_argument("--lr-scaling", choices=["sqrt", "linear"], default="sqrt", help="--adaptive: lr as the batch grows")
p.add_argument("--gns-log", help="--adaptive: rank 0 writes each step's record here (JSON lines)")
p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the model computes; with cuda every "
               "rank uses GPU LOCAL_RANK (default 0) and DDP's buckets are staged through host memory for the switch")
p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to pause after each step (a test's time to act "
               "mid-run, e.g. kill the switch at a given step; the weights do not depend on it)")
p.add_argument("--out", help="write the final loss, a digest of the weights and step times here (JSON)")
a = p.parse_args()
if a.adaptive and a.comm != "switch":
    p.error("--adaptive needs --comm switch: the gradient statistics come from the switch")

torch.set_num_threads(1)  # one rank per core; also keeps CPU kernels' sums in one order
if a.device == "cuda":  # the same kernels every run, so two runs with the same sums end with the same bits
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
dev = torch.device(a.device, torch.cuda.current_device()) if a.device == "cuda" else torch.device("cpu")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(a.seed)
x, y = load_digits(return_X_y=True)  # 1797 8x8 images, shipped inside scikit-learn
x = torch.tensor(x / 16.0, dtype=torch.float32, device=dev)
y = torch.tensor(y, device=dev)
dims = [64] + [a.hidden] * a.layers
model = nn.Sequential(*[m for i, o in zip(dims, dims[1:]) for m in (nn.Linear(i, o), nn.ReLU())], nn.Linear(dims[-1], 10)).to(dev)
ddp = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
if a.comm == "switch":
    import aggswitch.torch as agt
    opts = {"dtype": a.dtype} if a.dtype else {}  # or AGGSWITCH_DTYPE=bf16
    # On an aggregation tree each rank joins its leaf: AGGSWITCH_RANK is its rank at the leaf and
    # AGGSWITCH_WORLD_SIZE the leaf's workers (default: torch.distributed's rank and world size);
    # AGGSWITCH_TREE=2,2 gives the host path the tree's order (process-group ranks: leaf 0's first).
    for key, var in (("rank", "AGGSWITCH_RANK"), ("world_size", "AGGSWITCH_WORLD_SIZE")):
        if os.environ.get(var, "").strip():
            opts[key] = int(os.environ[var])
    state = agt.state_from_env(**opts)
    hooks = {"f32": agt.allreduce_hook, "bf16": agt.bf16_compress_hook, "f16": agt.fp16_compress_hook}
    ddp.register_comm_hook(state, hooks[state.dtype])
elif a.dtype in ("bf16", "f16"):  # gloo at its best with half the bytes: PyTorch's own hooks
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
    ddp.register_comm_hook(None, dh.bf16_compress_hook if a.dtype == "bf16" else dh.fp16_compress_hook)
opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=0.9)
if a.adaptive:  # the job must be declared stats = true
    gns = agt.GradientNoiseScale(state, batch_per_rank=a.batch)
    policy = agt.AdaptiveBatch(gns, opt, max_batch_per_rank=a.max_batch, k=a.gns_k, lr_scaling=a.lr_scaling)
    log = open(a.gns_log, "w") if a.gns_log and rank == 0 else None
records = []
batches = torch.Generator().manual_seed(a.seed * 1000 + rank)  # each rank its own samples
step_times = []
for step in range(a.steps):
    t0 = time.perf_counter()
    idx = torch.randint(len(x), (policy.batch_per_rank if a.adaptive else a.batch,), generator=batches).to(dev)
    loss = nn.functional.cross_entropy(ddp(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()  # gradients averaged over ranks by the hook or gloo
    opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()  # the step's kernels are done before its time is taken
    step_times.append(time.perf_counter() - t0)
    if a.adaptive:
        gns.step()  # every bucket of this backward is in: one B_noise estimate
        rec = dict(policy.step(), loss=loss.item())  # this step's batch and lr; the next step's may grow
        records.append(rec)
        if rank == 0:
            print(f"step {step} loss {rec['loss']:.4f} B_noise {rec['b_noise']:.1f} global_batch {rec['global_batch']} "
                  f"lr {rec['lr']:.4g}", flush=True)
            if log:
                log.write(json.dumps(rec) + "\n")
                log.flush()
    elif rank == 0 and (step % 10 == 0 or step == a.steps - 1):
        print(f"step {step} loss {loss.item():.4f} {step_times[-1] * 1e3:.1f} ms", flush=True)
    if a.step_sleep:
        time.sleep(a.step_sleep)
with torch.no_grad():
    full_loss = nn.functional.cross_entropy(model(x), y).item()
weights = b"".join(t.detach().cpu().numpy().tobytes() for t in model.state_dict().values())
result = dict(rank=rank, world=world, device=str(dev), comm=a.comm, dtype=state.dtype if a.comm == "switch" else a.dtype or "f32", steps=a.steps, loss=full_loss,
              params=sum(t.numel() for t in model.parameters()),
              digest=hashlib.sha256(weights).hexdigest(), step_times=step_times, gns=records)
if a.comm == "switch":  # where the collectives ran: AGGSWITCH_MODE, AGGSWITCH_FALLBACK and the state's counters
    st = state.stats()
    result["path"] = dict(mode=state.mode, fallback=state.fallback, **{k: st[k] for k in (
        "path", "switch_collectives", "host_collectives", "fallbacks", "returns", "failed_returns", "last_fallback_reason",
        "last_fallback_timing")})
    if "threads" in st:  # the worker threads that carried the last collective (scripts/bench train --worker-threads)
        result["path"]["threads"] = st["threads"]
print(f"rank {rank}: loss over all {len(x)} samples {full_loss:.4f}, weights sha256 {result['digest'][:16]}", flush=True)
if a.out:
    with open(a.out, "w") as f:
        json.dump(result, f)
if a.adaptive and log:
    log.close()
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
