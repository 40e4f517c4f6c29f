"""perf_paths.py: where the switch's CPU goes, by path, from a `perf record
-a -g` profile: each sample of the workers (comm `worker`) and of switchd's
dataplane threads (comm `dataplane-N`) is put in one path by its kernel
call chain, and its leaf function in one kind of work. The efficiency
scenario's `--profile` writes the table as profile-paths.txt
(docs/BENCHMARKS.md, "Where the time goes").

Paths (the first that matches, from the chain's root side):
* pagefault: under asm_exc_page_fault (a new buffer's first touch);
* recv: in a receive syscall (recvmmsg, recvmsg, recvfrom);
* send+peer: in a send syscall (sendmmsg, sendmsg, sendto), in the softirq
  that delivers the frame to its receiver: on veth the sender's transmit
  runs the receiver's side (a worker's DATA: switchd's XDP program and the
  copy into its AF_XDP socket; switchd's RESULT: the worker's UDP receive);
* send: the rest of a send syscall (the worker's copy from user space, UDP
  segmentation; switchd's copy-mode AF_XDP transmit);
* poll: in poll(2) (waiting, wake-ups);
* kernel: other kernel work; user: user space (by leaf symbol).
Kinds of leaf: copy+csum (a copy that sums the UDP checksum on the way),
kcopy (a kernel copy), csum (a checksum pass), memmove (libc's), other.

Shares are of the samples of those processes together (the switch's
share of the machine is printed first). `shares` gives the four numbers
the efficiency report needs to tell each side's own work from its peer's
(profile-paths.json): each process's share, and the share of it that is
its peer's receive (send+peer). Untimed work is in the profile
too: `worker allreduce` fills its input and touches its buffers before
the timed all-reduces (the `worker::allreduce` symbol and most page
faults).
"""

import collections
import json
import re
import subprocess

SEND = ("__x64_sys_sendmmsg", "__x64_sys_sendmsg", "__x64_sys_sendto", "__sys_sendmsg")
RECV = ("__x64_sys_recvmmsg", "__x64_sys_recvmsg", "__x64_sys_recvfrom")
PEER = ("net_rx_action", "veth_poll", "veth_xdp_rcv")
POLL = ("__x64_sys_poll", "__x64_sys_ppoll", "do_sys_poll")
KCOPY = ("__pi_memcpy", "memcpy_orig", "rep_movs_alternative", "copy_user_generic", "_copy_to_iter",
         "_copy_from_iter", "skb_copy_bits")
HEAD = re.compile(r"^(\S.*?)\s+\d+\s+\[\d+\]")


def ours(comm):
    return comm == "worker" or comm.startswith("dataplane-")


def path_of(chain):
    """The path of a sample whose frames (leaf first) are chain: (symbol, kernel?)."""
    names = {s for s, _ in chain}
    if "asm_exc_page_fault" in names:
        return "pagefault"
    if names & set(RECV):
        return "recv"
    if names & set(SEND):
        return "send+peer" if names & set(PEER) else "send"
    if names & set(POLL):
        return "poll"
    return "kernel" if chain and chain[0][1] else "user"


def kind_of(leaf):
    if leaf.startswith("csum_partial_copy") or leaf.startswith("csum_and_copy"):
        return "copy+csum"
    if leaf in KCOPY:
        return "kcopy"
    if leaf.startswith(("csum_partial", "do_csum", "skb_checksum")):
        return "csum"
    if "memmove" in leaf or "memcpy" in leaf:
        return "memmove"
    return "other"


def samples(lines):
    """(comm, chain) per sample of `perf script` output lines."""
    comm, chain = None, []
    for line in lines:
        if not line.strip():
            if comm is not None:
                yield comm, chain
            comm, chain = None, []
        elif not line[0].isspace():
            m = HEAD.match(line)
            comm = m.group(1) if m else line.split()[0]
        else:
            parts = line.strip().split(None, 2)
            if len(parts) >= 2:
                chain.append((re.sub(r"\+0x[0-9a-f]+$", "", parts[1]),
                              "kernel" in (parts[2] if len(parts) > 2 else "")))
    if comm is not None:
        yield comm, chain


def count(lines):
    """(all samples, by (who, path), by (who, path, kind), by (who, path,
    leaf)) of `perf script` output lines; who: worker or switchd dataplane."""
    total = 0
    by = collections.Counter()
    kinds = collections.Counter()
    leaves = collections.Counter()
    for comm, chain in samples(lines):
        total += 1
        if not ours(comm):
            continue
        who = "worker" if comm == "worker" else "switchd dataplane"
        p = path_of(chain)
        leaf = chain[0][0] if chain else "?"
        by[(who, p)] += 1
        kinds[(who, p, "user: " + leaf if p == "user" and kind_of(leaf) == "other" else kind_of(leaf))] += 1
        leaves[(who, p, leaf)] += 1
    return total, by, kinds, leaves


def shares(by):
    """Of the workers' and switchd's samples together: the workers' share,
    switchd's, and the part of each that is its peer's receive (send+peer:
    on veth switchd's receive of a DATA runs in the worker's send, the
    worker's receive of a RESULT in switchd's). None without samples."""
    n = sum(by.values())
    if not n:
        return None

    def of(who, path=None):
        return sum(v for (h, p), v in by.items() if h == who and path in (None, p)) / n

    return {"samples": n, "worker": of("worker"), "switchd": of("switchd dataplane"),
            "worker_peer": of("worker", "send+peer"), "switchd_peer": of("switchd dataplane", "send+peer")}


def table(lines):
    """The profile-paths.txt text for `perf script` output lines."""
    total, by, kinds, leaves = count(lines)
    n = sum(by.values())
    if not n:
        return "no samples of the workers or switchd's dataplane threads\n"
    out = [f"samples: {total}; workers and switchd's dataplane threads: {n} ({100 * n / total:.1f} %)",
           "shares: % of those processes' samples", ""]
    for who in ("worker", "switchd dataplane"):
        w = sum(v for (h, _), v in by.items() if h == who)
        out.append(f"{who}: {100 * w / n:.1f} %")
        for (h, p), v in sorted(by.items(), key=lambda kv: -kv[1]):
            if h != who:
                continue
            top = sorted(((k, c) for (hh, pp, k), c in kinds.items() if hh == who and pp == p), key=lambda x: -x[1])
            detail = ", ".join(f"{k} {100 * c / n:.1f}" for k, c in top[:5] if 100 * c / n >= 0.1)
            out.append(f"  {p:10s} {100 * v / n:5.1f}   {detail}")
        out.append("")
    out.append("top leaf functions (% of those processes' samples):")
    for (h, p, leaf), v in leaves.most_common(25):
        out.append(f"  {100 * v / n:5.1f}  {h:17s} {p:10s} {leaf}")
    return "\n".join(out) + "\n"


def write(data, path):
    """Writes the table for perf data file `data` to `path` (a .txt), and
    its `shares` beside it (the same name, .json); False when `perf script`
    failed."""
    r = subprocess.run(["perf", "script", "-i", str(data)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                       text=True, errors="replace")
    if r.returncode:
        return False
    lines = r.stdout.splitlines()
    with open(path, "w") as f:
        f.write(table(lines))
    with open(path.with_suffix(".json"), "w") as f:
        json.dump(shares(count(lines)[1]), f)
        f.write("\n")
    return True
