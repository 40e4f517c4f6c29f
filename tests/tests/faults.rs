//! Fault-injection end-to-end tests: the same all-reduce as `e2e.rs`, but
//! with packet loss, duplication and reordering on every worker link, and one
//! job of 64 workers. Each test makes its own testbed (prefix `f3…`) and
//! removes it, also on failure. They need root; under `CI=true` they fail
//! rather than skip when something they need is missing.
//!
//! Where the faults are injected: on `eth0` inside every worker namespace,
//! egress (worker → switch) AND ingress (switch → worker, through an `ifb`
//! device). Not on the switch-side port `sw-wI`: switchd transmits through
//! AF_XDP, which hands frames straight to the driver and never passes the
//! port's egress qdisc (an HTB on `sw-w0` counted 0 packets while its worker
//! received every RESULT), so a qdisc there would impair nothing but bridged
//! traffic.
//!
//! How: with `tc netem` when the kernel has `sch_netem`. A kernel without it
//! (no module, no `CONFIG_NET_SCH_NETEM`; the 6.18 VM this was written on is
//! one) gets an equivalent built from what it does have: a small tc BPF
//! program (compiled here with clang, loaded with `tc … bpf da`) that drops
//! and duplicates aggregation frames at random (`bpf_get_prandom_u32`,
//! `bpf_clone_redirect`) and sends the reordered share through an HTB class
//! limited to 100 Mbit/s (egress: `skb->priority`; ingress: redirect to an
//! `ifb` with that class), so those frames arrive after frames sent later.
//! It impairs only UDP to or from the aggregation port (ARP stays reliable)
//! and counts what it did, which the tests check and print.
//! `AGG_FAULTS_BACKEND=netem|bpf` forces one of the two.
//!
//! Every fault test first runs the same all-reduce on the clean testbed, then
//! impairs it and runs it again, and prints one summary line with both times
//! (`cargo test … -- --nocapture`). Times are printed, never asserted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::Instant;

use agg_e2e::*;

/// 2 MiB of float32 per worker.
const ELEMENTS: usize = 512 * 1024;
const ITERATIONS: u32 = 3;
const WORKERS: u16 = 4;

// ---------------------------------------------------------------------------
// Helpers (the shared ones live in e2e.rs, which is its own crate).

fn under_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// A capability the test needs is missing: a failure under CI, else a skip.
fn unavailable(test: &str, why: &str) {
    if under_ci() {
        panic!("{test}: {why}; under CI=true this is a failure, not a skip");
    }
    eprintln!("SKIPPED {test}: {why}");
}

/// Stops switchd and checks that it exited cleanly and left no XDP program.
fn stop_clean(tb: &Testbed, sw: &mut Switchd) -> serde_json::Value {
    let (ok, stats) = sw.stop();
    assert!(ok, "switchd did not exit cleanly:\n{}", sw.log_text());
    let left = tb.ports_with_xdp();
    assert!(left.is_empty(), "XDP program left attached on {left:?}");
    stats
}

fn job(stats: &serde_json::Value, id: u64) -> &serde_json::Value {
    stats["jobs"]
        .as_array()
        .and_then(|a| a.iter().find(|j| j["id"] == id))
        .unwrap_or_else(|| panic!("job {id} missing from stats: {stats}"))
}

/// Runs `args` inside namespace `ns`; Err(what it printed) on failure.
fn run_in(ns: &str, args: &[&str]) -> Result<Output, String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .map_err(|e| format!("ip netns exec {ns} {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "`ip netns exec {ns} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// One all-reduce run of job 1 on ranks 0..n.
struct RunResult {
    wall: f64,
    /// The slowest worker's `seconds` (time inside all_reduce, no join).
    worker_max: f64,
    resent: u64,
    duplicate_results: u64,
    rejoins: u64,
    elems_per_chunk: u64,
}

fn run_job(tb: &Testbed, n: u16, elements: usize, iterations: u32) -> RunResult {
    let t = Instant::now();
    let children: Vec<Child> = (0..n)
        .map(|r| spawn_allreduce(tb, 1, r, n, elements, iterations))
        .collect();
    let reports = expect_verified(children);
    let wall = t.elapsed().as_secs_f64();
    let sum = |k: &str| -> u64 {
        reports
            .iter()
            .map(|r| r["stats"][k].as_u64().unwrap_or(0))
            .sum()
    };
    for (i, r) in reports.iter().enumerate() {
        assert_eq!(r["elements"], elements as u64, "worker {i}: {r}");
        assert_eq!(r["iterations"], iterations, "worker {i}: {r}");
        assert_eq!(r["mismatches"], 0, "worker {i}: {r}");
    }
    RunResult {
        wall,
        worker_max: reports
            .iter()
            .filter_map(|r| r["seconds"].as_f64())
            .fold(0.0, f64::max),
        resent: sum("chunks_resent"),
        duplicate_results: sum("duplicate_results"),
        rejoins: sum("rejoins"),
        elems_per_chunk: reports[0]["elems_per_chunk"].as_u64().unwrap(),
    }
}

// ---------------------------------------------------------------------------
// Fault injection

#[derive(Clone, Copy)]
struct Faults {
    loss_pct: f64,
    dup_pct: f64,
    reorder_pct: f64,
}

impl Faults {
    fn label(&self) -> String {
        let mut parts = Vec::new();
        if self.loss_pct > 0.0 {
            parts.push(format!("loss {}%", self.loss_pct));
        }
        if self.dup_pct > 0.0 {
            parts.push(format!("duplicate {}%", self.dup_pct));
        }
        if self.reorder_pct > 0.0 {
            parts.push(format!("reorder {}%", self.reorder_pct));
        }
        parts.join(" + ")
    }

    /// The netem arguments (netem needs a delay to reorder).
    fn netem_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if self.loss_pct > 0.0 {
            a.extend(["loss".into(), format!("{}%", self.loss_pct)]);
        }
        if self.dup_pct > 0.0 {
            a.extend(["duplicate".into(), format!("{}%", self.dup_pct)]);
        }
        if self.reorder_pct > 0.0 {
            a.extend(["delay".into(), "1ms".into()]);
            a.extend(["reorder".into(), format!("{}%", self.reorder_pct)]);
            a.push("50%".into());
        }
        a
    }

    fn ppm(pct: f64) -> u32 {
        (pct * 10_000.0).round() as u32
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Backend {
    Netem,
    Bpf,
}

/// What the injection did, summed over all workers and both directions.
#[derive(Default, Debug)]
struct Injected {
    /// Aggregation frames the BPF program saw / frames a netem qdisc sent.
    frames: u64,
    dropped: u64,
    duplicated: u64,
    delayed: u64,
}

/// The tc BPF program of the fallback. Indices of the `counts` map:
/// 0 frames seen, 1 dropped, 2 duplicated, 3 delayed (reordered).
const IMPAIR_C: &str = r#"
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* Set with -D: LOSS_PPM, DUP_PPM, REORDER_PPM (per million), IFB_IFINDEX. */
#define SLOW_CLASS 0x00010002 /* HTB class 1:2 */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

static __always_inline void count(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&counts, &i);
	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline int chance(__u32 ppm)
{
	return ppm && (bpf_get_prandom_u32() % 1000000) < ppm;
}

static __always_inline int is_agg(struct __sk_buff *skb)
{
	bpf_skb_pull_data(skb, sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr));
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return 0;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
		return 0;
	struct udphdr *u = (void *)(ip + 1);
	if ((void *)(u + 1) > end)
		return 0;
	return u->dest == bpf_htons(AGG_PORT) || u->source == bpf_htons(AGG_PORT);
}

SEC("tc/egress")
int impair_egress(struct __sk_buff *skb)
{
	if (!is_agg(skb))
		return TC_ACT_OK;
	count(0);
	if (chance(LOSS_PPM)) {
		count(1);
		return TC_ACT_SHOT;
	}
	if (chance(DUP_PPM)) {
		count(2);
		bpf_clone_redirect(skb, skb->ifindex, 0);
	}
	if (chance(REORDER_PPM)) {
		count(3);
		skb->priority = SLOW_CLASS;
	}
	return TC_ACT_OK;
}

SEC("tc/ingress")
int impair_ingress(struct __sk_buff *skb)
{
	if (!is_agg(skb))
		return TC_ACT_OK;
	count(0);
	if (chance(LOSS_PPM)) {
		count(1);
		return TC_ACT_SHOT;
	}
	if (chance(DUP_PPM)) {
		count(2);
		bpf_clone_redirect(skb, skb->ifindex, BPF_F_INGRESS);
	}
	if (IFB_IFINDEX && chance(REORDER_PPM)) {
		count(3);
		return bpf_redirect(IFB_IFINDEX, 0);
	}
	return TC_ACT_OK;
}

char _license[] SEC("license") = "GPL";
"#;

/// The rate of the HTB class that delays the reordered share.
const SLOW_RATE: &str = "100mbit";

struct Impairment {
    backend: Backend,
    dir: PathBuf,
    namespaces: Vec<String>,
}

impl Drop for Impairment {
    fn drop(&mut self) {
        // The qdiscs, filters and ifb devices go with the namespaces.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Impairment {
    /// Picks the backend: `AGG_FAULTS_BACKEND`, else netem when a netem
    /// qdisc can be made (tried on `ns`'s eth0), else the BPF fallback.
    fn backend(ns: &str) -> Backend {
        match std::env::var("AGG_FAULTS_BACKEND").as_deref() {
            Ok("netem") => return Backend::Netem,
            Ok("bpf") => return Backend::Bpf,
            _ => {}
        }
        let _ = Command::new("modprobe").arg("sch_netem").output();
        let probe = run_in(
            ns,
            &[
                "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "0ms",
            ],
        );
        match probe {
            Ok(_) => {
                let _ = run_in(ns, &["tc", "qdisc", "del", "dev", "eth0", "root"]);
                Backend::Netem
            }
            Err(e) => {
                eprintln!("note: tc netem unavailable ({e}); emulating the faults with tc BPF");
                Backend::Bpf
            }
        }
    }

    /// Impairs eth0 of every worker namespace of `tb`, both directions.
    fn apply(tb: &Testbed, f: Faults) -> Result<Impairment, String> {
        let namespaces: Vec<String> = (0..tb.workers).map(|i| tb.worker_ns(i)).collect();
        let backend = Self::backend(&namespaces[0]);
        let dir =
            std::env::temp_dir().join(format!("agg-faults-{}-{}", tb.prefix, std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let imp = Impairment {
            backend,
            dir,
            namespaces,
        };
        for ns in &imp.namespaces {
            match backend {
                Backend::Netem => imp.apply_netem(ns, f).map_err(|e| {
                    format!("impairing the links with tc netem failed ({e}); load sch_netem, ifb, cls_u32 and act_mirred, or set AGG_FAULTS_BACKEND=bpf")
                })?,
                Backend::Bpf => imp.apply_bpf(ns, f).map_err(|e| {
                    format!("no sch_netem in this kernel, and the tc BPF fallback failed: {e}")
                })?,
            }
        }
        Ok(imp)
    }

    fn apply_netem(&self, ns: &str, f: Faults) -> Result<(), String> {
        let args = f.netem_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let tc = |a: &[&str]| -> Result<(), String> {
            let mut v = vec!["tc"];
            v.extend_from_slice(a);
            run_in(ns, &v).map(|_| ())
        };
        // worker -> switch
        let mut q = vec!["qdisc", "add", "dev", "eth0", "root", "netem"];
        q.extend_from_slice(&args);
        tc(&q)?;
        // switch -> worker: everything eth0 receives goes through ifb0's netem.
        run_in(ns, &["ip", "link", "add", "ifb0", "type", "ifb"])?;
        run_in(ns, &["ip", "link", "set", "ifb0", "up"])?;
        let mut q = vec!["qdisc", "add", "dev", "ifb0", "root", "netem"];
        q.extend_from_slice(&args);
        tc(&q)?;
        tc(&["qdisc", "add", "dev", "eth0", "handle", "ffff:", "ingress"])?;
        tc(&[
            "filter", "add", "dev", "eth0", "parent", "ffff:", "protocol", "ip", "u32", "match",
            "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", "ifb0",
        ])
    }

    fn apply_bpf(&self, ns: &str, f: Faults) -> Result<(), String> {
        let tc = |a: &[&str]| -> Result<(), String> {
            let mut v = vec!["tc"];
            v.extend_from_slice(a);
            run_in(ns, &v).map(|_| ())
        };
        let reorder = f.reorder_pct > 0.0;
        let mut ifb_index = 0u32;
        if reorder {
            // Ingress: the delayed share is redirected to ifb0, whose HTB
            // class lets it through at SLOW_RATE, then back into eth0.
            run_in(ns, &["ip", "link", "add", "ifb0", "type", "ifb"])?;
            run_in(
                ns,
                &["ip", "link", "set", "ifb0", "up", "txqueuelen", "1000"],
            )?;
            let out = run_in(ns, &["cat", "/sys/class/net/ifb0/ifindex"])?;
            ifb_index = String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .map_err(|e| format!("ifb0 ifindex: {e}"))?;
            tc(&[
                "qdisc", "add", "dev", "ifb0", "root", "handle", "1:", "htb", "default", "2",
            ])?;
            tc(&[
                "class", "add", "dev", "ifb0", "parent", "1:", "classid", "1:2", "htb", "rate",
                SLOW_RATE, "ceil", SLOW_RATE, "quantum", "60000",
            ])?;
            // Egress: class 1:2 (skb->priority set by the program) is slow,
            // everything else takes 1:1.
            tc(&[
                "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "1",
            ])?;
            tc(&[
                "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb", "rate",
                "10gbit", "quantum", "60000",
            ])?;
            tc(&[
                "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:2", "htb", "rate",
                SLOW_RATE, "ceil", SLOW_RATE, "quantum", "60000",
            ])?;
        }
        let src = self.dir.join("impair.c");
        std::fs::write(&src, IMPAIR_C).map_err(|e| format!("{}: {e}", src.display()))?;
        let obj = self.dir.join(format!("impair-{ns}.o"));
        let multiarch = if cfg!(target_arch = "aarch64") {
            "aarch64-linux-gnu"
        } else {
            "x86_64-linux-gnu"
        };
        let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
        let out = Command::new(&clang)
            .args(["-O2", "-g", "-Wall", "-target", "bpf"])
            .arg(format!("-I/usr/include/{multiarch}"))
            .arg(format!("-DAGG_PORT={AGG_PORT}"))
            .arg(format!("-DLOSS_PPM={}", Faults::ppm(f.loss_pct)))
            .arg(format!("-DDUP_PPM={}", Faults::ppm(f.dup_pct)))
            .arg(format!("-DREORDER_PPM={}", Faults::ppm(f.reorder_pct)))
            .arg(format!("-DIFB_IFINDEX={ifb_index}"))
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .output()
            .map_err(|e| format!("running {clang}: {e} (install clang and libbpf-dev)"))?;
        if !out.status.success() {
            return Err(format!(
                "{clang} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let obj = obj.to_str().unwrap();
        tc(&["qdisc", "add", "dev", "eth0", "clsact"])?;
        for dir in ["egress", "ingress"] {
            let sec = format!("tc/{dir}");
            tc(&[
                "filter", "add", "dev", "eth0", dir, "bpf", "da", "obj", obj, "sec", &sec,
            ])?;
        }
        Ok(())
    }

    /// What was injected so far (netem: frames and drops from `tc -s`).
    fn injected(&self) -> Injected {
        let mut sum = Injected::default();
        for ns in &self.namespaces {
            match self.backend {
                Backend::Bpf => {
                    for dir in ["egress", "ingress"] {
                        let c = bpf_counts(ns, dir);
                        sum.frames += c[0];
                        sum.dropped += c[1];
                        sum.duplicated += c[2];
                        sum.delayed += c[3];
                    }
                }
                Backend::Netem => {
                    for dev in ["eth0", "ifb0"] {
                        let (sent, dropped) = netem_counts(ns, dev);
                        sum.frames += sent;
                        sum.dropped += dropped;
                    }
                }
            }
        }
        sum
    }
}

/// The `counts` map of the BPF program on eth0 `dir` in `ns` (zeros if
/// it cannot be read).
fn bpf_counts(ns: &str, dir: &str) -> [u64; 4] {
    let mut c = [0u64; 4];
    let Ok(out) = run_in(ns, &["tc", "filter", "show", "dev", "eth0", dir]) else {
        return c;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    let Some(prog_id) = words
        .by_ref()
        .skip_while(|w| *w != "id")
        .nth(1)
        .map(str::to_owned)
    else {
        return c;
    };
    let bpftool = |args: &[&str]| -> Option<serde_json::Value> {
        let out = Command::new("bpftool").arg("-j").args(args).output().ok()?;
        serde_json::from_slice(&out.stdout).ok()
    };
    let Some(prog) = bpftool(&["prog", "show", "id", &prog_id]) else {
        return c;
    };
    for map_id in prog["map_ids"].as_array().into_iter().flatten() {
        let id = map_id.to_string();
        let Some(info) = bpftool(&["map", "show", "id", &id]) else {
            continue;
        };
        if info["name"] != "counts" {
            continue;
        }
        let Some(dump) = bpftool(&["map", "dump", "id", &id]) else {
            continue;
        };
        for e in dump.as_array().into_iter().flatten() {
            let (k, v) = if e["formatted"].is_object() {
                (
                    e["formatted"]["key"].as_u64(),
                    e["formatted"]["value"].as_u64(),
                )
            } else {
                (le_bytes(&e["key"]), le_bytes(&e["value"]))
            };
            if let (Some(k), Some(v)) = (k, v) {
                if (k as usize) < c.len() {
                    c[k as usize] = v;
                }
            }
        }
    }
    c
}

/// bpftool's raw form: ["0x01", "0x00", …], little-endian.
fn le_bytes(v: &serde_json::Value) -> Option<u64> {
    let bytes = v.as_array()?;
    let mut x = 0u64;
    for (i, b) in bytes.iter().enumerate().take(8) {
        let b = u64::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok()?;
        x |= b << (8 * i);
    }
    Some(x)
}

/// (packets sent, dropped) of the root qdisc of `dev` in `ns`.
fn netem_counts(ns: &str, dev: &str) -> (u64, u64) {
    let Ok(out) = run_in(ns, &["tc", "-s", "qdisc", "show", "dev", dev, "root"]) else {
        return (0, 0);
    };
    let text = String::from_utf8_lossy(&out.stdout);
    // " Sent 6265468 bytes 4148 pkt (dropped 12, overlimits 0 requeues 0)"
    let Some(line) = text.lines().find(|l| l.trim_start().starts_with("Sent ")) else {
        return (0, 0);
    };
    let w: Vec<&str> = line
        .split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')')
        .filter(|s| !s.is_empty())
        .collect();
    let after = |key: &str| {
        w.iter()
            .position(|x| *x == key)
            .and_then(|i| w.get(i + 1))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    let pkts = w
        .iter()
        .position(|x| *x == "pkt")
        .and_then(|i| w.get(i - 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (pkts, after("dropped"))
}

// ---------------------------------------------------------------------------
// The fault tests

fn fault_test(test: &str, prefix: &str, f: Faults) {
    if !can_run(test) {
        return;
    }
    let tb = Testbed::up(prefix, WORKERS, 0);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, WORKERS)]);

    let clean = run_job(&tb, WORKERS, ELEMENTS, ITERATIONS);

    let imp = match Impairment::apply(&tb, f) {
        Ok(imp) => imp,
        Err(why) => return unavailable(test, &why),
    };
    let faulty = run_job(&tb, WORKERS, ELEMENTS, ITERATIONS);
    let inj = imp.injected();
    let stats = stop_clean(&tb, &mut sw);
    let j = job(&stats, 1);

    let name = match imp.backend {
        Backend::Netem => format!("netem {}", f.label()),
        Backend::Bpf => format!("bpf-emulated {}", f.label()),
    };
    eprintln!(
        "{name}: {:.2} s (clean {:.2} s), worker {:.3} s (clean {:.3} s), resent {} (clean {}), \
         duplicate results {}, rejoins {}; switch: retransmits served {}, duplicates dropped {}; \
         injected over {} frames: dropped {}, duplicated {}, delayed {}",
        faulty.wall,
        clean.wall,
        faulty.worker_max,
        clean.worker_max,
        faulty.resent,
        clean.resent,
        faulty.duplicate_results,
        faulty.rejoins,
        j["retransmits_served"],
        j["drops"]["duplicate"],
        inj.frames,
        inj.dropped,
        inj.duplicated,
        inj.delayed,
    );

    // Every chunk of both runs completed exactly once, whatever was lost,
    // duplicated or reordered on the way.
    let chunks = ELEMENTS.div_ceil(faulty.elems_per_chunk as usize) as u64;
    assert_eq!(
        j["chunks_completed"].as_u64().unwrap(),
        2 * u64::from(ITERATIONS) * chunks,
        "{j}"
    );
    assert_eq!(stats["malformed_total"], 0, "{stats}");

    // The faults were really there.
    assert!(inj.frames > 0, "the impairment saw no frames: {inj:?}");
    match imp.backend {
        Backend::Bpf => {
            assert_eq!(inj.dropped > 0, f.loss_pct > 0.0, "{inj:?}");
            assert_eq!(inj.duplicated > 0, f.dup_pct > 0.0, "{inj:?}");
            assert_eq!(inj.delayed > 0, f.reorder_pct > 0.0, "{inj:?}");
        }
        Backend::Netem => {
            if f.loss_pct > 0.0 {
                assert!(inj.dropped > 0, "netem dropped nothing: {inj:?}");
            }
        }
    }
    if f.loss_pct > 0.0 {
        assert!(faulty.resent > 0, "frames were lost but nothing was resent");
    }
}

#[test]
fn allreduce_survives_5_percent_loss() {
    fault_test(
        "faults_loss",
        "f3loss",
        Faults {
            loss_pct: 5.0,
            dup_pct: 0.0,
            reorder_pct: 0.0,
        },
    );
}

#[test]
fn allreduce_survives_1_percent_duplication() {
    fault_test(
        "faults_duplicate",
        "f3dup",
        Faults {
            loss_pct: 0.0,
            dup_pct: 1.0,
            reorder_pct: 0.0,
        },
    );
}

#[test]
fn allreduce_survives_25_percent_reordering() {
    fault_test(
        "faults_reorder",
        "f3reo",
        Faults {
            loss_pct: 0.0,
            dup_pct: 0.0,
            reorder_pct: 25.0,
        },
    );
}

#[test]
fn allreduce_survives_loss_duplication_and_reordering_at_once() {
    fault_test(
        "faults_all",
        "f3all",
        Faults {
            loss_pct: 5.0,
            dup_pct: 1.0,
            reorder_pct: 25.0,
        },
    );
}

// ---------------------------------------------------------------------------
// One job of 64 workers

#[test]
fn one_job_of_64_workers_is_bit_exact() {
    const N: u16 = 64;
    const ELEMS: usize = 100_000;
    const ITERS: u32 = 2;
    if !can_run("faults_64_workers") {
        return;
    }
    let tb = Testbed::up("f3w", N, 0);
    // Workers are 198.18.0.10 ..= .73.
    let mut spec = JobSpec::new(1, N);
    spec.allowed = vec!["198.18.0.0/26", "198.18.0.64/28"];
    let mut sw = Switchd::start(&tb, &[spec]);
    let r = run_job(&tb, N, ELEMS, ITERS);
    let rss = switchd_rss_kib(&tb);
    let stats = stop_clean(&tb, &mut sw);
    let j = job(&stats, 1);
    eprintln!(
        "64 workers x {ELEMS} float32 x {ITERS}: all verified, {:.2} s wall, slowest worker {:.3} s, \
         resent {}, rejoins {}; switch: {} chunks, {} contributions, RSS {} MiB",
        r.wall,
        r.worker_max,
        r.resent,
        r.rejoins,
        j["chunks_completed"],
        j["contributions"],
        rss / 1024
    );
    let chunks = ELEMS.div_ceil(r.elems_per_chunk as usize) as u64;
    assert_eq!(
        j["chunks_completed"].as_u64().unwrap(),
        u64::from(ITERS) * chunks,
        "{j}"
    );
    assert_eq!(j["activations"], 1, "{j}");
    assert_eq!(stats["malformed_total"], 0, "{stats}");
}

/// VmRSS (KiB) of the switchd running in `tb`'s switch namespace, 0 if not found.
fn switchd_rss_kib(tb: &Testbed) -> u64 {
    let Ok(out) = Command::new("ip")
        .args(["netns", "pids", &tb.switch_ns()])
        .output()
    else {
        return 0;
    };
    let switchd = switchd_bin();
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        if !same_file(&exe, &switchd) {
            continue;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if let Some(kib) = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
        {
            return kib;
        }
    }
    0
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
