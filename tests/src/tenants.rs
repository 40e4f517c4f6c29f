//! Tenants and self-provisioned jobs on the e2e testbeds (docs/PROTOCOL.md,
//! "Tenants and self-provisioned jobs"): tenant keys in files, the
//! `[[tenant]]` sections of a test's switchd config, workers that name
//! their job (`worker allreduce --tenant T --tenant-key-file F --job-name
//! NAME`), and what switchd lists of the jobs it made.
//!
//! Owns: [`KeyDir`] (a directory of mode-0600 tenant key files, removed on
//! drop), [`TenantKey`] (one tenant's name, key file and key), [`tenant`]
//! (its `[[tenant]]` section), [`provisioned_cmd`] (a rank of a named
//! job), [`jobs_listing`] / [`provisioned_jobs`] (`switchctl --json jobs`).
//!
//! Invariants: every key is 32 fresh random bytes (never a weak one
//! switchd would refuse), written only to a file its owner alone can read;
//! no key is ever on a command line (workers read the file).

use std::io::Read;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use switchd::config_builder::TenantBuilder;

use crate::{text, worker_bin, Netns, Switchd};

/// A directory of tenant key files, removed (with its files) on drop.
pub struct KeyDir {
    pub dir: PathBuf,
}

/// One tenant's name, its key file and the key in it.
#[derive(Debug, Clone)]
pub struct TenantKey {
    pub name: String,
    pub path: PathBuf,
    pub key: [u8; 32],
}

impl KeyDir {
    /// A fresh directory named after `tag` (the test's testbed prefix).
    pub fn new(tag: &str) -> KeyDir {
        let dir = std::env::temp_dir().join(format!("agg-e2e-keys-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        KeyDir { dir }
    }

    /// Writes a new random key for tenant `name`, mode 0600.
    pub fn key(&self, name: &str) -> TenantKey {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut key = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut key))
            .expect("reading /dev/urandom");
        let path = self.dir.join(format!("{name}.key"));
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| writeln!(f, "{hex}"))
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        TenantKey {
            name: name.to_owned(),
            path,
            key,
        }
    }
}

impl Drop for KeyDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl TenantKey {
    /// The secret of this tenant's job `job_name`, as 64 hex digits
    /// (`proto::provision::job_secret`: what every rank derives).
    pub fn job_secret_hex(&self, job_name: &str) -> String {
        let tenant = proto::provision::TenantName::new(&self.name).expect("a tenant name");
        let job = proto::provision::JobName::new(job_name).expect("a job name");
        proto::provision::job_secret(&self.key, &tenant, &job)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    pub fn path_str(&self) -> &str {
        self.path.to_str().expect("a UTF-8 temp path")
    }
}

/// The `[[tenant]]` of `key`'s tenant, its workers sending from `allowed`
/// (more keys with [`TenantBuilder::set`]).
pub fn tenant(key: &TenantKey, allowed: &[impl std::fmt::Display]) -> TenantBuilder {
    TenantBuilder::new(&key.name, &key.path, allowed)
}

/// What one rank of a self-provisioned job runs.
#[derive(Debug, Clone)]
pub struct Named<'a> {
    pub key: &'a TenantKey,
    /// The tenant the worker names (`key.name` unless a test lies).
    pub tenant: &'a str,
    pub job_name: &'a str,
    pub rank: u16,
    pub n: u16,
    pub elements: usize,
    pub iterations: u32,
}

impl<'a> Named<'a> {
    /// Rank `rank` of `n` of `key`'s tenant's job `job_name`.
    pub fn new(key: &'a TenantKey, job_name: &'a str, rank: u16, n: u16) -> Named<'a> {
        Named {
            key,
            tenant: &key.name,
            job_name,
            rank,
            n,
            elements: 1000,
            iterations: 1,
        }
    }

    /// `iterations` all-reduces of `elements`.
    pub fn size(mut self, elements: usize, iterations: u32) -> Named<'a> {
        self.elements = elements;
        self.iterations = iterations;
        self
    }
}

/// `worker allreduce --tenant … --tenant-key-file … --job-name …` for
/// `job` in namespace `ns`, against the switch at `switch`: verified,
/// JSON report, a 20 s stall deadline (as [`crate::spawn_allreduce`]).
pub fn provisioned_cmd(net: &impl Netns, ns: &str, switch: Ipv4Addr, job: &Named) -> Command {
    let mut c = net.cmd_in(ns, worker_bin());
    c.args(["allreduce", "--switch", &switch.to_string()])
        .args([
            "--tenant",
            job.tenant,
            "--tenant-key-file",
            job.key.path_str(),
        ])
        .args(["--job-name", job.job_name])
        .args(["--rank", &job.rank.to_string()])
        .args(["--workers", &job.n.to_string()])
        .args(["--elements", &job.elements.to_string()])
        .args(["--iterations", &job.iterations.to_string()])
        .args(["--verify", "--json", "--stall-timeout", "20"]);
    c
}

/// `switchctl --json jobs`: one listing per job (`origin`, `tenant`,
/// `job_name`, `lease_left_secs`, `pool_bytes`, …).
pub fn jobs_listing(sw: &Switchd) -> Vec<serde_json::Value> {
    let out = sw.switchctl(&["--json", "jobs"]);
    assert!(
        out.status.success(),
        "switchctl --json jobs: {}",
        text(&out)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("switchctl --json jobs: not JSON ({e}): {}", text(&out)));
    v.as_array()
        .cloned()
        .unwrap_or_else(|| panic!("switchctl --json jobs: not a list: {v}"))
}

/// The listings of tenant `tenant`'s provisioned jobs.
pub fn provisioned_jobs(sw: &Switchd, tenant: &str) -> Vec<serde_json::Value> {
    jobs_listing(sw)
        .into_iter()
        .filter(|j| j["origin"] == "provisioned" && j["tenant"] == tenant)
        .collect()
}

/// Waits up to `secs` until `pred` holds of `switchctl --json jobs`;
/// returns how long it took, or panics naming `what` with the listing.
pub fn wait_jobs(
    sw: &Switchd,
    secs: f64,
    what: &str,
    pred: impl Fn(&[serde_json::Value]) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let jobs = jobs_listing(sw);
        if pred(&jobs) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs_f64(secs),
            "timed out after {secs} s waiting for {what}; switchctl jobs: {jobs:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Resident memory of process `pid` in KiB (`VmRSS` of /proc/PID/status).
pub fn rss_kib(pid: u32) -> u64 {
    let path = Path::new("/proc").join(pid.to_string()).join("status");
    let status = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in {}:\n{status}", path.display()))
}
