"""per_packet.py: the `per-packet` scenario: the cost of one DATA packet
through the switch's engine against a plain copy of its payload
(criterion, in memory, no I/O, no root).

It runs `cargo bench -p agg-proto --bench data_path -- data_packet`
(proto/benches/data_path.rs) pinned to one CPU; bench_per_packet_report.py
reads criterion's medians and writes the JSON and the table.
"""

import os
import shutil
import subprocess

from lifecycle import REPO_ROOT, RESULTS_DIR, HarnessError, log, run_report, stamp, tail
from machine import nproc
from options import uint_range
from scenario import Option, Scenario

DESCRIPTION = """\
For 64, 256, 362 and 870 float32 per packet:
  engine    header parse + validation + JobTable::handle, per packet of a
            4-rank job;
  copy      a copy of the same payload into one buffer: the limit;
  sum_only  the engine's arithmetic alone, without any protocol work;
and reports criterion's median per benchmark, engine / copy (the goal is
<= 1.5) and sum_only / copy."""


def run(a):
    if shutil.which("taskset") is None:
        raise HarnessError("taskset not found (apt-get install util-linux)")
    cpu = nproc() - 1 if a.cpu is None else a.cpu
    if cpu >= nproc():
        raise HarnessError(f"--cpu must be 0..{nproc() - 1} (this machine's CPUs), got {cpu}")
    out_dir = REPO_ROOT / "target" / "criterion" / "data_packet"
    crit_log = REPO_ROOT / "target" / "criterion" / "bench_per_packet.log"
    # Stale estimates from an earlier run must not stand in for a failed one.
    shutil.rmtree(out_dir, ignore_errors=True)
    crit_log.parent.mkdir(parents=True, exist_ok=True)
    log(f"criterion data_path (data_packet), {a.secs} s per benchmark, pinned to CPU {cpu} (log: {crit_log})")
    bench = ["cargo", "bench", "-q", "-p", "agg-proto", "--bench", "data_path"]
    with open(crit_log, "w") as f:
        steps = [(bench + ["--no-run"], "cargo bench --no-run"),
                 (["taskset", "-c", str(cpu), *bench, "--", "data_packet", "--warm-up-time", "1",
                   "--measurement-time", str(a.secs)], "cargo bench -p agg-proto --bench data_path")]
        for argv, what in steps:
            if subprocess.run(argv, cwd=REPO_ROOT, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
                raise HarnessError(f"{what} failed:\n{tail(crit_log, 20)}")
    json_out = a.json or RESULTS_DIR / f"bench-per-packet-{stamp()}.json"
    os.makedirs(os.path.dirname(os.path.abspath(json_out)), exist_ok=True)
    run_report("bench_per_packet_report.py", [out_dir, "--secs", a.secs, "--cpu", cpu, "--json", json_out])
    log(f"wrote {json_out}")
    return 0


SCENARIO = Scenario(
    name="per-packet",
    summary="engine cost of one DATA packet against a copy of its payload (criterion, no root)",
    description=DESCRIPTION,
    run=run,
    options=(
        Option("--json", "write the results as JSON here (default bench/results/bench-per-packet-STAMP.json)",
               type=str, metavar="FILE"),
        Option("--secs", "criterion measurement time per benchmark", type=uint_range(1, 600), default=3),
        Option("--cpu", "pin the benchmark to CPU N (default: the last CPU)", type=uint_range(0, 4095),
               metavar="N"),
    ),
)
