"""bench/harness/perf_paths.py: samples of `perf script` put in the path
their kernel call chain names (docs/BENCHMARKS.md, "Where the time goes")."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "harness"))
import perf_paths  # noqa: E402

K = "([kernel.kallsyms])"
SCRIPT = f"""worker 10 [000] 1.000: 250000 cpu-clock:ppp:
\tffffffff81 __pi_memcpy+0x1 {K}
\tffffffff82 __xsk_rcv+0x2 {K}
\tffffffff83 veth_xdp_rcv+0x3 {K}
\tffffffff84 net_rx_action+0x4 {K}
\tffffffff85 __x64_sys_sendmmsg+0x5 {K}
\t10ac10 __sendmmsg+0x10 (/usr/lib/x86_64-linux-gnu/libc.so.6)

worker 10 [000] 1.001: 250000 cpu-clock:ppp:
\tffffffff81 csum_partial_copy_generic+0x1 {K}
\tffffffff85 __x64_sys_sendmmsg+0x5 {K}

worker 10 [001] 1.002: 250000 cpu-clock:ppp:
\tffffffff81 csum_partial_copy_generic+0x1 {K}
\tffffffff86 __x64_sys_recvmmsg+0x5 {K}

worker 10 [001] 1.003: 250000 cpu-clock:ppp:
\t12345 __memmove_avx512_unaligned_erms+0x5 (/usr/lib/x86_64-linux-gnu/libc.so.6)

dataplane-0 11 [001] 1.004: 250000 cpu-clock:ppp:
\tffffffff87 clear_page_erms+0x1 {K}
\tffffffff88 asm_exc_page_fault+0x22 {K}
\t12345 proto::switch::engine::SlotEngine::contribute_in+0x5 (/usr/bin/switchd)

rustc 12 [000] 1.005: 250000 cpu-clock:ppp:
\t12345 rustc_main+0x5 (/usr/bin/rustc)
"""


def test_each_sample_goes_to_the_path_its_chain_names():
    got = {(c, perf_paths.path_of(ch), perf_paths.kind_of(ch[0][0]))
           for c, ch in perf_paths.samples(SCRIPT.splitlines())}
    assert got == {
        ("worker", "send+peer", "kcopy"),
        ("worker", "send", "copy+csum"),
        ("worker", "recv", "copy+csum"),
        ("worker", "user", "memmove"),
        ("dataplane-0", "pagefault", "other"),
        ("rustc", "user", "other"),
    }


def test_the_table_counts_only_the_switch_processes_in_its_shares():
    t = perf_paths.table(SCRIPT.splitlines())
    assert t.startswith("samples: 6; workers and switchd's dataplane threads: 5 (83.3 %)")
    assert "worker: 80.0 %" in t and "switchd dataplane: 20.0 %" in t
    assert "  send+peer   20.0   kcopy 20.0" in t
    assert "rustc" not in t


def test_a_profile_without_the_switch_says_so():
    assert perf_paths.table(["rustc 1 [000] 1.0: 1 cpu-clock:", "\t1 main+0x1 (/x)", ""]).startswith("no samples")


def test_shares_give_each_side_and_its_peers_receive():
    # Of the 5 samples of ours: 4 the workers' (1 of them switchd's receive
    # of a DATA, run in the worker's send), 1 switchd's (none its peer's).
    _, by, _, _ = perf_paths.count(SCRIPT.splitlines())
    s = perf_paths.shares(by)
    assert s == {"samples": 5, "worker": 0.8, "switchd": 0.2, "worker_peer": 0.2, "switchd_peer": 0.0}
    assert perf_paths.shares(perf_paths.count([])[1]) is None
