"""soak.py: the `soak` scenario: a long run of three concurrent jobs
through one switchd with 1 % packet loss on every worker link, to catch
what short tests do not: leaks, slow drift, rare hangs, wrong sums (root).

The loss is scripts/impair.sh's (a tc-BPF program on each worker's eth0,
both ways); the rounds, the checks and the summary are here.
"""

import json
import subprocess
import tempfile
import time
from pathlib import Path

from lifecycle import (REPO_ROOT, HarnessError, Processes, Testbed, log, random_secret, release_binary,
                       run_checked, start_switchd, tail, thread_args, write_switchd_config)
from options import uint_range
from scenario import Option, Scenario
from tools import build_release

PREFIX = "soak"
WORKERS = 6
JOBS = 3
AGG_PORT = 48879
ELEMENTS = 1000000
ITERATIONS = 5
LOSS_PCT = 1
ROUND_TIMEOUT = 300
IMPAIR = REPO_ROOT / "scripts" / "impair.sh"

DESCRIPTION = """\
Testbed "soak" (6 workers), 1 % of the frames dropped in each direction of
every worker link, switchd with three jobs (job J: workers 2(J-1) and
2(J-1)+1, their /32s only, its own secret), then rounds until MINUTES have
passed: the three jobs at once, every worker `allreduce --elements 1000000
--iterations 5 --verify`. Fails at once when a worker exits non-zero,
reports verified != true, or takes longer than 300 s. Prints rounds,
collectives verified, switchd's VmRSS (after ready, after round 1, at the
end), the per-job counters and the frames dropped. Exits 0 only if every
collective verified and frames were dropped both ways. Logs kept on failure.
`--worker-threads T` carries each collective on T threads of every worker
(`--threads T`, switchd's seq_lanes >= T): loss, resends and the lanes'
straggler hold over a long run."""


def impair(ns, *args):
    return run_checked(["bash", IMPAIR, ns, "eth0", *map(str, args)], f"scripts/impair.sh {ns} eth0").stdout


def dropped_frames(ingress):
    """(dropped, seen) summed over the workers' eth0, from impair.sh --stats."""
    dropped = seen = 0
    for i in range(WORKERS):
        for kv in impair(f"{PREFIX}-w{i}", "--stats", *(["--ingress"] if ingress else [])).split():
            k, _, v = kv.partition("=")
            if k == "dropped":
                dropped += int(v)
            elif k == "seen":
                seen += int(v)
    return dropped, seen


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise HarnessError(f"no VmRSS for pid {pid}")


def job_line(j):
    drops = ",".join(f"{k}={v}" for k, v in (j.get("drops") or {}).items() if v > 0) or "none"
    return (f"  job {j['id']}: {j['state']}, chunks {j['chunks_completed']}, bytes {j['bytes_aggregated']}, "
            f"contributions {j['contributions']}, results {j['results_sent']}, retransmits served "
            f"{j['retransmits_served']}, joins {j['joins']}, activations {j['activations']}, nacks {j['nacks']}, "
            f"drops {drops}")


def run(a):
    build_release()
    switchd, worker = release_binary("switchd"), release_binary("worker")
    work = Path(tempfile.mkdtemp(prefix="agg-soak."))
    cfg, stats, swlog = work / "switchd.toml", work / "stats.json", work / "switchd.log"
    worker_threads, lane_sets = thread_args(a.worker_threads)
    passed = False
    try:
        with Testbed(PREFIX, ["--workers", WORKERS], work) as tb, Processes() as procs:
            for i in range(WORKERS):
                impair(f"{PREFIX}-w{i}", "--udp-port", AGG_PORT, "--loss", LOSS_PCT)
                impair(f"{PREFIX}-w{i}", "--udp-port", AGG_PORT, "--loss", LOSS_PCT, "--ingress")
            log(f"{LOSS_PCT} % loss on both directions of {PREFIX}-w0..{PREFIX}-w{WORKERS - 1} (scripts/impair.sh)")
            secrets, jobs = {}, []
            for j in range(1, JOBS + 1):
                secrets[j] = random_secret()
                path = work / f"secret{j}"
                path.write_text(secrets[j])
                path.chmod(0o600)
                jobs.append(f"{j}:{2 * (j - 1)}-{2 * (j - 1) + 1}:file:{path}")
            write_switchd_config(switchd, tb, cfg, "scripts/bench soak", jobs=jobs,
                                 sets=[f"switch.agg_port={AGG_PORT}", "switch.summary_interval_secs=5.0", *lane_sets])
            run_checked([switchd, "check-config", "--config", cfg], f"switchd check-config {cfg}")
            log(f"starting switchd in {PREFIX}-sw (log: {swlog})")
            sw = start_switchd(procs, f"{PREFIX}-sw", switchd, swlog, ["run", "--config", cfg, "--stats-file", stats])
            rss_start = rss_kib(sw.pid)
            log(f"switchd ready (pid {sw.pid}), VmRSS {rss_start} KiB")
            rounds = collectives = resent = 0
            rss_round1 = None
            start = time.monotonic()
            while time.monotonic() < start + a.minutes * 60:
                rounds += 1
                ranks = [procs.start([worker, "allreduce", "--switch", tb["switch_addr"], "--job", i // 2 + 1,
                                      "--rank", i % 2, "--workers", 2, "--elements", ELEMENTS, "--iterations",
                                      ITERATIONS, "--verify", "--json", "--stall-timeout", 20, *worker_threads],
                                     ns=f"{PREFIX}-w{i}", env={"AGGSWITCH_SECRET": secrets[i // 2 + 1]},
                                     stdout=work / f"w{i}.json", stderr=work / f"w{i}.log") for i in range(WORKERS)]
                status = procs.wait(ranks, ROUND_TIMEOUT)

                def fail(msg):
                    return HarnessError(f"round {rounds}: {msg}\n---- switchd log (last 20 lines) ----\n{tail(swlog, 20)}")

                for i, s in enumerate(status):
                    who = f"job {i // 2 + 1} rank {i % 2} ({PREFIX}-w{i})"
                    if s == "timeout":
                        raise fail(f"workers still running after {ROUND_TIMEOUT} s")
                    if s != 0:
                        raise fail(f"{who} exited with status {s}:\n{tail(work / f'w{i}.log', 5)}")
                    lines = [ln for ln in (work / f"w{i}.json").read_text().splitlines() if ln.startswith("{")]
                    report = json.loads(lines[-1]) if lines else {}
                    if report.get("verified") is not True:
                        raise fail(f"{who} reported verified={report.get('verified', 'nothing')}")
                    resent += report["stats"]["chunks_resent"]
                collectives += JOBS * ITERATIONS
                rss_round1 = rss_round1 or rss_kib(sw.pid)
                if rounds % 10 == 0:
                    log(f"round {rounds}: {collectives} collectives verified, "
                        f"{int((time.monotonic() - start) // 60)} of {a.minutes} min, VmRSS {rss_kib(sw.pid)} KiB")
            rss_end = rss_kib(sw.pid)
            elapsed = int(time.monotonic() - start)
            d_out, s_out = dropped_frames(False)
            d_in, s_in = dropped_frames(True)
            log(f"stopping switchd (SIGTERM to pid {sw.pid})")
            switchd_rc = procs.stop(sw)

        def mib(k):
            return f"{k / 1024:.1f}"

        print(f"\n=== soak: {a.minutes} min requested, {elapsed // 60} min {elapsed % 60} s run ===")
        print(f"loss:                 {LOSS_PCT} % each way on every worker link: dropped {d_out} of {s_out} "
              f"worker->switch, {d_in} of {s_in} switch->worker aggregation frames")
        print(f"rounds:               {rounds} (3 jobs x 2 ranks x {ELEMENTS} float32 x {ITERATIONS} iterations each, "
              f"{a.worker_threads} thread(s) per rank)")
        print(f"collectives verified: {collectives} (chunks resent by workers: {resent})")
        print(f"switchd VmRSS:        start {mib(rss_start)} MiB, after round 1 {mib(rss_round1)} MiB, end "
              f"{mib(rss_end)} MiB; end/start {rss_end / rss_start:.3f}, end/round 1 {rss_end / rss_round1:.3f}")
        print(f"switchd exit status:  {switchd_rc}")
        if stats.exists() and stats.stat().st_size:
            s = json.loads(stats.read_text())
            print("per-job counters:")
            for j in s.get("jobs", []):
                print(job_line(j))
            keys = ("rx_frames", "tx_frames", "tx_ring_full", "results_sent", "malformed_total", "unknown_job")
            print("switch: " + json.dumps({k: s.get(k) for k in keys}, separators=(",", ":")))
        else:
            print(f"per-job counters: none ({stats} was not written)")
        print()
        if switchd_rc != 0:
            raise HarnessError(f"switchd exited with status {switchd_rc}")
        if not (d_out > 0 and d_in > 0):
            raise HarnessError("no frames were dropped in one direction: the loss was not there")
        passed = True
        print("SOAK PASSED")
    finally:
        if passed:
            subprocess.run(["rm", "-rf", "--", str(work)])
        else:
            log(f"logs, config and outputs kept in {work}")
    return 0


SCENARIO = Scenario(
    name="soak",
    summary="three jobs for MINUTES with 1 % loss on every link: leaks, drift, hangs, wrong sums (root)",
    description=DESCRIPTION,
    run=run,
    needs_root=True,
    options=(Option("minutes", "how long to run, in minutes", type=uint_range(1, 100000), default=10),
             Option("--worker-threads", "threads per worker (worker --threads T, switchd seq_lanes >= T)",
                    type=uint_range(1, 64), default=1, metavar="T")),
)
