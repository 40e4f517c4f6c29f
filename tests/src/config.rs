//! switchd configs for the e2e testbeds, written by switchd's own typed
//! builder ([`switchd::config_builder`], the one `switchd testbed-config`
//! writes the scripts' configs with): no test writes TOML by hand, and a key
//! or value switchd would refuse fails the test where it is set, with
//! switchd's message.
//!
//! Owns: [`SwitchConfig`] (a `[switch]` section, its jobs and tenants, one summary
//! line a second), [`Job`] (the tests' secret), and the aggregation trees'
//! configs ([`spine_config`], [`leaf_config`]). Ports and addresses come
//! from the testbed ([`SwitchConfig::for_testbed`], [`LeafSpine`]'s
//! accessors), as `testbed.sh --print-env` printed them.

use std::fmt::Display;
use std::net::Ipv4Addr;

use switchd::config_builder::{ConfigBuilder, JobBuilder, TenantBuilder};

use crate::{LeafSpine, Testbed, AGG_PORT, SECRET};

/// The UDP port a leaf's partial sums go up from.
pub const UPLINK_PORT: u16 = 40000;

/// One `[[job]]`: id, workers, sources, the tests' secret, 256 slots, and
/// whatever [`Job::set`] adds.
#[derive(Debug, Clone)]
pub struct Job(JobBuilder);

impl Job {
    /// `allowed`: the job's source prefixes (`Ipv4Net`s, or text as
    /// switchd reads it).
    pub fn new(id: u16, n_workers: u16, allowed: &[impl Display]) -> Job {
        Job(JobBuilder::new(id, n_workers, allowed, SECRET))
    }

    /// Sets a job key (`dtype`, `stats`, `window`, `auth`, …).
    pub fn set(self, key: &str, value: impl Into<toml::Value>) -> Job {
        Job(self.0.set(key, value))
    }

    /// A leaf's place in its trees (`[job.upstream]`).
    pub fn upstream(self, leaf_index: u16, n_leaves: u16, spines: &[String]) -> Job {
        Job(self.0.upstream(leaf_index, n_leaves, spines))
    }
}

/// A whole switchd config.
#[derive(Debug, Clone)]
pub struct SwitchConfig(ConfigBuilder);

impl SwitchConfig {
    /// `[switch]` of the single switch of `tb`: its ports, at its address.
    pub fn for_testbed(tb: &Testbed) -> SwitchConfig {
        SwitchConfig::new(&tb.ports(), tb.switch_addr())
    }

    /// `[switch]` on `ports` at `address`, one summary line a second.
    pub fn new(ports: &[String], address: Ipv4Addr) -> SwitchConfig {
        SwitchConfig(ConfigBuilder::new(ports, address).set("summary_interval_secs", 1.0))
    }

    /// Sets a `[switch]` key.
    pub fn set(self, key: &str, value: impl Into<toml::Value>) -> SwitchConfig {
        SwitchConfig(self.0.set(key, value))
    }

    /// Sets the `[switch]` keys of TOML `key = value` lines (the tests'
    /// extra switch settings, e.g. `"queues = 2\ndataplane_threads = 2\n"`).
    pub fn set_lines(self, lines: &str) -> SwitchConfig {
        let t: toml::Table = toml::from_str(lines)
            .unwrap_or_else(|e| panic!("switch settings {lines:?} are not TOML: {e}"));
        SwitchConfig(self.0.extend(t))
    }

    pub fn job(self, job: Job) -> SwitchConfig {
        SwitchConfig(self.0.job(job.0))
    }

    /// A `[[tenant]]` (`crate::tenants::tenant` makes one from a key file).
    pub fn tenant(self, tenant: TenantBuilder) -> SwitchConfig {
        SwitchConfig(self.0.tenant(tenant))
    }

    /// Sets `key` of every job (trees: the one job of a spine or leaf).
    pub fn set_jobs(self, key: &str, value: impl Into<toml::Value> + Clone) -> SwitchConfig {
        SwitchConfig(self.0.set_jobs(key, value))
    }

    /// The file's text, after switchd's typed sections took it (a typo or a
    /// wrong type panics here with switchd's own message).
    pub fn render(&self) -> String {
        self.0.render().unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Spine `j` of `fabric`: job 1 of `n_leaves` leaves (from their subnets,
/// where their gateways send from), ordinary traffic through the bridge.
pub fn spine_config(fabric: &LeafSpine, j: u16, n_leaves: u16) -> SwitchConfig {
    let ports: Vec<String> = (0..n_leaves).map(|i| fabric.downlink_port(j, i)).collect();
    let leaves: Vec<_> = (0..n_leaves).map(|i| fabric.leaf_subnet(i)).collect();
    SwitchConfig::new(&ports, fabric.spine_addr(j))
        .set("forwarding", "bridge")
        .job(Job::new(1, n_leaves, &leaves))
}

/// Leaf `i` of `fabric`: job 1 of its `workers` workers, up to the first
/// `spines` spines from its gateway's [`UPLINK_PORT`].
pub fn leaf_config(
    fabric: &LeafSpine,
    i: u16,
    workers: u16,
    n_leaves: u16,
    spines: u16,
) -> SwitchConfig {
    let ports: Vec<String> = (0..workers).map(|k| fabric.worker_port(i, k)).collect();
    let gw = fabric.leaf_gateway(i);
    let spine_addrs: Vec<String> = (0..spines)
        .map(|j| format!("{}:{AGG_PORT}", fabric.spine_addr(j)))
        .collect();
    SwitchConfig::new(&ports, gw)
        .set("uplink", format!("{gw}:{UPLINK_PORT}"))
        .job(Job::new(1, workers, &[fabric.leaf_subnet(i)]).upstream(i, n_leaves, &spine_addrs))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any address and prefix do: this renders a config, nothing is sent.
    const ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const SOURCES: &str = "198.18.0.0/26";

    #[test]
    fn a_config_renders_as_switchd_reads_it_and_a_typo_panics() {
        let text = SwitchConfig::new(&["sw-w0".into()], ADDR)
            .set_lines("queues = 2\ndataplane_threads = 2\n")
            .job(Job::new(1, 2, &[SOURCES]).set("dtype", "bf16"))
            .render();
        let cfg = switchd::config::Config::parse(&text, std::path::Path::new("t"), |_| Some(1500))
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(cfg.switch.queues, 2);
        assert_eq!(cfg.jobs[0].dtype, proto::wire::Dtype::Bf16);
        let typo = std::panic::catch_unwind(|| {
            SwitchConfig::new(&["sw-w0".into()], ADDR)
                .set("queus", 2)
                .render()
        });
        assert!(typo.is_err());
    }
}
