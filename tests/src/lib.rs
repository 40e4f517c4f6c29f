//! End-to-end test harness: a testbed of network namespaces made by
//! `scripts/testbed.sh` (its own prefix per test), a running `switchd` in the
//! switch namespace, and `worker`/probe processes in the worker and host
//! namespaces.
//!
//! Invariants: everything a test makes is removed when its guard drops, also
//! when the test panics: processes are killed by PID, the testbed torn down
//! by prefix.
//!
//! Every test in `tests/tests/` needs root and is marked
//! `#[ignore = "needs root"]` (checked by this crate's own unit test), so a
//! plain `cargo test` lists them as ignored, never as passed. To run them:
//! `sudo scripts/test.sh`, or as root
//! `cargo test --release -p agg-e2e -- --include-ignored --test-threads=1`.
//! A test run that way checks what it needs with [`can_run`] (and
//! [`unavailable`] for further requirements): under `CI=true` a missing
//! capability is a failure; otherwise the test prints `SKIPPED <test>: <why>`
//! and returns.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub mod config;
pub mod env;
pub mod tenants;
pub mod torch;

pub use config::{leaf_config, spine_config, Job, SwitchConfig, UPLINK_PORT};
pub use env::{EnvError, TestbedEnv};
pub use ipnet::Ipv4Net;

pub const AGG_PORT: u16 = 48879;
pub const SECRET: &str = "7c1e4a0f9b2d3c5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6";

/// A mode-0600 file holding [`SECRET`], for `switchctl job add
/// --secret-file` (a secret on the command line draws a warning). Written
/// once per test process, in the system's temporary directory, and removed
/// when the process exits.
pub fn secret_file() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let p = secret_file_path();
        let _ = std::fs::remove_file(&p);
        // A static is never dropped; the test harness leaves through
        // exit(3), which runs atexit handlers (failing tests included).
        // SAFETY: the handler is a plain `extern "C" fn` that only
        // unlinks a path.
        unsafe {
            libc::atexit(remove_secret_file);
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&p)
            .expect("creating the test secret file");
        writeln!(f, "{SECRET}").expect("writing the test secret file");
        p.display().to_string()
    })
}

fn secret_file_path() -> PathBuf {
    std::env::temp_dir().join(format!("agg-e2e-secret-{}", std::process::id()))
}

extern "C" fn remove_secret_file() {
    let _ = std::fs::remove_file(secret_file_path());
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn path_from_env(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(default))
}

pub fn switchd_bin() -> PathBuf {
    path_from_env("AGG_SWITCHD", "target/release/switchd")
}
pub fn worker_bin() -> PathBuf {
    path_from_env("AGG_WORKER", "target/release/worker")
}
pub fn switchctl_bin() -> PathBuf {
    switchd_bin().with_file_name("switchctl")
}
pub fn testbed_script() -> PathBuf {
    path_from_env("AGG_TESTBED", "scripts/testbed.sh")
}
pub fn probe_script() -> PathBuf {
    repo_root().join("tests/probe.py")
}

/// True when this test can run (root, binaries built). Otherwise prints why
/// and returns false, or panics under `CI=true`.
pub fn can_run(test: &str) -> bool {
    let mut missing = Vec::new();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("root (sudo scripts/test.sh)".to_string());
    }
    for b in [switchd_bin(), worker_bin()] {
        if !b.exists() {
            missing.push(format!(
                "{} (cargo build --release --workspace --bins)",
                b.display()
            ));
        }
    }
    if missing.is_empty() {
        return true;
    }
    unavailable(test, &format!("needs {}", missing.join(", ")));
    false
}

/// A capability `test` needs is missing: a failure under `CI=true`, else a
/// printed skip.
pub fn unavailable(test: &str, why: &str) {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: {why}; under CI=true this is a failure, not a skip");
    }
    eprintln!("SKIPPED {test}: {why}");
}

/// The 2 MiB huge page pool set to a size for one test, and set back
/// when this drops (also on panic). The pool is the machine's, not the
/// testbed's: tests that change it run one at a time, as all of these do.
pub struct HugePages {
    before: u64,
}

const NR_HUGEPAGES: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";

fn read_nr_hugepages() -> u64 {
    std::fs::read_to_string(NR_HUGEPAGES)
        .unwrap_or_else(|e| panic!("reading {NR_HUGEPAGES}: {e}"))
        .trim()
        .parse()
        .unwrap()
}

impl HugePages {
    /// `extra` more pages than the pool holds now; None (and the pool as
    /// it was) if the kernel could not find that many.
    pub fn reserve(extra: u64) -> Option<HugePages> {
        let before = read_nr_hugepages();
        let guard = HugePages::set(before + extra);
        (read_nr_hugepages() >= before + extra).then_some(guard)
    }

    /// Exactly `pages` pages (0: none for switchd to take).
    pub fn set(pages: u64) -> HugePages {
        let before = read_nr_hugepages();
        std::fs::write(NR_HUGEPAGES, pages.to_string())
            .unwrap_or_else(|e| panic!("writing {pages} to {NR_HUGEPAGES}: {e}"));
        HugePages { before }
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, self.before.to_string());
    }
}

/// Stops switchd, checks that it exited cleanly and left no XDP program on
/// any port, and returns its last stats.
pub fn stop_clean(tb: &Testbed, sw: &mut Switchd) -> serde_json::Value {
    let (ok, stats) = sw.stop();
    assert!(ok, "switchd did not exit cleanly:\n{}", sw.log_text());
    let left = tb.ports_with_xdp();
    assert!(left.is_empty(), "XDP program left attached on {left:?}");
    stats
}

/// Job `id`'s entry in a switchd stats snapshot.
pub fn job(stats: &serde_json::Value, id: u64) -> &serde_json::Value {
    stats["jobs"]
        .as_array()
        .and_then(|a| a.iter().find(|j| j["id"] == id))
        .unwrap_or_else(|| panic!("job {id} missing from stats: {stats}"))
}

/// How many cores a test's switch spreads its work over: receive queues
/// per testbed port (`testbed.sh --queues Q --queue-per-worker`: worker I
/// of N sends on queue floor(I*Q/N)) and switchd's `queues` and
/// `dataplane_threads`.
/// And switchd's `seq_lanes`: the UDP ports its DATA arrive on.
#[derive(Clone, Copy, Debug)]
pub struct Lanes {
    pub queues: u16,
    pub threads: u16,
    pub seq_lanes: u16,
}

impl Lanes {
    /// One queue per port, one dataplane thread: switchd's defaults.
    pub const ONE: Lanes = Lanes {
        queues: 1,
        threads: 1,
        seq_lanes: 1,
    };
    /// Two queues per port, two dataplane threads.
    pub const TWO: Lanes = Lanes {
        queues: 2,
        threads: 2,
        seq_lanes: 1,
    };
    /// Two queues, two threads and two seq lanes (docs/PROTOCOL.md, "Seq
    /// lanes"): workers send odd seqs to the port after the aggregation
    /// port. On veth no NIC rule steers a lane to its queue, so this tests
    /// the ports and the protocol, not the steering.
    pub const TWO_SEQ_LANES: Lanes = Lanes {
        queues: 2,
        threads: 2,
        seq_lanes: 2,
    };

    /// The `[switch]` lines that give switchd these queues, threads and
    /// seq lanes.
    pub fn switch_toml(&self) -> String {
        format!(
            "queues = {}\ndataplane_threads = {}\nseq_lanes = {}\n",
            self.queues, self.threads, self.seq_lanes
        )
    }
}

/// True when every count is at least a quarter of an even share of their
/// (non-zero) sum.
fn fair_shares(counts: &[u64]) -> bool {
    let total: u64 = counts.iter().sum();
    let floor = total / counts.len().max(1) as u64 / 4;
    total > 0 && counts.iter().all(|&n| n >= floor.max(1))
}

/// A single-switch testbed (`scripts/testbed.sh up --workers N ...
/// --print-env`): its namespaces, ports and addresses are what the script
/// printed ([`TestbedEnv`]), read by the accessors; no test carries its own
/// copy of the address plan. Torn down on drop.
pub struct Testbed {
    pub prefix: String,
    pub workers: u16,
    pub hosts: u16,
    /// Receive and transmit queues of every veth.
    pub queues: u16,
    /// What `testbed.sh up --print-env` said the testbed is (addresses,
    /// ports, namespaces, MACs): every accessor below reads it.
    env: TestbedEnv,
}

impl Testbed {
    pub fn up(prefix: &str, workers: u16, hosts: u16) -> Testbed {
        Testbed::up_full(prefix, workers, hosts, 1500, 1)
    }

    /// As [`Testbed::up`], with every link (veth ends and bridge) at `mtu`.
    pub fn up_with_mtu(prefix: &str, workers: u16, hosts: u16, mtu: u16) -> Testbed {
        Testbed::up_full(prefix, workers, hosts, mtu, 1)
    }

    /// As [`Testbed::up`], with `lanes.queues` queues on every veth (start
    /// switchd with [`Lanes::switch_toml`] to use them).
    pub fn up_lanes(prefix: &str, workers: u16, hosts: u16, lanes: Lanes) -> Testbed {
        Testbed::up_full(prefix, workers, hosts, 1500, lanes.queues)
    }

    fn up_full(prefix: &str, workers: u16, hosts: u16, mtu: u16, queues: u16) -> Testbed {
        let mut args: Vec<String> = ["up", "--workers", &workers.to_string()]
            .into_iter()
            .chain(["--hosts", &hosts.to_string(), "--prefix", prefix])
            .chain(["--mtu", &mtu.to_string()])
            .chain(["--queues", &queues.to_string(), "--print-env"])
            .map(str::to_owned)
            .collect();
        if queues > 1 {
            // Worker I of N on queue floor(I*Q/N), the same every run
            // (testbed.sh).
            args.push("--queue-per-worker".into());
        }
        let env = testbed_up(&args, "testbed.sh up");
        let tb = Testbed {
            prefix: prefix.to_owned(),
            workers,
            hosts,
            queues,
            env,
        };
        // The testbed is what was asked for, or every accessor below lies.
        for (key, want) in [("workers", workers), ("hosts", hosts), ("queues", queues)] {
            assert_eq!(tb.env.number(key), want, "`{}`: {key}", tb.env.command());
        }
        tb
    }

    /// A value `testbed.sh up --print-env` printed for this testbed (e.g.
    /// `worker_2_mac`); panics naming the key and the command if it has none.
    pub fn env(&self, key: &str) -> String {
        self.env.get(key).to_owned()
    }

    /// The switch's address (its bridge's), where workers send.
    pub fn switch_addr(&self) -> Ipv4Addr {
        self.env.addr("switch_addr")
    }
    /// The switch's aggregation endpoint, `switch_addr:AGG_PORT`.
    pub fn switch_endpoint(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.switch_addr(), AGG_PORT)
    }
    /// The MAC of the switch's bridge (its address's).
    pub fn switch_mac(&self) -> String {
        self.env.get("switch_mac").to_owned()
    }
    /// Worker `i`'s address (its eth0's).
    pub fn worker_addr(&self, i: u16) -> Ipv4Addr {
        self.env.addr(&format!("worker_{i}_addr"))
    }
    pub fn worker_mac(&self, i: u16) -> String {
        self.env.get(&format!("worker_{i}_mac")).to_owned()
    }
    /// Host `j`'s address (its eth0's).
    pub fn host_addr(&self, j: u16) -> Ipv4Addr {
        self.env.addr(&format!("host_{j}_addr"))
    }
    pub fn host_mac(&self, j: u16) -> String {
        self.env.get(&format!("host_{j}_mac")).to_owned()
    }
    /// The testbed's one subnet: the switch, every worker and every host.
    pub fn subnet(&self) -> Ipv4Net {
        self.env.net("subnet")
    }
    /// Prefixes that hold every worker's address and nothing else (no host,
    /// no unused address): a job's sources when only its workers may send.
    pub fn worker_sources(&self) -> Vec<Ipv4Net> {
        self.worker_sources_of(0..self.workers)
    }
    /// As [`Testbed::worker_sources`], for workers `ranks` only.
    pub fn worker_sources_of(&self, ranks: std::ops::Range<u16>) -> Vec<Ipv4Net> {
        env::exact_prefixes(ranks.map(|i| self.worker_addr(i)))
    }
    /// Every address on the testbed: the switch's, the workers', the hosts'.
    pub fn addresses(&self) -> Vec<Ipv4Addr> {
        std::iter::once(self.switch_addr())
            .chain((0..self.workers).map(|i| self.worker_addr(i)))
            .chain((0..self.hosts).map(|j| self.host_addr(j)))
            .collect()
    }

    /// Frames the XDP program on switch port `port` redirected, per receive
    /// queue (veth's `ethtool -S` counters `rx_queue_N_xdp_redirect`): what
    /// reached the switch's AF_XDP socket on each queue. Kernel counters, so
    /// they also count across a switchd restart.
    pub fn xdp_redirects_per_queue(&self, port: &str) -> Vec<u64> {
        let out = self
            .cmd_in(&self.switch_ns(), "ethtool")
            .args(["-S", port])
            .output()
            .expect("running ethtool -S");
        assert!(out.status.success(), "ethtool -S {port}: {}", text(&out));
        let stats = String::from_utf8_lossy(&out.stdout);
        (0..self.queues)
            .map(|q| {
                let key = format!("rx_queue_{q}_xdp_redirect:");
                stats
                    .lines()
                    .find_map(|l| l.trim().strip_prefix(key.as_str()))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or_else(|| panic!("no {key} in `ethtool -S {port}`:\n{stats}"))
            })
            .collect()
    }

    /// Asserts that switchd (its last `stats`) opened a socket on every
    /// queue of every worker port, and that the workers' frames were spread
    /// over the dataplane threads: every queue of the worker ports carried
    /// at least a quarter of its fair share, and so did every thread's
    /// `rx_frames` where the stats have them.
    ///
    /// Which thread received what: switchd deals its sockets (port, queue),
    /// port by port, round-robin to the threads when they are no more than
    /// the queues, so with as many threads as queues thread T owns queue T
    /// of every port, and a share per queue is a share per thread. Which
    /// queue a frame arrives on: veth receives on the queue the peer sent
    /// on, and testbed.sh has worker I of N send on queue floor(I*Q/N)
    /// (`--queue-per-worker`, XPS); on a real NIC, RSS hashes each flow to a
    /// queue.
    pub fn assert_spread_over_queues(&self, stats: &serde_json::Value, lanes: Lanes) {
        assert_eq!(
            lanes.queues, lanes.threads,
            "the share per queue is the share per thread only with as many threads as queues"
        );
        assert_eq!(self.queues, lanes.queues, "testbed queues vs {lanes:?}");
        let rings = stats["rings"]
            .as_array()
            .unwrap_or_else(|| panic!("no rings in stats: {stats}"));
        for p in 0..u64::from(self.workers) {
            for q in 0..u64::from(lanes.queues) {
                assert!(
                    rings.iter().any(|r| r["port_idx"] == p && r["queue"] == q),
                    "switchd has no socket on port {p} queue {q}: {rings:?}"
                );
            }
        }
        let mut per_queue = vec![0u64; usize::from(self.queues)];
        for i in 0..self.workers {
            let port = self.worker_switch_port(i);
            for (q, n) in self.xdp_redirects_per_queue(&port).iter().enumerate() {
                per_queue[q] += n;
            }
        }
        assert!(
            fair_shares(&per_queue),
            "the workers' frames were not spread over the queues (and so the threads): \
             frames per queue {per_queue:?}"
        );
        eprintln!("frames per queue (and thread) on the worker ports: {per_queue:?}");
        // Where switchd's stats have per-thread counters (`threads`), the
        // same on what each thread took from its rings.
        if let Some(threads) = stats["threads"].as_array() {
            let per_thread: Vec<u64> = threads
                .iter()
                .map(|t| t["rx_frames"].as_u64().unwrap_or(0))
                .collect();
            assert_eq!(per_thread.len(), usize::from(lanes.threads), "{stats}");
            assert!(
                fair_shares(&per_thread),
                "the dataplane threads did not share the frames: rx_frames per thread {per_thread:?}"
            );
        }
    }

    pub fn switch_ns(&self) -> String {
        self.env.get("switch_ns").to_owned()
    }
    pub fn worker_ns(&self, i: u16) -> String {
        self.env.get(&format!("worker_{i}_ns")).to_owned()
    }
    pub fn host_ns(&self, j: u16) -> String {
        self.env.get(&format!("host_{j}_ns")).to_owned()
    }
    /// The switch's port to worker `i`.
    pub fn worker_switch_port(&self, i: u16) -> String {
        self.env.get(&format!("worker_{i}_port")).to_owned()
    }
    /// The switch's ports: the workers', then the hosts'.
    pub fn ports(&self) -> Vec<String> {
        self.env.words("ports")
    }

    /// A command run inside namespace `ns`.
    pub fn cmd_in(&self, ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(program);
        c
    }

    /// Interfaces of the switch namespace that still have an XDP program.
    pub fn ports_with_xdp(&self) -> Vec<String> {
        let out = Command::new("ip")
            .args(["-n", &self.switch_ns(), "-d", "link", "show"])
            .output()
            .expect("ip link show");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut found = Vec::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.split_once(": ").map(|(_, r)| r) {
                if !line.starts_with(' ') {
                    current = rest.split(['@', ':']).next().unwrap_or("").to_owned();
                }
            }
            if line.contains("prog/xdp") || line.contains(" xdp ") || line.contains("xdpgeneric") {
                found.push(current.clone());
            }
        }
        found.dedup();
        found
    }
}

/// Runs `scripts/testbed.sh ARGS` (an `up ... --print-env`) and returns
/// what it printed (with the command line, for messages); panics with the
/// script's stderr if it failed (`what` names the call).
fn testbed_up(args: &[String], what: &str) -> TestbedEnv {
    let script = testbed_script();
    let command = format!("{} {}", script.display(), args.join(" "));
    let out = Command::new("bash")
        .arg(&script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running `{command}`: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): `{command}`:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    TestbedEnv::parse(command, &String::from_utf8_lossy(&out.stdout))
}

/// `scripts/testbed.sh down --prefix PREFIX`: removes exactly that
/// testbed's namespaces and links.
fn testbed_down(prefix: &str) -> Command {
    let mut c = Command::new("bash");
    c.arg(testbed_script()).args(["down", "--prefix", prefix]);
    c
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = testbed_down(&self.prefix)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A leaf-spine fabric (`scripts/testbed.sh up --leaves L --spines K
/// --workers-per-leaf W --hosts-per-leaf H --print-env`): names and
/// addresses come from the script's key=value lines. Torn down by prefix on
/// drop, also when the test panics; `dir` (scratch files) is removed too.
pub struct LeafSpine {
    pub prefix: String,
    pub leaves: u16,
    pub spines: u16,
    pub workers_per_leaf: u16,
    pub hosts_per_leaf: u16,
    /// What the script printed; every accessor below reads it.
    pub env: TestbedEnv,
    pub dir: PathBuf,
}

impl Netns for LeafSpine {}

impl LeafSpine {
    /// Starts every spine's and every leaf's switchd with job 1 across the
    /// whole tree (`spine_config`, `leaf_config`); logs tagged `TAG-sJ`,
    /// `TAG-lI`. Returns (spines, leaves).
    pub fn start_tree(&self, tag: &str) -> (Vec<Switchd>, Vec<Switchd>) {
        let spines = (0..self.spines)
            .map(|j| {
                let cfg = spine_config(self, j, self.leaves);
                Switchd::start_in(&self.spine_ns(j), &format!("{tag}-s{j}"), &cfg)
            })
            .collect();
        let leaves = (0..self.leaves)
            .map(|i| {
                let cfg = leaf_config(self, i, self.workers_per_leaf, self.leaves, self.spines);
                Switchd::start_in(&self.leaf_ns(i), &format!("{tag}-l{i}"), &cfg)
            })
            .collect();
        (spines, leaves)
    }

    pub fn up(prefix: &str, leaves: u16, spines: u16, wpl: u16, hpl: u16) -> LeafSpine {
        // The guard exists before the script runs: a failed `up` is removed too.
        let dir = std::env::temp_dir().join(format!("agg-e2e-{prefix}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut fabric = LeafSpine {
            prefix: prefix.to_owned(),
            leaves,
            spines,
            workers_per_leaf: wpl,
            hosts_per_leaf: hpl,
            env: TestbedEnv::parse("(leaf-spine testbed not up yet)", ""),
            dir,
        };
        let args: Vec<String> = ["up", "--leaves", &leaves.to_string()]
            .into_iter()
            .chain(["--spines", &spines.to_string()])
            .chain(["--workers-per-leaf", &wpl.to_string()])
            .chain(["--hosts-per-leaf", &hpl.to_string()])
            .chain(["--prefix", prefix, "--print-env"])
            .map(str::to_owned)
            .collect();
        fabric.env = testbed_up(&args, "testbed.sh up (leaf-spine)");
        for (key, want) in [
            ("leaves", leaves),
            ("spines", spines),
            ("workers_per_leaf", wpl),
            ("hosts_per_leaf", hpl),
        ] {
            assert_eq!(
                fabric.env.number(key),
                want,
                "`{}`: {key}",
                fabric.env.command()
            );
        }
        fabric
    }

    /// The value of `key` in the script's --print-env output; panics naming
    /// the key and the command if it has none.
    pub fn get(&self, key: &str) -> &str {
        self.env.get(key)
    }

    pub fn leaf_ns(&self, i: u16) -> String {
        self.get(&format!("leaf_{i}_ns")).to_owned()
    }
    /// Leaf `i`'s bridge address: its subnet's gateway, and where its
    /// workers send.
    pub fn leaf_gateway(&self, i: u16) -> Ipv4Addr {
        self.env.addr(&format!("leaf_{i}_gateway"))
    }
    /// Leaf `i`'s subnet (its gateway, workers and hosts).
    pub fn leaf_subnet(&self, i: u16) -> Ipv4Net {
        self.env.net(&format!("leaf_{i}_subnet"))
    }
    pub fn spine_ns(&self, j: u16) -> String {
        self.get(&format!("spine_{j}_ns")).to_owned()
    }
    /// Spine `j`'s own address (on its lo).
    pub fn spine_addr(&self, j: u16) -> Ipv4Addr {
        self.env.addr(&format!("spine_{j}_addr"))
    }
    /// Worker `k` under leaf `i`.
    pub fn worker_ns(&self, i: u16, k: u16) -> String {
        self.get(&format!("leaf_{i}_worker_{k}_ns")).to_owned()
    }
    pub fn worker_addr(&self, i: u16, k: u16) -> Ipv4Addr {
        self.env.addr(&format!("leaf_{i}_worker_{k}_addr"))
    }
    /// Leaf `i`'s port to its worker `k`.
    pub fn worker_port(&self, i: u16, k: u16) -> String {
        self.get(&format!("leaf_{i}_worker_{k}_port")).to_owned()
    }
    /// Host `k` under leaf `i`.
    pub fn host_ns(&self, i: u16, k: u16) -> String {
        self.get(&format!("leaf_{i}_host_{k}_ns")).to_owned()
    }
    pub fn host_addr(&self, i: u16, k: u16) -> Ipv4Addr {
        self.env.addr(&format!("leaf_{i}_host_{k}_addr"))
    }
    /// Spine `j`'s port down to leaf `i`.
    pub fn downlink_port(&self, j: u16, i: u16) -> String {
        self.get(&format!("spine_{j}_downlink_{i}_port")).to_owned()
    }

    /// Counter `stat` (e.g. "tx_packets") of interface `dev` in `ns`.
    pub fn if_counter(&self, ns: &str, dev: &str, stat: &str) -> u64 {
        let path = format!("/sys/class/net/{dev}/statistics/{stat}");
        let out = self.cmd_in(ns, "cat").arg(&path).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("reading {path} in {ns}: {out:?}"))
    }

    /// Runs `testbed.sh down --prefix P`; the script's output.
    pub fn down(&self) -> Output {
        testbed_down(&self.prefix)
            .output()
            .expect("running scripts/testbed.sh down")
    }
}

impl Drop for LeafSpine {
    fn drop(&mut self) {
        let _ = testbed_down(&self.prefix)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The network namespaces that exist now (`ip netns list`), by name.
pub fn netns_names() -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// A job in a switchd config.
pub struct JobSpec {
    pub id: u16,
    pub n_workers: u16,
    /// The job's `allowed_sources`; `None`: the testbed's workers and no
    /// other address ([`Testbed::worker_sources`]).
    pub allowed: Option<Vec<Ipv4Net>>,
    pub pool_slots: u16,
    pub window: Option<u16>,
    /// `dtype` of the job ("bf16", "f16"); f32 when absent.
    pub dtype: Option<&'static str>,
}

impl JobSpec {
    pub fn new(id: u16, n: u16) -> JobSpec {
        JobSpec {
            id,
            n_workers: n,
            allowed: None,
            pool_slots: 256,
            window: None,
            dtype: None,
        }
    }
}

/// `--allow NET` once per prefix: `switchctl job add`'s sources.
pub fn allow_args(nets: &[Ipv4Net]) -> Vec<String> {
    nets.iter()
        .flat_map(|n| ["--allow".to_owned(), n.to_string()])
        .collect()
}

/// A running switchd; stopped (SIGTERM, then SIGKILL) on drop.
pub struct Switchd {
    child: Option<Child>,
    pub dir: PathBuf,
    pub log: PathBuf,
    pub stats: PathBuf,
    pub admin: PathBuf,
    config: PathBuf,
    ns: String,
    /// The switchd binary ([`switchd_bin`] unless a test built another).
    bin: PathBuf,
    /// Extra environment for switchd.
    env: Vec<(String, String)>,
    /// Stopped by [`Switchd::pause`] (SIGSTOP) and not yet continued: a
    /// stop or drop continues it first, so that it can exit on SIGTERM.
    paused: bool,
}

/// Writes a file only its owner can read (switchd warns about a config
/// holding secrets that others can read).
fn write_private(path: &Path, text: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

impl Switchd {
    /// Starts switchd in namespace `ns` with `config` (its `admin_socket`
    /// is set here), its files under a directory named after `tag`.
    pub fn start_in(ns: &str, tag: &str, config: &SwitchConfig) -> Switchd {
        let dir = std::env::temp_dir().join(format!("agg-e2e-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let admin = dir.join("admin.sock");
        let text = config
            .clone()
            .set("admin_socket", admin.display().to_string())
            .render();
        let cfg_path = dir.join("switchd.toml");
        write_private(&cfg_path, &text);
        let mut sw = Switchd {
            child: None,
            log: dir.join("switchd.log"),
            stats: dir.join("stats.json"),
            admin,
            config: cfg_path,
            ns: ns.to_owned(),
            dir,
            bin: switchd_bin(),
            env: Vec::new(),
            paused: false,
        };
        sw.launch(false);
        sw
    }

    pub fn start(tb: &Testbed, jobs: &[JobSpec]) -> Switchd {
        Switchd::start_with(tb, jobs, "")
    }

    /// As [`Switchd::start`], with extra `[switch]` keys (TOML lines).
    pub fn start_with(tb: &Testbed, jobs: &[JobSpec], switch_extra: &str) -> Switchd {
        Switchd::start_custom(tb, jobs, switch_extra, &switchd_bin(), &[])
    }

    /// As [`Switchd::start_with`], running binary `bin` with extra
    /// environment variables `env`.
    pub fn start_custom(
        tb: &Testbed,
        jobs: &[JobSpec],
        switch_extra: &str,
        bin: &Path,
        env: &[(&str, &str)],
    ) -> Switchd {
        let dir =
            std::env::temp_dir().join(format!("agg-e2e-{}-{}", tb.prefix, std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let admin = dir.join("admin.sock");
        let mut config = SwitchConfig::for_testbed(tb)
            .set("agg_port", i64::from(AGG_PORT))
            .set("admin_socket", admin.display().to_string())
            .set_lines(switch_extra);
        for j in jobs {
            let allowed = j.allowed.clone().unwrap_or_else(|| tb.worker_sources());
            let mut job =
                Job::new(j.id, j.n_workers, &allowed).set("pool_slots", i64::from(j.pool_slots));
            if let Some(w) = j.window {
                job = job.set("window", i64::from(w));
            }
            if let Some(d) = j.dtype {
                job = job.set("dtype", d);
            }
            config = config.job(job);
        }
        let cfg = config.render();
        let cfg_path = dir.join("switchd.toml");
        write_private(&cfg_path, &cfg);
        let mut sw = Switchd {
            child: None,
            log: dir.join("switchd.log"),
            stats: dir.join("stats.json"),
            admin,
            config: cfg_path,
            ns: tb.switch_ns(),
            dir,
            bin: bin.to_owned(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            paused: false,
        };
        sw.launch(false);
        sw
    }

    /// Starts switchd and waits until it is ready; `again`: a restart, whose
    /// log follows the previous run's in the same file.
    fn launch(&mut self, again: bool) {
        let _ = std::fs::remove_file(&self.stats);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(again)
            .truncate(!again)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("opening {}: {e}", self.log.display()));
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(&self.bin)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(["run", "--config"])
            .arg(&self.config)
            .arg("--stats-file")
            .arg(&self.stats)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting switchd");
        let pid = child.id().to_string();
        self.child = Some(child);
        // Ready when this switchd (`ip netns exec` execs it: same PID)
        // answers on its admin socket, as the scripts' start_switchd asks.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.switchctl(&["ready", "--pid", &pid]);
            if out.status.success() {
                break;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "switchd exited ({status}) before it was ready:\n{}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "switchd did not become ready in 30 s ({}):\n{}",
                String::from_utf8_lossy(&out.stderr).trim(),
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops switchd and starts it again with the same configuration (a new
    /// generation: every job's state is lost).
    pub fn restart(&mut self) -> serde_json::Value {
        let (ok, stats) = self.stop();
        assert!(ok, "switchd did not stop cleanly:\n{}", self.log_text());
        self.launch(true);
        stats
    }

    /// Runs `switchctl --socket ADMIN ARGS` (the admin socket is a file, so
    /// no namespace is needed).
    pub fn switchctl(&self, args: &[&str]) -> Output {
        Command::new(switchctl_bin())
            .arg("--socket")
            .arg(&self.admin)
            .args(args)
            .output()
            .expect("running switchctl")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The counters as they are now, asked of switchd on its admin socket
    /// (`switchctl --json stats`: the same snapshot as the stats file's).
    /// Unlike [`Switchd::stats`], whose file may be up to a second old, they
    /// hold everything done before this call, e.g. every chunk of a run whose
    /// ranks have exited.
    pub fn live_stats(&self) -> serde_json::Value {
        let out = self.switchctl(&["--json", "stats"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "switchctl --json stats failed: {}{text}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("switchctl --json stats: not JSON ({e}): {text}"))
    }

    /// The latest counters (written every second and at exit).
    pub fn stats(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(&self.stats).unwrap_or_else(|_| "{}".into());
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
    }

    /// Waits until the stats file satisfies `pred` (or panics after `secs`).
    pub fn wait_stats(&self, secs: u64, what: &str, pred: impl Fn(&serde_json::Value) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if pred(&self.stats()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("timed out waiting for {what}; stats: {}", self.stats());
    }

    /// The process id of the running switchd (`ip netns exec` execs it).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Waits up to `limit` for switchd to exit on its own; its exit status,
    /// or `None` if it still runs.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(s)) = child.try_wait() {
                self.child = None;
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, as a crash: no cleanup, no last stats. Returns once it exited.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts switchd again with the same configuration after [`Switchd::kill`]
    /// (a crash and its restart: a new generation, every job's state lost).
    /// Panics if it still runs; returns once the new one is ready.
    pub fn start_again(&mut self) {
        assert!(
            self.child.is_none(),
            "switchd still runs (PID {:?}); kill or stop it first",
            self.pid()
        );
        self.launch(true);
    }

    /// SIGSTOP to the running switchd, by its PID: it stays in memory, its
    /// XDP program keeps redirecting frames to its sockets, but nothing
    /// answers them until [`Switchd::resume`].
    pub fn pause(&mut self) {
        self.signal(libc::SIGSTOP);
        self.paused = true;
    }

    /// SIGCONT after [`Switchd::pause`]: it goes on with the state it had.
    pub fn resume(&mut self) {
        self.signal(libc::SIGCONT);
        self.paused = false;
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = self.pid().expect("switchd is not running");
        let pid = libc::pid_t::try_from(pid).expect("a PID fits pid_t");
        // SAFETY: kill has no memory preconditions; the PID is our child's,
        // not yet reaped (self.child holds it), so it names switchd.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {sig}): {}",
            std::io::Error::last_os_error()
        );
    }

    /// SIGTERM, wait for exit; returns the exit status success and the final stats.
    pub fn stop(&mut self) -> (bool, serde_json::Value) {
        if self.paused {
            self.resume();
        }
        let Some(mut child) = self.child.take() else {
            return (false, self.stats());
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Ok(Some(s)) = child.try_wait() {
                break Some(s);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        (status.is_some_and(|s| s.success()), self.stats())
    }
}

impl Drop for Switchd {
    fn drop(&mut self) {
        if self.paused && self.child.is_some() {
            self.resume();
        }
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            std::thread::sleep(Duration::from_millis(500));
            let _ = c.kill();
            let _ = c.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("switchd log kept in {}", self.log.display());
        }
    }
}

/// `worker allreduce` for rank `rank` of job `job`, started in its namespace.
pub fn spawn_allreduce(
    tb: &Testbed,
    job: u16,
    rank: u16,
    n: u16,
    elements: usize,
    iterations: u32,
) -> Child {
    spawn_allreduce_from(tb, &tb.worker_ns(rank), job, rank, n, elements, iterations)
}

#[allow(clippy::too_many_arguments)]
pub fn spawn_allreduce_from(
    tb: &Testbed,
    ns: &str,
    job: u16,
    rank: u16,
    n: u16,
    elements: usize,
    iterations: u32,
) -> Child {
    spawn_allreduce_with(tb, ns, job, rank, n, elements, iterations, 20)
}

/// As [`spawn_allreduce_from`], with the worker's stall deadline in seconds.
#[allow(clippy::too_many_arguments)]
pub fn spawn_allreduce_with(
    tb: &Testbed,
    ns: &str,
    job: u16,
    rank: u16,
    n: u16,
    elements: usize,
    iterations: u32,
    stall_secs: u32,
) -> Child {
    spawn_piped(allreduce_cmd(
        tb, ns, job, rank, n, elements, iterations, stall_secs,
    ))
}

/// The command [`spawn_allreduce_with`] starts, for a test to add flags to
/// (a `--transport`) before starting it with [`spawn_piped`].
#[allow(clippy::too_many_arguments)]
pub fn allreduce_cmd(
    tb: &Testbed,
    ns: &str,
    job: u16,
    rank: u16,
    n: u16,
    elements: usize,
    iterations: u32,
    stall_secs: u32,
) -> Command {
    let mut c = tb.cmd_in(ns, worker_bin());
    c.args(["allreduce", "--switch", &tb.switch_addr().to_string()])
        .args(["--job", &job.to_string(), "--rank", &rank.to_string()])
        .args(["--workers", &n.to_string()])
        // Not --secret: that one warns that /proc/PID/cmdline shows it.
        .env(proto::secret::SECRET_ENV, SECRET)
        .args(["--elements", &elements.to_string()])
        .args(["--iterations", &iterations.to_string()])
        .args([
            "--verify",
            "--json",
            "--stall-timeout",
            &stall_secs.to_string(),
        ]);
    c
}

/// Every rank of job `job` (`n` workers, worker r in namespace r):
/// `iterations` verified all-reduces of `elements` with `extra` worker
/// flags; returns their reports once all exited 0 with `verified: true`.
pub fn run_ranks_verified(
    tb: &Testbed,
    job: u16,
    n: u16,
    (elements, iterations): (usize, u32),
    stall_secs: u32,
    extra: &[&str],
) -> Vec<serde_json::Value> {
    let children: Vec<Child> = (0..n)
        .map(|r| {
            let mut c = allreduce_cmd(
                tb,
                &tb.worker_ns(r),
                job,
                r,
                n,
                elements,
                iterations,
                stall_secs,
            );
            c.args(extra);
            spawn_piped(c)
        })
        .collect();
    expect_verified(children)
}

/// Starts a worker command with its stdout and stderr piped (what
/// [`expect_verified`] reads).
pub fn spawn_piped(mut c: Command) -> Child {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting worker")
}

/// Waits for workers; asserts each exited 0 and reported verified=true.
pub fn expect_verified(children: Vec<Child>) -> Vec<serde_json::Value> {
    children
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let out = wait_with_timeout(c, Duration::from_secs(300));
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success(),
                "worker {i} failed ({}):\n{stdout}\n{stderr}",
                out.status
            );
            let line = stdout
                .lines()
                .rev()
                .find(|l| l.starts_with('{'))
                .unwrap_or("{}");
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["verified"], true, "worker {i} not verified: {v}");
            v
        })
        .collect()
}

/// Waits for a child, killing it after `limit`.
pub fn wait_with_timeout(mut c: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        match c.try_wait() {
            Ok(Some(_)) => break,
            _ if Instant::now() > deadline => {
                let _ = c.kill();
                break;
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    c.wait_with_output().expect("collecting child output")
}

/// Anything with named network namespaces to run commands in: a
/// single-switch [`Testbed`] or a [`LeafSpine`] fabric.
pub trait Netns {
    /// A command run inside namespace `ns`.
    fn cmd_in(&self, ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(program);
        c
    }
}

impl Netns for Testbed {}

/// Runs `probe.py ARGS` in `ns` to completion.
pub fn probe(tb: &impl Netns, ns: &str, args: &[&str]) -> Output {
    tb.cmd_in(ns, "python3")
        .arg(probe_script())
        .args(args)
        .output()
        .expect("running probe.py")
}

/// Starts `probe.py ARGS` in `ns` and waits for its "ready" line.
pub fn probe_listener(
    tb: &impl Netns,
    ns: &str,
    args: &[&str],
) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut c = tb
        .cmd_in(ns, "python3")
        .arg(probe_script())
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting probe.py");
    let mut r = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "probe listener did not start");
    (c, r)
}

/// What a finished command printed, stdout then stderr, for messages.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `tests/attack.py ARGS` in `ns` to success; returns the count it
/// prints on its last line (frames sent or captured).
pub fn attack_py(tb: &impl Netns, ns: &str, args: &[&str]) -> u64 {
    let out = tb
        .cmd_in(ns, "python3")
        .arg(repo_root().join("tests/attack.py"))
        .args(args)
        .output()
        .expect("running tests/attack.py");
    assert!(out.status.success(), "attack.py {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("attack.py {args:?} printed no count: {}", text(&out)))
}

/// Runs `tests/attack_port.py ARGS` in `ns` to success; returns its last
/// line (a count, or the JSON of a probe).
pub fn attack_port_py(tb: &impl Netns, ns: &str, args: &[&str]) -> String {
    let out = tb
        .cmd_in(ns, "python3")
        .arg(repo_root().join("tests/attack_port.py"))
        .args(args)
        .output()
        .expect("running tests/attack_port.py");
    assert!(
        out.status.success(),
        "attack_port.py {args:?}: {}",
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_else(|| panic!("attack_port.py {args:?} printed nothing: {}", text(&out)))
        .to_owned()
}

/// The MAC address of `dev` in namespace `ns`.
pub fn mac_of(ns: &str, dev: &str) -> String {
    let out = Command::new("ip")
        .args(["-n", ns, "-j", "link", "show", dev])
        .output()
        .expect("ip link show");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("ip -j link show {dev} in {ns}: {e}: {}", text(&out)));
    v[0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no address for {dev} in {ns}: {v}"))
        .to_owned()
}

/// The local UDP port of the worker's socket to the switch in `ns` (what
/// the issue's attacker found by scanning, in 0.6–2.6 s).
pub fn worker_port(tb: &Testbed, ns: &str) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(20);
    let switch = tb.switch_endpoint().to_string();
    loop {
        let out = tb
            .cmd_in(ns, "ss")
            .args(["-Hunp", "dst", &switch])
            .output()
            .expect("ss");
        let found = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("\"worker\""))
            .find_map(|l| {
                // The local address is the column before the switch's (ss
                // prints a State column or not, by version and filter).
                let cols: Vec<&str> = l.split_whitespace().collect();
                let peer = cols.iter().position(|c| *c == switch)?;
                cols.get(peer.checked_sub(1)?)?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()
            });
        if let Some(p) = found {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "no worker socket to the switch in {ns}: {}",
            text(&out)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A switch-wide counter of a stats snapshot; panics if it is missing.
pub fn counter(stats: &serde_json::Value, name: &str) -> u64 {
    stats[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name} in {stats}"))
}

/// Sum of port counter `field` over the ports whose name starts with `prefix`.
pub fn port_sum(stats: &serde_json::Value, prefix: &str, field: &str) -> u64 {
    stats["ports"]
        .as_array()
        .unwrap_or_else(|| panic!("no ports in stats: {stats}"))
        .iter()
        .filter(|p| p["name"].as_str().unwrap_or("").starts_with(prefix))
        .map(|p| {
            p[field]
                .as_u64()
                .unwrap_or_else(|| panic!("port counter {field} missing: {p}"))
        })
        .sum()
}

/// Three pings from `ns` to `addr` must be answered.
pub fn ping(tb: &impl Netns, ns: &str, addr: impl std::fmt::Display) {
    let addr = addr.to_string();
    let out = tb
        .cmd_in(ns, "ping")
        .args(["-c", "3", "-i", "0.2", "-W", "2", &addr])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ping {addr} from {ns} failed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `sha256sum` of a file, hex.
pub fn sha256_of(path: &std::path::Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

/// Sends `len` pseudo-random bytes over TCP from host 0 to host 1 and checks
/// that the same bytes arrived (SHA-256 and length).
pub fn tcp_transfer(tb: &Testbed, sw: &Switchd, len: usize) {
    let (h0, h1) = (tb.host_ns(0), tb.host_ns(1));
    tcp_transfer_between(tb, &sw.dir, &h0, &h1, tb.host_addr(1), 5001, len);
}

/// Sends `len` pseudo-random bytes over TCP from namespace `from` to
/// `to_addr:port` in namespace `to` (the file is written in `dir`) and
/// checks that the same bytes arrived (SHA-256 and length).
pub fn tcp_transfer_between(
    tb: &impl Netns,
    dir: &Path,
    from: &str,
    to: &str,
    to_addr: impl std::fmt::Display,
    port: u16,
    len: usize,
) {
    let to_addr = to_addr.to_string();
    let to_addr = to_addr.as_str();
    let port = port.to_string();
    let file = dir.join(format!("random-{port}.bin"));
    let data: Vec<u8> = {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    std::fs::write(&file, &data).unwrap();
    let want = sha256_of(&file);
    let (rx, mut lines) = probe_listener(tb, to, &["tcp-recv", to_addr, &port, "60"]);
    let send = probe(
        tb,
        from,
        &["tcp-send", to_addr, &port, file.to_str().unwrap()],
    );
    assert!(send.status.success(), "tcp-send failed: {send:?}");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut lines, &mut line).unwrap();
    let out = wait_with_timeout(rx, Duration::from_secs(60));
    assert!(out.status.success());
    assert_eq!(
        line.trim(),
        format!("{want} {len}"),
        "TCP payload changed from {from} to {to_addr}"
    );
}

/// Runs `scripts/impair.sh NS eth0 ARGS…`; Ok(stdout) or Err(what it said).
pub fn impair_sh(ns: &str, args: &[&str]) -> Result<String, String> {
    impair_dev(ns, "eth0", args)
}

/// Runs `scripts/impair.sh NS DEV ARGS…`; Ok(stdout) or Err(what it said).
pub fn impair_dev(ns: &str, dev: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/impair.sh"))
        .args([ns, dev])
        .args(args)
        .output()
        .map_err(|e| format!("running scripts/impair.sh: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`scripts/impair.sh {ns} {dev} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// What `scripts/impair.sh` injected, summed over all impaired links and
/// both directions.
#[derive(Default, Debug)]
pub struct Injected {
    /// Aggregation frames the BPF program saw.
    pub frames: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub delayed: u64,
}

/// Loss, duplication and reordering of aggregation frames (UDP `AGG_PORT`)
/// on a set of links, both directions (`scripts/impair.sh`): eth0 of every
/// worker namespace (faults.rs says why there and not on the switch's
/// ports), or a fabric's leaf–spine links. They go with the namespaces.
pub struct Impairment {
    /// (namespace, interface) of every impaired link.
    links: Vec<(String, String)>,
}

impl Impairment {
    /// Percentages of frames lost, duplicated and reordered, each direction,
    /// on eth0 of every worker.
    pub fn apply(
        tb: &Testbed,
        loss_pct: f64,
        dup_pct: f64,
        reorder_pct: f64,
    ) -> Result<Impairment, String> {
        Impairment::apply_on(Self::worker_links(tb), loss_pct, dup_pct, reorder_pct)
    }

    /// (namespace, "eth0") of every worker of `tb`.
    fn worker_links(tb: &Testbed) -> Vec<(String, String)> {
        (0..tb.workers)
            .map(|i| (tb.worker_ns(i), "eth0".to_owned()))
            .collect()
    }

    /// As [`Impairment::apply`], on every IPv4 packet the workers' eth0
    /// sends and receives, not only UDP `AGG_PORT`'s: with seq lanes, DATA
    /// goes to the ports after it, and with lane replies RESULTs come from
    /// them (docs/design/worker-threads.md). A worker's eth0 carries nothing
    /// else of IPv4; ARP passes.
    pub fn apply_every_port(
        tb: &Testbed,
        loss_pct: f64,
        dup_pct: f64,
        reorder_pct: f64,
    ) -> Result<Impairment, String> {
        Impairment::apply_on_port(Self::worker_links(tb), 0, loss_pct, dup_pct, reorder_pct)
    }

    /// The same on each (namespace, interface) of `links`, both directions:
    /// what the interface sends (egress) and what it receives (ingress).
    pub fn apply_on(
        links: Vec<(String, String)>,
        loss_pct: f64,
        dup_pct: f64,
        reorder_pct: f64,
    ) -> Result<Impairment, String> {
        Impairment::apply_on_port(links, AGG_PORT, loss_pct, dup_pct, reorder_pct)
    }

    /// [`Impairment::apply_on`] for UDP `port`'s packets only, or every
    /// IPv4 packet with `port` 0 (`impair.sh --udp-port`).
    fn apply_on_port(
        links: Vec<(String, String)>,
        port: u16,
        loss_pct: f64,
        dup_pct: f64,
        reorder_pct: f64,
    ) -> Result<Impairment, String> {
        let args = format!(
            "--udp-port {port} --loss {loss_pct} --dup {dup_pct} --reorder {reorder_pct} \
             --reorder-rate 100"
        );
        let args: Vec<&str> = args.split_whitespace().collect();
        for (ns, dev) in &links {
            impair_dev(ns, dev, &args)?;
            impair_dev(ns, dev, &[&args[..], &["--ingress"]].concat())?;
        }
        Ok(Impairment { links })
    }

    /// Removes the impairment from every link (`impair.sh --clear`): the
    /// links carry everything again.
    pub fn clear(self) {
        for (ns, dev) in &self.links {
            impair_dev(ns, dev, &["--clear"]).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    /// What was injected so far, from `impair.sh --stats`.
    pub fn injected(&self) -> Injected {
        let mut sum = Injected::default();
        for (ns, dev) in &self.links {
            for hook in [&[][..], &["--ingress"][..]] {
                let line = impair_dev(ns, dev, &[&["--stats"][..], hook].concat())
                    .unwrap_or_else(|e| panic!("{e}"));
                // "dropped=N duplicated=N delayed=N seen=N marked=N"
                for kv in line.split_whitespace() {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    let v: u64 = v
                        .parse()
                        .unwrap_or_else(|_| panic!("impair.sh --stats: {line}"));
                    match k {
                        "seen" => sum.frames += v,
                        "dropped" => sum.dropped += v,
                        "duplicated" => sum.duplicated += v,
                        "delayed" => sum.delayed += v,
                        _ => {}
                    }
                }
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    /// The spread check of the multi-thread tests: an even split passes, a
    /// thread with nothing or with a sliver fails.
    #[test]
    fn fair_shares_fail_when_one_thread_takes_nearly_all() {
        assert!(super::fair_shares(&[20_909, 20_634]));
        assert!(super::fair_shares(&[30, 20, 25, 25]));
        assert!(!super::fair_shares(&[35_006, 0]));
        assert!(!super::fair_shares(&[10_000, 100]));
        assert!(!super::fair_shares(&[0, 0]));
        assert!(!super::fair_shares(&[]));
    }

    /// Every `#[test]` in `tests/tests/*.rs` needs root (a testbed, XDP), so
    /// each must be `#[ignore = "needs root"]`: otherwise a `cargo test`
    /// without root would count it as passed after its skip message.
    #[test]
    fn every_end_to_end_test_is_ignored_as_needing_root() {
        let dir = super::repo_root().join("tests/tests");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no test files in {}", dir.display());
        let mut tests = 0;
        let mut missing = Vec::new();
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            let lines: Vec<&str> = text.lines().map(str::trim).collect();
            for (i, line) in lines.iter().enumerate() {
                if *line != "#[test]" {
                    continue;
                }
                tests += 1;
                // The attributes between #[test] and the fn.
                let attrs = lines[i + 1..].iter().take_while(|l| l.starts_with("#["));
                if !attrs.clone().any(|l| *l == r#"#[ignore = "needs root"]"#) {
                    missing.push(format!("{}:{}", f.display(), i + 1));
                }
            }
        }
        assert!(tests > 0, "no #[test] found in {}", dir.display());
        assert!(
            missing.is_empty(),
            "tests without #[ignore = \"needs root\"]: {missing:?}"
        );
    }
}
