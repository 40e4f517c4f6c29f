//! End-to-end tests of the worker's UDP data paths through a real switchd
//! on AF_XDP: `mmsg`, `udp-gso` and `auto` each all-reduce bit-exactly, and
//! the worker's JSON says which one ran. The testbed keeps transmit checksum
//! offload off on the workers' eth0 (as for every e2e test), which UDP GSO
//! on this kernel works with: `auto` must pick `udp-gso` there.

use std::process::Child;

use agg_e2e::*;

/// Elements per chunk at MTU 1500: (1500 − 50) / 4 floats less the
/// RESULT's 16-byte token.
const E: usize = 358;
/// A tensor of many full chunks and a short last one.
const ELEMENTS: usize = 1_000_003;
const ITERATIONS: u32 = 2;

fn spawn(tb: &Testbed, rank: u16, transport: &str) -> Child {
    let ns = tb.worker_ns(rank);
    let mut c = allreduce_cmd(tb, &ns, 1, rank, 4, ELEMENTS, ITERATIONS, 20);
    c.args(["--transport", transport]);
    spawn_piped(c)
}

#[test]
#[ignore = "needs root"]
fn every_transport_all_reduces_bit_exact_through_switchd_and_says_which_ran() {
    if !can_run("transports") {
        return;
    }
    let tb = Testbed::up("e2g", 4, 0);
    let offload = tb
        .cmd_in(&tb.worker_ns(0), "ethtool")
        .args(["-k", "eth0"])
        .output()
        .expect("running ethtool");
    let offload = String::from_utf8_lossy(&offload.stdout);
    assert!(
        offload.contains("tx-checksumming: off"),
        "the testbed must keep transmit checksum offload off on the workers:\n{offload}"
    );
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 4)]);
    let runs = [
        ("mmsg", "mmsg"),
        ("udp-gso", "udp-gso"),
        ("auto", "udp-gso"),
    ];
    for (flag, want) in runs {
        let reports = expect_verified((0..4).map(|r| spawn(&tb, r, flag)).collect());
        for (rank, r) in reports.iter().enumerate() {
            assert_eq!(r["transport"], want, "--transport {flag}, rank {rank}: {r}");
            let coalesced = r["stats"]["tx_coalesced"].as_u64().unwrap();
            assert_eq!(
                coalesced > 0,
                want == "udp-gso",
                "--transport {flag}, rank {rank}: DATA in super-datagrams only with udp-gso: {r}"
            );
        }
    }
    let stats = stop_clean(&tb, &mut sw);
    let j = job(&stats, 1);
    let chunks = (runs.len() as u64) * u64::from(ITERATIONS) * ELEMENTS.div_ceil(E) as u64;
    assert_eq!(j["chunks_completed"].as_u64().unwrap(), chunks, "{j}");
    assert_eq!(stats["malformed_total"], 0, "{stats}");
}
