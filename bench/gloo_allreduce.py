"""gloo_allreduce.py: PyTorch's gloo all-reduce, the peer a PyTorch user on
CPUs would run instead of the switch (scripts/bench efficiency).

One process per rank, started in its worker namespace with RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT and GLOO_SOCKET_IFNAME set. Every rank fills a
float32 tensor with small integers (sums are exact in any order), runs one
warm-up all-reduce, then K timed ones, each between a barrier and an
all-reduce of the ranks' times (MAX), as bench/mpi_allreduce.c does. Rank 0
prints one JSON object with the same fields as mpi_allreduce:

    {"ranks":4,"elements":...,"bytes":...,"iterations":K,"best_s":...,
     "median_s":...,"mean_s":...,"worst_s":...,"times_s":[...],
     "machine_busy_cpu_s":...,"verified":true}

"machine_busy_cpu_s" is the whole machine's busy CPU time (/proc/stat:
every CPU, kernel and softirq included) over the timed all-reduces only, so
the start-up (importing torch costs seconds) is not charged to gloo.
"workers_cpu_s" is the ranks' own CPU time (time.process_time: user +
system of every thread) over the same all-reduces, summed over ranks.

With DTYPE bf16, each timed all-reduce is what PyTorch's
`bf16_compress_hook` does to a float32 gradient: cast to bfloat16,
all-reduce in bfloat16, cast back, all three timed (the peer of the
switch's bf16 job; the sums of small integers stay exact).

Usage: python gloo_allreduce.py ELEMENTS ITERATIONS [f32|bf16]
"""

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

# /proc/stat counts in USER_HZ ticks, fixed at 100 for user space.
USER_HZ = 100.0


def machine_busy_cpu_s() -> float:
    """User, nice, system, irq, softirq and steal of /proc/stat's cpu line."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = f.readline().split()
    if fields[0] != "cpu" or len(fields) < 9:
        raise RuntimeError(f"/proc/stat's first line is not the cpu total: {fields!r}")
    v = [int(x) for x in fields[1:9]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / USER_HZ


def fill(rank: int, elements: int) -> torch.Tensor:
    """(rank + 1) * (i % 7 + 1): small integers, as mpi_allreduce.c."""
    return ((torch.arange(elements, dtype=torch.int64) % 7 + 1) * (rank + 1)).to(torch.float32)


def main() -> int:
    if len(sys.argv) not in (3, 4) or sys.argv[3:] not in ([], ["f32"], ["bf16"]):
        print(f"usage: {sys.argv[0]} ELEMENTS ITERATIONS [f32|bf16]", file=sys.stderr)
        return 2
    elements, iterations = int(sys.argv[1]), int(sys.argv[2])
    bf16 = sys.argv[3:] == ["bf16"]
    if not (0 < elements <= 1 << 30 and 0 < iterations <= 100000):
        print("ELEMENTS must be 1..2^30 and ITERATIONS 1..100000", file=sys.stderr)
        return 2
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    template = fill(rank, elements)
    buf = template.clone()

    def reduce() -> None:
        if bf16:
            half = buf.to(torch.bfloat16)
            dist.all_reduce(half)
            buf.copy_(half)
        else:
            dist.all_reduce(buf)

    reduce()  # warm-up: connections are made on first use
    times, busy, own = [], 0.0, 0.0
    for _ in range(iterations):
        buf.copy_(template)
        dist.barrier()
        busy0 = machine_busy_cpu_s() if rank == 0 else 0.0
        own0 = time.process_time()
        t0 = time.perf_counter()
        reduce()
        slowest = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        own += time.process_time() - own0
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        times.append(slowest.item())
        if rank == 0:
            busy += machine_busy_cpu_s() - busy0
    want = (torch.arange(elements, dtype=torch.int64) % 7 + 1) * (size * (size + 1) // 2)
    ok = torch.tensor([int(torch.equal(buf, want.to(torch.float32)))], dtype=torch.int32)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    workers = torch.tensor([own], dtype=torch.float64)
    dist.all_reduce(workers)
    if rank == 0:
        s = sorted(times)
        print(
            json.dumps(
                {
                    "ranks": size,
                    "elements": elements,
                    "bytes": elements * (2 if bf16 else 4),
                    "dtype": "bf16" if bf16 else "f32",
                    "iterations": iterations,
                    "best_s": s[0],
                    "median_s": statistics.median(s),
                    "mean_s": sum(s) / len(s),
                    "worst_s": s[-1],
                    "times_s": times,
                    "machine_busy_cpu_s": round(busy, 2),
                    "workers_cpu_s": round(workers.item(), 3),
                    "torch": torch.__version__,
                    "verified": bool(ok.item()),
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()
    return 0 if ok.item() else 3


if __name__ == "__main__":
    sys.exit(main())
