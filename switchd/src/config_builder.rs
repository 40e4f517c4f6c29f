//! The one typed builder of switchd config files for testbeds: `switchd
//! testbed-config` ([`crate::testbed_config`], single switch and
//! leaf-spine) and the end-to-end tests (`tests/src/config.rs`) both write
//! their configs through it, so the shape of a testbed switch's config
//! (ports, address, jobs of 256 slots, a leaf's `[job.upstream]`, tenants)
//! is said once.
//!
//! Owns: [`ConfigBuilder`] (`[switch]`, its jobs and tenants),
//! [`JobBuilder`] (one `[[job]]`) and [`TenantBuilder`] (one `[[tenant]]`). Invariant: [`ConfigBuilder::render`] only returns text
//! that deserialises into switchd's typed [`ConfigFile`]; every key a
//! builder does not set takes switchd's own default, and a misspelt key or
//! a value of the wrong type is an error carrying switchd's message.

use std::fmt::Display;
use std::net::Ipv4Addr;

use crate::config::ConfigFile;

/// Slots of every job the builders make (switchd's pool per job).
pub const POOL_SLOTS: i64 = 256;

/// A config switchd would refuse, or a key set on a job or tenant that is
/// not there.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("switchd would refuse this config: {0}")]
    Invalid(String),
    #[error("job.{id}.{key}: no job {id} in this config")]
    NoSuchJob { id: u16, key: String },
    #[error("tenant.{name}.{key}: no tenant {name} in this config")]
    NoSuchTenant { name: String, key: String },
}

/// One `[[job]]`: id, ranks, allowed sources, secret, [`POOL_SLOTS`] slots,
/// and whatever [`JobBuilder::set`] adds.
#[derive(Debug, Clone)]
pub struct JobBuilder(toml::Table);

impl JobBuilder {
    /// `allowed`: the job's source prefixes (`Ipv4Net`s, or text as switchd
    /// reads it).
    pub fn new(id: u16, n_workers: u16, allowed: &[impl Display], secret: &str) -> JobBuilder {
        JobBuilder(toml::Table::from_iter([
            ("id".to_owned(), i64::from(id).into()),
            ("n_workers".to_owned(), i64::from(n_workers).into()),
            (
                "allowed_sources".to_owned(),
                toml::Value::Array(allowed.iter().map(|a| a.to_string().into()).collect()),
            ),
            ("secret".to_owned(), secret.into()),
            ("pool_slots".to_owned(), POOL_SLOTS.into()),
        ]))
    }

    /// Sets a job key (`dtype`, `stats`, `window`, `auth`, …).
    pub fn set(mut self, key: &str, value: impl Into<toml::Value>) -> JobBuilder {
        self.0.insert(key.into(), value.into());
        self
    }

    /// A leaf's place in its trees (`[job.upstream]`): its index, the leaf
    /// count and the spines' aggregation addresses (`ADDR:PORT`) in tree
    /// order.
    pub fn upstream(self, leaf_index: u16, n_leaves: u16, spines: &[String]) -> JobBuilder {
        self.set("upstream", upstream_table(leaf_index, n_leaves, spines))
    }

    fn id(&self) -> Option<i64> {
        self.0.get("id").and_then(toml::Value::as_integer)
    }
}

/// `[tenant.upstream]` / `[job.upstream]`: a leaf's index, the leaf count
/// and the spines' aggregation addresses in tree order.
fn upstream_table(leaf_index: u16, n_leaves: u16, spines: &[String]) -> toml::Table {
    toml::Table::from_iter([
        ("leaf_index".to_owned(), i64::from(leaf_index).into()),
        ("n_leaves".to_owned(), i64::from(n_leaves).into()),
        (
            "spines".to_owned(),
            toml::Value::Array(spines.iter().map(|s| s.as_str().into()).collect()),
        ),
    ])
}

/// One `[[tenant]]`: name, key file, allowed sources, and whatever
/// [`TenantBuilder::set`] adds (every other key takes switchd's default).
#[derive(Debug, Clone)]
pub struct TenantBuilder(toml::Table);

impl TenantBuilder {
    /// `allowed`: the tenant's source prefixes (`Ipv4Net`s, or text as
    /// switchd reads it); `key_file`: the key's path (64 hex digits).
    pub fn new(name: &str, key_file: &std::path::Path, allowed: &[impl Display]) -> TenantBuilder {
        TenantBuilder(toml::Table::from_iter([
            ("name".to_owned(), name.into()),
            (
                "key_file".to_owned(),
                key_file.to_string_lossy().into_owned().into(),
            ),
            (
                "allowed_sources".to_owned(),
                toml::Value::Array(allowed.iter().map(|a| a.to_string().into()).collect()),
            ),
        ]))
    }

    /// Sets a tenant key (`max_jobs`, `job_ids`, `lease_secs`, `dtypes`, …).
    pub fn set(mut self, key: &str, value: impl Into<toml::Value>) -> TenantBuilder {
        self.0.insert(key.into(), value.into());
        self
    }

    /// On a leaf: its jobs go up to `spines` (`[tenant.upstream]`).
    pub fn upstream(self, leaf_index: u16, n_leaves: u16, spines: &[String]) -> TenantBuilder {
        self.set("upstream", upstream_table(leaf_index, n_leaves, spines))
    }

    fn name(&self) -> Option<&str> {
        self.0.get("name").and_then(toml::Value::as_str)
    }
}

/// A whole config: `[switch]`, its jobs and its tenants.
#[derive(Debug, Clone)]
pub struct ConfigBuilder {
    switch: toml::Table,
    jobs: Vec<JobBuilder>,
    tenants: Vec<TenantBuilder>,
}

impl ConfigBuilder {
    /// `[switch]` on `ports` at `address`.
    pub fn new(ports: &[String], address: Ipv4Addr) -> ConfigBuilder {
        ConfigBuilder {
            switch: toml::Table::from_iter([
                (
                    "ports".to_owned(),
                    toml::Value::Array(ports.iter().map(|p| p.as_str().into()).collect()),
                ),
                (
                    "addresses".to_owned(),
                    toml::Value::Array(vec![address.to_string().into()]),
                ),
            ]),
            jobs: Vec::new(),
            tenants: Vec::new(),
        }
    }

    /// Sets a `[switch]` key.
    pub fn set(mut self, key: &str, value: impl Into<toml::Value>) -> ConfigBuilder {
        self.switch.insert(key.into(), value.into());
        self
    }

    /// Sets every key of a TOML table in `[switch]`.
    pub fn extend(mut self, keys: toml::Table) -> ConfigBuilder {
        self.switch.extend(keys);
        self
    }

    pub fn job(mut self, job: JobBuilder) -> ConfigBuilder {
        self.jobs.push(job);
        self
    }

    pub fn tenant(mut self, tenant: TenantBuilder) -> ConfigBuilder {
        self.tenants.push(tenant);
        self
    }

    /// Sets `key` of tenant `name`; an error when there is no such tenant.
    pub fn set_tenant(
        mut self,
        name: &str,
        key: &str,
        value: impl Into<toml::Value>,
    ) -> Result<ConfigBuilder, BuildError> {
        let tenant = self
            .tenants
            .iter_mut()
            .find(|t| t.name() == Some(name))
            .ok_or_else(|| BuildError::NoSuchTenant {
                name: name.to_owned(),
                key: key.to_owned(),
            })?;
        tenant.0.insert(key.into(), value.into());
        Ok(self)
    }

    /// Sets `key` of every job.
    pub fn set_jobs(mut self, key: &str, value: impl Into<toml::Value> + Clone) -> ConfigBuilder {
        self.jobs = self
            .jobs
            .into_iter()
            .map(|j| j.set(key, value.clone()))
            .collect();
        self
    }

    /// Sets `key` of job `id`; an error when there is no such job.
    pub fn set_job(
        mut self,
        id: u16,
        key: &str,
        value: impl Into<toml::Value>,
    ) -> Result<ConfigBuilder, BuildError> {
        let job = self
            .jobs
            .iter_mut()
            .find(|j| j.id() == Some(id.into()))
            .ok_or_else(|| BuildError::NoSuchJob {
                id,
                key: key.to_owned(),
            })?;
        job.0.insert(key.into(), value.into());
        Ok(self)
    }

    /// The config as switchd's typed sections took it.
    pub fn file(&self) -> Result<ConfigFile, BuildError> {
        let tree = toml::Table::from_iter([
            ("switch".to_owned(), self.switch.clone().into()),
            (
                "job".to_owned(),
                toml::Value::Array(self.jobs.iter().map(|j| j.0.clone().into()).collect()),
            ),
            (
                "tenant".to_owned(),
                toml::Value::Array(self.tenants.iter().map(|t| t.0.clone().into()).collect()),
            ),
        ]);
        tree.try_into()
            .map_err(|e: toml::de::Error| BuildError::Invalid(e.to_string()))
    }

    /// The file's text (every key, defaults included), after switchd's
    /// typed sections took it.
    pub fn render(&self) -> Result<String, BuildError> {
        toml::to_string(&self.file()?).map_err(|e| BuildError::Invalid(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "5ca1ab1e5ca1ab1e0123456789abcdef5ca1ab1e5ca1ab1e0123456789abcdef";
    const ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

    #[test]
    fn a_built_config_parses_as_switchd_reads_it() {
        let text = ConfigBuilder::new(&["sw-w0".into(), "sw-w1".into()], ADDR)
            .set("queues", 2)
            .set("uplink", "198.18.0.1:40000")
            .job(JobBuilder::new(3, 2, &["198.18.0.0/24"], SECRET).upstream(
                1,
                2,
                &["198.19.255.1:48879".into()],
            ))
            .set_job(3, "dtype", "bf16")
            .unwrap()
            .render()
            .unwrap();
        let cfg = crate::config::Config::parse(&text, std::path::Path::new("t"), |_| Some(1500))
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(cfg.switch.ports, ["sw-w0", "sw-w1"]);
        assert_eq!(cfg.switch.queues, 2);
        let j = &cfg.jobs[0];
        assert_eq!((j.id, j.n_workers), (3, 2));
        assert_eq!(j.dtype, proto::wire::Dtype::Bf16);
        let up = j.upstream.as_ref().expect("upstream");
        assert_eq!((up.leaf_index, up.n_leaves), (1, 2));
    }

    #[test]
    fn tenants_round_trip_and_a_config_of_tenants_alone_parses() {
        let dir = std::env::temp_dir().join(format!(
            "switchd-builder-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("t.key");
        std::fs::write(&key, SECRET).unwrap();
        let text = ConfigBuilder::new(&["sw-w0".into()], ADDR)
            .set("uplink", "198.18.0.1:40000")
            .tenant(
                TenantBuilder::new("team-a", &key, &["198.18.0.0/24"])
                    .set("max_jobs", 2)
                    .upstream(0, 2, &["198.19.255.1:48879".into()]),
            )
            .tenant(TenantBuilder::new("team-b", &key, &["198.18.1.0/24"]))
            .set_tenant(
                "team-b",
                "job_ids",
                toml::Value::Array(vec![1.into(), 99.into()]),
            )
            .unwrap()
            .set_tenant("team-b", "dtypes", toml::Value::Array(vec!["bf16".into()]))
            .unwrap()
            .render()
            .unwrap();
        let cfg = crate::config::Config::parse(&text, std::path::Path::new("t"), |_| Some(1500))
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(cfg.jobs.is_empty());
        let (a, b) = (&cfg.tenants[0], &cfg.tenants[1]);
        assert_eq!(
            (a.name.as_str(), a.max_jobs, a.job_ids),
            ("team-a", 2, (32768, 65535))
        );
        assert_eq!(a.upstream.as_ref().map(|u| u.n_leaves), Some(2));
        assert_eq!(
            (b.job_ids, b.dtypes.as_slice()),
            ((1, 99), &[proto::wire::Dtype::Bf16][..])
        );
        // Every key is written, defaults included.
        assert!(text.contains("lease_secs = 60"), "{text}");
        let e = ConfigBuilder::new(&["sw-w0".into()], ADDR)
            .tenant(TenantBuilder::new("a", &key, &["198.18.0.0/24"]).set("max_job", 2))
            .render()
            .unwrap_err();
        assert!(e.to_string().contains("max_job"), "{e}");
        let e = ConfigBuilder::new(&["sw-w0".into()], ADDR)
            .set_tenant("nobody", "max_jobs", 1)
            .unwrap_err();
        assert!(e.to_string().contains("no tenant nobody"), "{e}");
    }

    #[test]
    fn typos_and_missing_jobs_are_errors() {
        let base = ConfigBuilder::new(&["sw-w0".into()], ADDR).job(JobBuilder::new(
            1,
            1,
            &["198.18.0.10/32"],
            SECRET,
        ));
        let e = base.clone().set("queus", 2).render().unwrap_err();
        assert!(e.to_string().contains("queus"), "{e}");
        let e = base.clone().set("queues", "two").render().unwrap_err();
        assert!(matches!(e, BuildError::Invalid(_)), "{e}");
        let e = base.set_job(2, "window", 8).unwrap_err();
        assert!(e.to_string().contains("no job 2"), "{e}");
    }
}
