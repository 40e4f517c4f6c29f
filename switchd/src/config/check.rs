//! Loading and checking a configuration: [`Config::load`] and
//! [`Config::parse`] (every check of the `[switch]` section, each job
//! turned into a [`JobConfig`] by [`JobSection::to_job_config`], the slot
//! pools' memory budget, each tenant turned into a [`TenantConfig`] by
//! [`TenantSection::to_tenant_config`] with its key read, and the tenants'
//! job id ranges against each other and the declared jobs), the metrics
//! address's exposure, and [`admin_socket_in`] for switchctl.
//!
//! Invariant: a [`Config`] that loaded has passed every check a job table
//! would make, so the daemon never starts half-configured. Errors name the
//! file, the line and the key.

use std::path::{Path, PathBuf};

use proto::provision::TenantName;
use proto::switch::config::max_elems_for;
use proto::switch::tenant::TenantConfig;
use proto::switch::{Ipv4Prefix, JobConfig, JobConfigError, Priority, SpineAddr, Upstream};
use proto::tag::AuthMode;
use proto::wire::Dtype;
use serde::Deserialize;

use super::file::{
    default_admin_socket, Config, ConfigFile, JobSection, SwitchSection, TenantSection,
    UpstreamSection, DEFAULT_TENANT_JOB_IDS,
};
use super::mtu::{
    default_elems_per_chunk, max_elems_per_chunk, needs_multi_buffer, sysfs_mtu,
    MAX_ELEMS_IN_FRAME, MAX_PORT_MTU,
};
use super::secrets::{parse_secret, read_tenant_key};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// Share of the machine's memory the slot pools may take by default.
pub const DEFAULT_POOL_MEMORY_FRACTION: u64 = 4;
/// The budget when /proc/meminfo cannot be read.
pub const FALLBACK_POOL_MEMORY: u64 = 1 << 30;

/// MemTotal of /proc/meminfo, in bytes.
pub fn machine_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl SwitchSection {
    /// Whether `/metrics` would listen where the workers' network reaches
    /// ([`crate::exposure`]): the unspecified address, the switch's own
    /// addresses, or one of `interfaces` (the ports' and their bridges'
    /// addresses, [`crate::exposure::data_interfaces`]). `Err`: refused,
    /// the message naming the address, why and the fix; `Ok(Some)`:
    /// allowed by `metrics_on_data_network`, the warning to log.
    pub fn check_metrics_exposure(
        &self,
        interfaces: &[crate::exposure::InterfaceAddr],
    ) -> Result<Option<String>, String> {
        let Some(addr) = self.metrics_listen.addr() else {
            return Ok(None);
        };
        let why = crate::exposure::exposure(addr.ip(), &self.addresses, self.uplink, interfaces);
        crate::exposure::check(
            addr,
            why,
            crate::exposure::Policy {
                allow: self.metrics_on_data_network,
                per_job: self.metrics_per_job,
            },
        )
    }

    /// The slot-pool memory budget in bytes.
    pub fn pool_budget_bytes(&self) -> u64 {
        match self.pool_memory_mib {
            Some(mib) => mib.saturating_mul(1 << 20),
            None => {
                machine_memory().map_or(FALLBACK_POOL_MEMORY, |m| m / DEFAULT_POOL_MEMORY_FRACTION)
            }
        }
    }
}

impl JobSection {
    /// Turns the section into a job declaration; `default_elems` (float32
    /// elements, scaled for a half-precision dtype) comes from the ports' MTU.
    /// `uplink` is `[switch] uplink`, which a job with `upstream` needs.
    /// `max_elems` is [`max_elems_per_chunk`] for the ports' MTU.
    pub fn to_job_config(
        &self,
        default_elems: u16,
        max_elems: u16,
        uplink: Option<std::net::SocketAddrV4>,
    ) -> Result<JobConfig, String> {
        let secret = parse_secret(&self.secret).map_err(|e| format!("job {}: {e}", self.id))?;
        let dtype: Dtype = match &self.dtype {
            None => Dtype::F32,
            Some(d) => d
                .parse()
                .map_err(|e| format!("job {}: dtype: {e}", self.id))?,
        };
        let auth: AuthMode = match &self.auth {
            None => AuthMode::Port,
            Some(a) => a
                .parse()
                .map_err(|e| format!("job {}: auth: {e}", self.id))?,
        };
        let priority: Priority = match &self.priority {
            None => Priority::default(),
            Some(p) => p.parse().map_err(|e| format!("job {}: {e}", self.id))?,
        };
        // switchd sends a tagged RESULT from one TX frame (the tag follows
        // the payload), so an auth = "mac" job's chunk fits one frame.
        let max_elems = match auth {
            AuthMode::Port => max_elems,
            AuthMode::Mac => max_elems.min(MAX_ELEMS_IN_FRAME),
        };
        let mut cfg = JobConfig {
            id: self.id,
            n_workers: self.n_workers,
            allowed_sources: self
                .allowed_sources
                .iter()
                .map(|n| Ipv4Prefix {
                    addr: n.network().octets(),
                    len: n.prefix_len(),
                })
                .collect(),
            secret,
            pool_slots: self.pool_slots,
            elems_per_chunk: self.elems_per_chunk.unwrap_or(default_elems),
            dtype,
            window: self.window.unwrap_or(self.pool_slots),
            priority,
            auth,
            upstream: upstream_of(self.upstream.as_ref(), uplink)
                .map_err(|e| format!("job {}: [job.upstream] {e}", self.id))?,
            stats: self.stats,
        };
        // A leaf's chunks are float32 towards its spines, whatever the
        // dtype; a mac job's leave room for the tag, a stats job's for the
        // statistics trailer.
        if self.elems_per_chunk.is_none() {
            let f32_elems = default_elems.min(max_elems);
            cfg.elems_per_chunk = max_elems_for(f32_elems, cfg.chunk_dtype(), auth, cfg.stats);
        }
        cfg.validate(max_elems)
            .map_err(|e: JobConfigError| e.to_string())?;
        Ok(cfg)
    }
}

/// `[job.upstream]` / `[tenant.upstream]` with `[switch] uplink` (which
/// it needs) as the table takes it.
fn upstream_of(
    up: Option<&UpstreamSection>,
    uplink: Option<std::net::SocketAddrV4>,
) -> Result<Option<Upstream>, String> {
    match (up, uplink) {
        (None, _) => Ok(None),
        (Some(_), None) => {
            Err("needs [switch] uplink = \"ADDR:PORT\", the address partial sums go up from".into())
        }
        (Some(u), Some(local)) => Ok(Some(Upstream {
            leaf_index: u.leaf_index,
            n_leaves: u.n_leaves,
            spines: u
                .spines
                .iter()
                .map(|a| SpineAddr {
                    ip: a.ip().octets(),
                    port: a.port(),
                })
                .collect(),
            local_ip: local.ip().octets(),
            local_port: local.port(),
        })),
    }
}

impl TenantSection {
    /// Turns the section into a tenant declaration, reading its key from
    /// `key_file` (a relative path is taken from `base`, the config file's
    /// directory; without `base` it must be absolute). `job_ids` is used
    /// when the section gives none. `uplink` is `[switch] uplink`, which a
    /// tenant with `upstream` needs. Also returns the warning the key file
    /// deserves (group or others can read it). Errors name the tenant and
    /// the key.
    pub fn to_tenant_config(
        &self,
        job_ids: Option<[u16; 2]>,
        uplink: Option<std::net::SocketAddrV4>,
        base: Option<&Path>,
    ) -> Result<(TenantConfig, Option<String>), String> {
        let name = TenantName::new(&self.name).map_err(|e| format!("tenant: name: {e}"))?;
        let t = |e: String| format!("tenant {name}: {e}");
        let key_path = match base {
            _ if self.key_file.is_absolute() => self.key_file.clone(),
            Some(dir) => dir.join(&self.key_file),
            None => {
                return Err(t(format!(
                    "key_file {} must be an absolute path",
                    self.key_file.display()
                )))
            }
        };
        let (key, warning) = read_tenant_key(&key_path).map_err(t)?;
        let mut dtypes = Vec::new();
        for d in &self.dtypes {
            let d: Dtype = d.parse().map_err(|e| t(format!("dtypes: {e}")))?;
            if !dtypes.contains(&d) {
                dtypes.push(d);
            }
        }
        let mut auth = Vec::new();
        for a in &self.auth {
            let a: AuthMode = a.parse().map_err(|e| t(format!("auth: {e}")))?;
            if !auth.contains(&a) {
                auth.push(a);
            }
        }
        let max_priority: Priority = self
            .max_priority
            .parse()
            .map_err(|e| t(format!("max_priority: {e}")))?;
        let [lo, hi] = self.job_ids.or(job_ids).ok_or_else(|| {
            t(format!(
                "job_ids is missing: with more than one tenant, give each its own range, \
                 job_ids = [FIRST, LAST] (one tenant alone gets [{}, {}])",
                DEFAULT_TENANT_JOB_IDS[0], DEFAULT_TENANT_JOB_IDS[1]
            ))
        })?;
        let upstream = upstream_of(self.upstream.as_ref(), uplink)
            .map_err(|e| t(format!("[tenant.upstream] {e}")))?;
        let cfg = TenantConfig {
            name: name.clone(),
            key,
            allowed_sources: self
                .allowed_sources
                .iter()
                .map(|n| Ipv4Prefix {
                    addr: n.network().octets(),
                    len: n.prefix_len(),
                })
                .collect(),
            max_jobs: self.max_jobs,
            max_workers_per_job: self.max_workers_per_job,
            max_pool_bytes: self.max_pool_bytes,
            dtypes,
            auth,
            max_priority,
            job_ids: (lo, hi),
            lease: std::time::Duration::from_secs(self.lease_secs),
            pool_slots: self.pool_slots,
            upstream,
        };
        cfg.validate().map_err(|e| e.to_string())?;
        Ok((cfg, warning.map(t)))
    }
}

/// Checks tenants against each other and the declared jobs: names and job
/// id ranges their own, no declared job's id inside a tenant's range.
pub fn check_tenants(tenants: &[TenantConfig], jobs: &[u16]) -> Result<(), String> {
    for (i, t) in tenants.iter().enumerate() {
        if let Some(o) = tenants[..i].iter().find(|o| o.name == t.name) {
            return Err(proto::switch::tenant::TenantError::Duplicate(o.name.clone()).to_string());
        }
        if let Some(o) = tenants[..i].iter().find(|o| o.overlaps(t)) {
            return Err(format!(
                "{} (tenant {} has [{}, {}])",
                proto::switch::tenant::TenantError::Overlap(
                    t.name.clone(),
                    t.job_ids.0,
                    t.job_ids.1,
                    o.name.clone()
                ),
                o.name,
                o.job_ids.0,
                o.job_ids.1
            ));
        }
        let (lo, hi) = t.job_ids;
        if let Some(id) = jobs.iter().find(|&&id| lo <= id && id <= hi) {
            return Err(format!(
                "tenant {}: job_ids [{lo}, {hi}] contain job {id}, a declared job: give the \
                 tenant a job_ids range without it, or the job an id outside [{lo}, {hi}]",
                t.name
            ));
        }
    }
    Ok(())
}

/// The admin socket a config file names (its `[switch] admin_socket`, or
/// the default), without checking the rest: what `switchctl --config`
/// needs to find a running switchd.
pub fn admin_socket_in(path: &Path) -> Result<PathBuf, ConfigError> {
    #[derive(Deserialize)]
    struct Switch {
        #[serde(default = "default_admin_socket")]
        admin_socket: PathBuf,
    }
    #[derive(Deserialize)]
    struct File {
        switch: Switch,
    }
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let f: File = toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string().trim_end().to_owned(),
    })?;
    Ok(f.switch.admin_socket)
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text, path, sysfs_mtu)
    }

    pub fn parse(
        text: &str,
        path: &Path,
        mtu_of: impl Fn(&str) -> Option<u16>,
    ) -> Result<Config, ConfigError> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        };
        let sw = &file.switch;
        if sw.ports.is_empty() {
            return Err(invalid(
                "switch.ports is empty: list the interfaces to attach to".into(),
            ));
        }
        if sw.ports.len() > 64 {
            return Err(invalid(format!(
                "switch.ports: at most 64 ports, got {}",
                sw.ports.len()
            )));
        }
        if sw.addresses.is_empty() {
            return Err(invalid(
                "switch.addresses is empty: give the switch's own IPv4 address(es)".into(),
            ));
        }
        if sw.queues == 0 || sw.queues > 64 {
            return Err(invalid(format!(
                "switch.queues must be 1..=64, got {}",
                sw.queues
            )));
        }
        if sw.ecn_ring_threshold.is_nan() || sw.ecn_ring_threshold <= 0.0 {
            return Err(invalid(format!(
                "switch.ecn_ring_threshold must be above 0 (1.0 turns ring marking off), got {}",
                sw.ecn_ring_threshold
            )));
        }
        let sockets = sw.ports.len() as u32 * sw.queues;
        if sw.dataplane_threads == 0 || sw.dataplane_threads > sockets {
            return Err(invalid(format!(
                "switch.dataplane_threads must be 1..={sockets} (one socket per port and queue \
                 at least per thread), got {}",
                sw.dataplane_threads
            )));
        }
        if !sw.watchdog_secs.is_finite() || sw.watchdog_secs < 0.0 {
            return Err(invalid(format!(
                "switch.watchdog_secs must be 0 (off) or more seconds, got {}",
                sw.watchdog_secs
            )));
        }
        if sw.agg_port == 0 {
            return Err(invalid("switch.agg_port must not be 0".into()));
        }
        if !sw.seq_lanes.is_power_of_two() || sw.seq_lanes > proto::wire::MAX_SEQ_LANES {
            return Err(invalid(format!(
                "switch.seq_lanes must be a power of two in 1..={}, got {} (set it to \
                 switch.queues, one lane per NIC queue)",
                proto::wire::MAX_SEQ_LANES,
                sw.seq_lanes
            )));
        }
        if u32::from(sw.agg_port) + u32::from(sw.seq_lanes) - 1 > u32::from(u16::MAX) {
            return Err(invalid(format!(
                "switch.agg_port {} + seq_lanes {} runs past UDP port 65535: lower agg_port",
                sw.agg_port, sw.seq_lanes
            )));
        }
        if !sw.frames_per_socket.is_power_of_two() || sw.frames_per_socket < 64 {
            return Err(invalid(format!(
                "switch.frames_per_socket must be a power of two ≥ 64, got {}",
                sw.frames_per_socket
            )));
        }
        for p in &sw.ports {
            match mtu_of(p) {
                Some(m) if m > MAX_PORT_MTU => {
                    return Err(invalid(format!(
                        "switch.ports: {p} has MTU {m}; switchd serves ports up to MTU \
                         {MAX_PORT_MTU} (ip link set {p} mtu {MAX_PORT_MTU})"
                    )))
                }
                _ => {}
            }
        }
        // The file alone: the ports' own addresses are checked at start
        // ([`SwitchSection::check_metrics_exposure`]).
        sw.check_metrics_exposure(&[]).map_err(invalid)?;
        let multi_buffer = needs_multi_buffer(&sw.ports, &mtu_of);
        let max_elems = max_elems_per_chunk(multi_buffer);
        let default_elems = default_elems_per_chunk(&sw.ports, &mtu_of);
        let mut jobs = Vec::new();
        let budget = sw.pool_budget_bytes();
        let mut in_use = 0u64;
        for j in &file.jobs {
            if jobs.iter().any(|c: &JobConfig| c.id == j.id) {
                return Err(invalid(format!("job {} is declared twice", j.id)));
            }
            let cfg = j
                .to_job_config(default_elems, max_elems, sw.uplink)
                .map_err(invalid)?;
            let need = cfg.pool_bytes();
            if need > budget.saturating_sub(in_use) {
                let e = JobConfigError::OverBudget {
                    id: cfg.id,
                    need,
                    budget,
                    in_use,
                };
                return Err(invalid(e.to_string()));
            }
            in_use += need;
            jobs.push(cfg);
        }
        // The default range goes to the one tenant that gives none; with
        // two or more such, each is asked for its own.
        let without_ids = file.tenants.iter().filter(|t| t.job_ids.is_none()).count();
        let default_ids = (without_ids == 1).then_some(DEFAULT_TENANT_JOB_IDS);
        let base = path.parent().filter(|d| !d.as_os_str().is_empty());
        let mut tenants = Vec::new();
        let mut key_warnings = Vec::new();
        for t in &file.tenants {
            let (cfg, warning) = t
                .to_tenant_config(default_ids, sw.uplink, Some(base.unwrap_or(Path::new("."))))
                .map_err(invalid)?;
            tenants.push(cfg);
            key_warnings.extend(warning);
        }
        let ids: Vec<u16> = jobs.iter().map(|j| j.id).collect();
        check_tenants(&tenants, &ids).map_err(invalid)?;
        Ok(Config {
            switch: file.switch,
            jobs,
            tenants,
            key_warnings,
            multi_buffer,
        })
    }
}
