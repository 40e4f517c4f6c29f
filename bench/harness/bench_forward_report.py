#!/usr/bin/env python3
"""bench_forward_report.py: `scripts/bench forward`'s summary: the
median over rounds of each setup's TCP throughput (iperf3) and UDP round
trip percentiles (sockperf), the ratios against the plain bridge, the
fast-path counter checks, the JSON and the table.

Usage: bench_forward_report.py WORK JSON_OUT ROUNDS SECS MSG_SIZE STAMP ATTACH_MODE SETUP...
"""
import json, os, platform, re, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import median  # noqa: E402

work, out, rounds, secs, msg, stamp, attach = sys.argv[1:8]
setups = sys.argv[8:]
rounds, secs, msg = int(rounds), int(secs), int(msg)
ansi = re.compile(r"\x1b\[[0-9;]*m")

def sockperf(path):
    text = ansi.sub("", open(path).read())
    def pct(p):
        m = re.search(r"percentile %s = +([0-9.]+)" % re.escape(p), text)
        if not m:
            sys.exit("no percentile %s in %s" % (p, path))
        return float(m.group(1))
    avg = re.search(r"avg-rtt=([0-9.]+)", text)
    return {"p50_us": pct("50.000"), "p99_us": pct("99.000"), "p99_9_us": pct("99.900"),
            "avg_us": float(avg.group(1)) if avg else None}

def iperf(path):
    d = json.load(open(path))
    end = d["end"]
    return {"gbps": end["sum_received"]["bits_per_second"] / 1e9,
            "retransmits": end["sum_sent"].get("retransmits", 0)}

def counters(path):
    if not os.path.exists(path):
        return None
    s = json.load(open(path))
    keys = ["xdp_forwarded", "xdp_passed", "xdp_steered"]
    return {k: sum(p.get(k, 0) for p in s["ports"]) for k in keys}

res = {}
for s in setups:
    runs = []
    for r in range(1, rounds + 1):
        base = os.path.join(work, "%s-%d" % (s, r))
        run = {"round": r, "tcp": iperf(base + ".iperf.json"),
               "udp_rtt": sockperf(base + ".sockperf.txt")}
        if os.path.exists(base + ".sockperf-x.txt"):
            run["udp_rtt_cross_cpu"] = sockperf(base + ".sockperf-x.txt")
        c = counters(base + ".stats.json")
        if c is not None:
            run["xdp_counters"] = c
        runs.append(run)
    med = lambda f: median([f(x) for x in runs])
    res[s] = {
        "tcp_gbps": med(lambda x: x["tcp"]["gbps"]),
        "tcp_retransmits": med(lambda x: x["tcp"]["retransmits"]),
        "rtt_p50_us": med(lambda x: x["udp_rtt"]["p50_us"]),
        "rtt_p99_us": med(lambda x: x["udp_rtt"]["p99_us"]),
        "rtt_p99_9_us": med(lambda x: x["udp_rtt"]["p99_9_us"]),
        "runs": runs,
    }
    if all("udp_rtt_cross_cpu" in x for x in runs):
        for k in ("p50", "p99", "p99_9"):
            res[s]["rtt_cross_cpu_%s_us" % k] = med(lambda x: x["udp_rtt_cross_cpu"]["%s_us" % k])

base = res["bridge"]
for s in setups:
    r = res[s]
    r["ratio_vs_bridge"] = {
        "tcp_gbps": r["tcp_gbps"] / base["tcp_gbps"],
        "rtt_p50": r["rtt_p50_us"] / base["rtt_p50_us"],
        "rtt_p99": r["rtt_p99_us"] / base["rtt_p99_us"],
        "rtt_p99_9": r["rtt_p99_9_us"] / base["rtt_p99_9_us"],
    }
    if "rtt_cross_cpu_p50_us" in r:
        for k in ("p50", "p99", "p99_9"):
            key = "rtt_cross_cpu_%s_us" % k
            r["ratio_vs_bridge"]["rtt_cross_cpu_" + k] = r[key] / base[key]

# The fast path must have carried the traffic, the pass path none of it.
problems = []
for run in res.get("xdp-pass", {}).get("runs", []):
    if run["xdp_counters"]["xdp_forwarded"] != 0:
        problems.append("xdp-pass round %d forwarded frames" % run["round"])
for run in res.get("xdp-fwd", {}).get("runs", []):
    c = run["xdp_counters"]
    if c["xdp_forwarded"] < c["xdp_passed"]:
        problems.append("xdp-fwd round %d: fast path forwarded %d, passed %d"
                        % (run["round"], c["xdp_forwarded"], c["xdp_passed"]))

doc = {
    "benchmark": "forwarding",
    "stamp": stamp,
    "kernel": platform.release(),
    "cpus": os.cpu_count(),
    "secs_per_test": secs,
    "rounds": rounds,
    "sockperf_msg_size": msg,
    "statistic": "median over rounds; RTT percentiles are round trips (sockperf --full-rtt); rtt_*: client and server pinned to the same CPU, rtt_cross_cpu_*: to different CPUs",
    "xdp_attach": attach,
    "setups": {
        "bridge": "plain Linux bridge, no switchd",
        "xdp-pass": "switchd, forwarding = \"bridge\": XDP_PASS into the bridge",
        "xdp-fwd": "switchd, forwarding = \"xdp\": DEVMAP fast path",
    },
    "results": res,
    "problems": problems,
}
with open(out, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")

print("forwarding benchmark (%s; %d rounds x %d s; median; RTT of %d-byte UDP)" % (attach or "?", rounds, secs, msg))
print("%-9s %10s %7s %10s %10s %11s %8s %8s %8s" % (
    "setup", "TCP Gb/s", "x br", "p50 us", "p99 us", "p99.9 us", "p50 x", "p99 x", "p99.9 x"))
for s in setups:
    r = res[s]; q = r["ratio_vs_bridge"]
    print("%-9s %10.2f %7.2f %10.1f %10.1f %11.1f %8.2f %8.2f %8.2f" % (
        s, r["tcp_gbps"], q["tcp_gbps"], r["rtt_p50_us"], r["rtt_p99_us"], r["rtt_p99_9_us"],
        q["rtt_p50"], q["rtt_p99"], q["rtt_p99_9"]))
if "rtt_cross_cpu_p50_us" in base:
    print("cross-CPU latency (client and server on different CPUs; median):")
    print("%-9s %10s %10s %11s %8s %8s %8s" % (
        "setup", "p50 us", "p99 us", "p99.9 us", "p50 x", "p99 x", "p99.9 x"))
    for s in setups:
        r = res[s]; q = r["ratio_vs_bridge"]
        print("%-9s %10.1f %10.1f %11.1f %8.2f %8.2f %8.2f" % (
            s, r["rtt_cross_cpu_p50_us"], r["rtt_cross_cpu_p99_us"], r["rtt_cross_cpu_p99_9_us"],
            q["rtt_cross_cpu_p50"], q["rtt_cross_cpu_p99"], q["rtt_cross_cpu_p99_9"]))
print("results: %s" % out)
for p in problems:
    print("PROBLEM: " + p)
sys.exit(1 if problems else 0)
