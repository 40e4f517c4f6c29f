#!/usr/bin/env python3
"""gns_plot.py: a gradient noise scale curve from a short adaptive training.

Usage: .venv/bin/python bench/harness/gns_plot.py [--png bench/results/gns-curve.png]
           [--log FILE.jsonl] [--workers 4] [--steps 200] [--batch 8]
           [--max-batch 128] [--seed 0] [--from-log FILE.jsonl]

Starts the loopback stand-in switch (aggswitch.LoopbackSwitch, a stats job;
no root) in this process, runs examples/train_ddp.py --adaptive under
torchrun (CPU, one rank per process) against it, and plots rank 0's
per-step records: B_noise (smoothed tr Σ / |G|²) and the global batch over
the steps, the learning rate beside them. With --from-log it only plots a
log written earlier (train_ddp.py --adaptive --gns-log, e.g. from a testbed run).

Needs the venv's torch, scikit-learn and matplotlib (scripts/setup.sh).
"""

import argparse
import json
import math
import os
import secrets
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train(a, log):
    """Runs the adaptive training against a loopback stats switch; rank 0
    writes its records to `log`."""
    import aggswitch

    secret = secrets.token_hex(32)
    with aggswitch.LoopbackSwitch(job=1, world_size=a.workers, secret=secret, stats=True) as sw:
        env = dict(os.environ, AGGSWITCH_SWITCH=sw.address, AGGSWITCH_JOB="1", AGGSWITCH_SECRET=secret,
                   OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={a.workers}",
               os.path.join(ROOT, "examples", "train_ddp.py"), "--comm", "switch", "--adaptive",
               "--steps", str(a.steps), "--batch", str(a.batch), "--max-batch", str(a.max_batch),
               "--seed", str(a.seed), "--gns-log", log]
        print("gns_plot.py:", " ".join(cmd), file=sys.stderr)
        r = subprocess.run(cmd, env=env, cwd=ROOT)
        if r.returncode != 0:
            sys.exit(f"gns_plot.py: the training failed (exit status {r.returncode}); its output is above")


def read(log):
    with open(log) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    if not recs:
        sys.exit(f"gns_plot.py: {log} holds no records; was it written by train_ddp.py --adaptive --gns-log?")
    return recs


def plot(recs, png, title):
    try:
        import matplotlib
    except ImportError:
        sys.exit("gns_plot.py: matplotlib is missing; install the venv with scripts/setup.sh")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in recs]
    # B_noise is infinite while the smoothed |G|² is not positive: not drawn.
    bn = [r["b_noise"] if r["b_noise"] is not None and math.isfinite(r["b_noise"]) and r["b_noise"] > 0 else math.nan
          for r in recs]
    fig, (ax, ax_lr) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=[3, 1])
    ax.plot(steps, bn, label="B_noise (EMA tr Σ / EMA |G|², samples)", color="tab:blue")
    ax.step(steps, [r["global_batch"] for r in recs], where="post", label="global batch (n × per-rank)",
            color="tab:orange")
    ax.set_yscale("log")
    ax.set_ylabel("samples")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    ax_lr.step(steps, [r["lr"] for r in recs], where="post", color="tab:green")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("step")
    ax_lr.grid(True, alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=100)
    print(f"gns_plot.py: wrote {png} ({len(recs)} steps; final global batch {recs[-1]['global_batch']}, "
          f"B_noise {recs[-1]['b_noise']:.1f})", file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--png", default=os.path.join(ROOT, "bench", "results", "gns-curve.png"))
    p.add_argument("--log", help="keep rank 0's records here (default: a temporary file)")
    p.add_argument("--from-log", help="plot this log instead of training")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=8, help="first samples per rank and step")
    p.add_argument("--max-batch", type=int, default=128, help="largest samples per rank and step")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.from_log:
        recs = read(a.from_log)
        title = f"Gradient noise scale: {a.from_log}"
    else:
        if a.workers < 2:
            p.error("--workers must be at least 2: the noise scale compares one rank's gradient with the sum")
        with tempfile.TemporaryDirectory() as tmp:
            log = a.log or os.path.join(tmp, "gns.jsonl")
            train(a, log)
            recs = read(log)
        title = (f"examples/train_ddp.py --adaptive: {a.workers} ranks, MLP on digits, loopback stats switch\n"
                 f"per-rank batch {a.batch} (at most {a.max_batch}), grown ×2 while global < B_noise; lr ∝ √batch")
    plot(recs, a.png, title)


if __name__ == "__main__":
    main()
