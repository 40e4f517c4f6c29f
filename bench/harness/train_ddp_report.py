#!/usr/bin/env python3
"""train_ddp_report.py: `scripts/demo ddp`'s verdict (demos/ddp.py):
each rank's loss, weight digest and median step time, and whether every
rank ended with the same weights (exit status 1 if not).

Usage: train_ddp_report.py RANK_JSON...
"""
import json, sys
runs = sorted((json.load(open(p)) for p in sys.argv[1:]), key=lambda r: r["rank"])
for r in runs:
    med = sorted(r["step_times"])[len(r["step_times"]) // 2]
    print(f"rank {r['rank']}: loss {r['loss']:.4f}  weights sha256 {r['digest'][:16]}  median step {med * 1e3:.1f} ms")
same = len({r["digest"] for r in runs}) == 1
print("TRAIN PASSED: every rank ended with the same weights" if same else "TRAIN FAILED: the ranks' weights differ")
sys.exit(0 if same else 1)
