//! The one writer of switchd configs for `scripts/testbed.sh` testbeds
//! (`switchd testbed-config`): the testbed's addresses come from its
//! `--print-env` lines, the config from switchd's own typed sections, and
//! every override is checked against them, so a script can neither repeat
//! the address plan nor write a key switchd would refuse.
//!
//! Owns: [`TestbedEnv`] (the `key=value` lines), [`JobSpec`] (`ID:WORKERS:
//! SECRET`), [`TenantSpec`] (`NAME:KEYFILE`), [`Override`]
//! (`switch.KEY=VALUE`, `job.ID.KEY=VALUE`, `tenant.NAME.KEY=VALUE`), [`Role`]
//! and [`Fabric`] (`--topology leaf-spine`), [`write`] and
//! [`write_leaf_spine`]; the configs themselves are built by
//! [`crate::config_builder`]. Invariant: what they return deserialises into
//! switchd's typed [`crate::config::ConfigFile`] (unknown keys and wrong
//! types are errors naming the key), and holds no secret that was given on
//! the command line.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::str::FromStr;

use crate::config_builder::{ConfigBuilder, JobBuilder, TenantBuilder};

/// What can be wrong with a testbed config request.
#[derive(Debug, thiserror::Error)]
pub enum TestbedConfigError {
    #[error(
        "the testbed env has no `{0}` (was it written by `scripts/testbed.sh up --print-env`?)"
    )]
    MissingKey(String),
    #[error("testbed env line {line}: `{text}` is not key=value")]
    BadLine { line: usize, text: String },
    #[error("testbed env `{key}` = `{value}`: {why}")]
    BadValue {
        key: String,
        value: String,
        why: String,
    },
    #[error("--job `{0}`: {1} (the form is ID:WORKERS:SECRET, e.g. 1:0-3:env:AGGSWITCH_SECRET or 2:2,3:file:/run/s2)")]
    BadJob(String, String),
    #[error("--tenant `{0}`: {1} (the form is NAME:KEYFILE, e.g. team-a:/etc/aggswitch/tenants/team-a.key)")]
    BadTenant(String, String),
    #[error(
        "--set `{0}`: {1} (the form is switch.KEY=VALUE, job.ID.KEY=VALUE or \
         tenant.NAME.KEY=VALUE)"
    )]
    BadOverride(String, String),
    #[error("reading the secret of job {job} from {source_name}: {why}")]
    Secret {
        job: u16,
        source_name: String,
        why: String,
    },
    #[error("`{0}`: not a switch of this leaf-spine testbed (the form is leaf:I or spine:J)")]
    BadRole(String),
    #[error("--trees {trees}: the testbed has {spines} spines (1..={spines} trees)")]
    BadTrees { trees: u16, spines: u16 },
    #[error("the config does not check: {0}")]
    Invalid(String),
}

type Result<T> = std::result::Result<T, TestbedConfigError>;

/// A testbed's `--print-env` lines.
#[derive(Debug, Clone)]
pub struct TestbedEnv {
    values: BTreeMap<String, String>,
}

impl TestbedEnv {
    pub fn parse(text: &str) -> Result<TestbedEnv> {
        let mut values = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| TestbedConfigError::BadLine {
                    line: i + 1,
                    text: line.to_owned(),
                })?;
            values.insert(k.to_owned(), v.to_owned());
        }
        Ok(TestbedEnv { values })
    }

    pub fn get(&self, key: &str) -> Result<&str> {
        self.values
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| TestbedConfigError::MissingKey(key.to_owned()))
    }

    fn number(&self, key: &str) -> Result<u16> {
        let v = self.get(key)?;
        v.parse()
            .map_err(|e: std::num::ParseIntError| TestbedConfigError::BadValue {
                key: key.to_owned(),
                value: v.to_owned(),
                why: e.to_string(),
            })
    }

    fn addr(&self, key: &str) -> Result<Ipv4Addr> {
        let v = self.get(key)?;
        v.parse()
            .map_err(|e: std::net::AddrParseError| TestbedConfigError::BadValue {
                key: key.to_owned(),
                value: v.to_owned(),
                why: e.to_string(),
            })
    }
}

/// Where a job's secret comes from (never the command line itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    Env(String),
    File(PathBuf),
}

/// `ID:WORKERS:SECRET`: a job of the testbed's workers WORKERS (`0-3`,
/// `2,3`, or `all`), its secret from `env:NAME` or `file:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    pub id: u16,
    /// Worker indices, ascending; `None`: every worker of the testbed.
    pub workers: Option<Vec<u16>>,
    pub secret: SecretSource,
}

impl FromStr for JobSpec {
    type Err = TestbedConfigError;

    fn from_str(s: &str) -> Result<JobSpec> {
        let bad = |why: &str| TestbedConfigError::BadJob(s.to_owned(), why.to_owned());
        let mut parts = s.splitn(3, ':');
        let (Some(id), Some(workers), Some(secret)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("three parts separated by ':' are needed"));
        };
        let id: u16 = id
            .parse()
            .ok()
            .filter(|&i| i > 0)
            .ok_or_else(|| bad("the job id is a number 1..=65535"))?;
        let workers = if workers == "all" {
            None
        } else {
            let mut list = Vec::new();
            for part in workers.split(',') {
                let (a, b) = part.split_once('-').unwrap_or((part, part));
                let (a, b): (u16, u16) = match (a.parse(), b.parse()) {
                    (Ok(a), Ok(b)) if a <= b => (a, b),
                    _ => return Err(bad("WORKERS is `all`, or indices and ranges like 0-1,3")),
                };
                list.extend(a..=b);
            }
            list.sort_unstable();
            list.dedup();
            Some(list)
        };
        let secret = match secret.split_once(':') {
            Some(("env", name)) if !name.is_empty() => SecretSource::Env(name.to_owned()),
            Some(("file", path)) if !path.is_empty() => SecretSource::File(path.into()),
            _ => return Err(bad("SECRET is env:NAME or file:PATH")),
        };
        Ok(JobSpec {
            id,
            workers,
            secret,
        })
    }
}

/// `NAME:KEYFILE`: a tenant on the testbed's switch (every switch of a
/// leaf-spine testbed), its key (64 hex digits) in KEYFILE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSpec {
    pub name: String,
    pub key_file: PathBuf,
}

impl FromStr for TenantSpec {
    type Err = TestbedConfigError;

    fn from_str(s: &str) -> Result<TenantSpec> {
        let bad = |why: String| TestbedConfigError::BadTenant(s.to_owned(), why);
        let (name, key_file) = s
            .split_once(':')
            .ok_or_else(|| bad("no ':' between the name and the key file".into()))?;
        proto::provision::TenantName::new(name).map_err(|e| bad(e.to_string()))?;
        if key_file.is_empty() {
            return Err(bad("the key file is missing".into()));
        }
        Ok(TenantSpec {
            name: name.to_owned(),
            key_file: key_file.into(),
        })
    }
}

/// Which section an [`Override`] changes.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    Switch,
    Job(u16),
    Tenant(String),
}

/// `switch.KEY=VALUE` or `job.ID.KEY=VALUE`; VALUE is a TOML value (`2`,
/// `true`, `"x"`, `["a", "b"]`) or else taken as a string (`bf16`).
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    pub target: Target,
    pub key: String,
    pub value: toml::Value,
}

impl FromStr for Override {
    type Err = TestbedConfigError;

    fn from_str(s: &str) -> Result<Override> {
        let bad = |why: &str| TestbedConfigError::BadOverride(s.to_owned(), why.to_owned());
        let (path, value) = s.split_once('=').ok_or_else(|| bad("no '='"))?;
        let path = path.trim();
        // A tenant's name may hold dots: the key is after the last one.
        let tenant = path
            .strip_prefix("tenant.")
            .and_then(|rest| rest.rsplit_once('.'));
        let parts: Vec<&str> = path.split('.').collect();
        let (target, key) = match (tenant, &parts[..]) {
            (Some((name, key)), _) if !name.is_empty() => (Target::Tenant(name.to_owned()), key),
            (_, &["switch", key]) => (Target::Switch, key),
            (_, &["job", id, key]) => (
                Target::Job(id.parse().map_err(|_| bad("the job id is a number"))?),
                key,
            ),
            _ => return Err(bad("the key is switch.KEY, job.ID.KEY or tenant.NAME.KEY")),
        };
        if key.is_empty() {
            return Err(bad("empty key"));
        }
        let value = value.trim();
        let value = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_owned()));
        Ok(Override {
            target,
            key: key.to_owned(),
            value,
        })
    }
}

/// What to write for one testbed.
#[derive(Debug, Clone)]
pub struct Request {
    /// Who asked (the script), for the file's first line.
    pub writer: String,
    /// Also attach to the plain hosts' ports (`sw-hJ`).
    pub host_ports: bool,
    pub jobs: Vec<JobSpec>,
    /// Tenants on the switch (on every switch of a leaf-spine testbed).
    pub tenants: Vec<TenantSpec>,
    pub overrides: Vec<Override>,
}

/// The tenants of `req` on a switch whose workers (or leaves) send from
/// `sources`: each key file checked and made absolute; with several
/// tenants, [`crate::config::DEFAULT_TENANT_JOB_IDS`] split evenly among
/// them (one alone takes switchd's default); `leaf`: on a leaf, each
/// tenant's `[tenant.upstream]` (leaf index, leaves, tree spines).
fn tenants(
    req: &Request,
    sources: &[ipnet::Ipv4Net],
    leaf: Option<(u16, u16, &[String])>,
) -> Result<Vec<TenantBuilder>> {
    let [first, last] = crate::config::DEFAULT_TENANT_JOB_IDS;
    let n = req.tenants.len() as u32;
    let share = (u32::from(last) - u32::from(first) + 1) / n.max(1);
    req.tenants
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let bad = |why: String| {
                TestbedConfigError::BadTenant(
                    format!("{}:{}", spec.name, spec.key_file.display()),
                    why,
                )
            };
            let path = std::fs::canonicalize(&spec.key_file)
                .map_err(|e| bad(format!("reading {}: {e}", spec.key_file.display())))?;
            crate::config::read_tenant_key(&path).map_err(bad)?;
            let mut t = TenantBuilder::new(&spec.name, &path, sources);
            if n > 1 {
                let lo = u32::from(first) + i as u32 * share;
                let ids = [lo, lo + share - 1].map(|v| toml::Value::Integer(i64::from(v)));
                t = t.set("job_ids", toml::Value::Array(ids.to_vec()));
            }
            if let Some((index, leaves, spines)) = leaf {
                t = t.upstream(index, leaves, spines);
            }
            Ok(t)
        })
        .collect()
}

fn read_secret(job: u16, src: &SecretSource) -> Result<String> {
    let (name, text) = match src {
        SecretSource::Env(n) => (format!("${n}"), std::env::var(n).map_err(|e| e.to_string())),
        SecretSource::File(p) => (
            p.display().to_string(),
            std::fs::read_to_string(p).map_err(|e| e.to_string()),
        ),
    };
    let err = |why: String| TestbedConfigError::Secret {
        job,
        source_name: name.clone(),
        why,
    };
    let text = text.map_err(&err)?;
    crate::config::parse_secret(text.trim()).map_err(&err)?;
    Ok(text.trim().to_owned())
}

/// The config text for `env`'s testbed: `[switch]` on the worker ports (and
/// host ports if asked) at the testbed's switch address, one `[[job]]` per
/// spec (256 slots; sources: the subnet for every worker, else each
/// worker's /32), one `[[tenant]]` per tenant spec (the subnet), then the
/// overrides, checked by deserialising into switchd's typed sections.
pub fn write(env: &TestbedEnv, req: &Request) -> Result<String> {
    let workers = env.number("workers")?;
    let hosts = env.number("hosts")?;
    let mut ports = Vec::new();
    for i in 0..workers {
        ports.push(env.get(&format!("worker_{i}_port"))?.to_owned());
    }
    if req.host_ports {
        for j in 0..hosts {
            ports.push(env.get(&format!("host_{j}_port"))?.to_owned());
        }
    }
    let mut config = ConfigBuilder::new(&ports, env.addr("switch_addr")?);
    for spec in &req.jobs {
        let (n, sources) = match &spec.workers {
            None => (
                workers,
                vec![net(env, "subnet", env.get("subnet")?.to_owned())?],
            ),
            Some(list) => {
                if let Some(w) = list.iter().find(|&&w| w >= workers) {
                    return Err(TestbedConfigError::BadJob(
                        format!("{}", spec.id),
                        format!("worker {w} is not on this testbed ({workers} workers)"),
                    ));
                }
                let srcs = list
                    .iter()
                    .map(|w| {
                        let key = format!("worker_{w}_addr");
                        net(env, &key, format!("{}/32", env.addr(&key)?))
                    })
                    .collect::<Result<Vec<_>>>()?;
                (list.len() as u16, srcs)
            }
        };
        let secret = read_secret(spec.id, &spec.secret)?;
        config = config.job(JobBuilder::new(spec.id, n, &sources, &secret));
    }
    let subnet = net(env, "subnet", env.get("subnet")?.to_owned())?;
    for t in tenants(req, &[subnet], None)? {
        config = config.tenant(t);
    }
    finish(config, env, req)
}

/// Applies `req`'s overrides to `config`, checks the result by
/// deserialising it into switchd's typed sections (a misspelt key or a
/// value of the wrong type is refused here with switchd's own message, not
/// when switchd starts), and returns it with its header line.
fn finish(mut config: ConfigBuilder, env: &TestbedEnv, req: &Request) -> Result<String> {
    for o in &req.overrides {
        config =
            match o.target {
                Target::Switch => config.set(&o.key, o.value.clone()),
                Target::Job(id) => config.set_job(id, &o.key, o.value.clone()).map_err(|_| {
                    TestbedConfigError::BadOverride(
                        format!("job.{id}.{}", o.key),
                        "no such job among the --job specs".into(),
                    )
                })?,
                Target::Tenant(ref name) => config
                    .set_tenant(name, &o.key, o.value.clone())
                    .map_err(|_| {
                        TestbedConfigError::BadOverride(
                            format!("tenant.{name}.{}", o.key),
                            "no such tenant among the --tenant specs".into(),
                        )
                    })?,
            };
    }
    let body = config
        .render()
        .map_err(|e| TestbedConfigError::Invalid(e.to_string()))?;
    Ok(format!(
        "# Written by switchd testbed-config for {} (testbed '{}').\n{body}",
        req.writer,
        env.get("prefix")?
    ))
}

/// Which switch of a leaf-spine testbed a config is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Leaf(u16),
    Spine(u16),
}

impl FromStr for Role {
    type Err = TestbedConfigError;

    fn from_str(s: &str) -> Result<Role> {
        let bad = || TestbedConfigError::BadRole(s.to_owned());
        let (kind, index) = s.split_once(':').ok_or_else(bad)?;
        let index: u16 = index.parse().map_err(|_| bad())?;
        match kind {
            "leaf" => Ok(Role::Leaf(index)),
            "spine" => Ok(Role::Spine(index)),
            _ => Err(bad()),
        }
    }
}

/// The leaf-spine parts of a request (`--topology leaf-spine`).
#[derive(Debug, Clone)]
pub struct Fabric {
    pub role: Role,
    /// How many spines carry the jobs' trees: a leaf sends its partials to
    /// spines 0..trees (chunk seq s through spine s mod trees); `None`:
    /// every spine.
    pub trees: Option<u16>,
    /// The spines' aggregation port (the leaves send partials to it).
    pub agg_port: u16,
    /// The UDP port of a leaf's uplink address (`[switch] uplink`).
    pub uplink_port: u16,
}

fn number_in(env: &TestbedEnv, key: &str, what: &str, index: u16) -> Result<u16> {
    let n = env.number(key)?;
    if index >= n {
        return Err(TestbedConfigError::BadRole(format!(
            "{what}:{index} (the testbed has {key}={n})"
        )));
    }
    Ok(n)
}

fn net(env: &TestbedEnv, key: &str, text: String) -> Result<ipnet::Ipv4Net> {
    text.parse()
        .map_err(|e: ipnet::AddrParseError| TestbedConfigError::BadValue {
            key: key.to_owned(),
            value: text,
            why: e.to_string(),
        })
        .and_then(|n| env.get(key).map(|_| n))
}

/// The config text of one switch of `env`'s leaf-spine testbed
/// (`scripts/testbed.sh up --leaves L --spines K ...`):
/// * spine J: ports dn-l0..dn-l(L-1), address spine J's, forwarding
///   "bridge", one `[[job]]` per spec (WORKERS must be `all`: its ranks are
///   the L leaves, from the leaves' /16), 256 slots;
/// * leaf I: its worker ports (and host ports if asked), address and
///   uplink its gateway (uplink port `fabric.uplink_port`), one `[[job]]`
///   per spec over its own workers (`all`: its subnet; a list: those
///   workers' /32s), 256 slots, `[job.upstream]` leaf_index I, n_leaves L
///   and the first `fabric.trees` spines at `fabric.agg_port`;
///
/// Each `--tenant` is on every switch: a spine's allows the leaves' /16 (their
/// uplinks), a leaf's its subnet, with `[tenant.upstream]` as its jobs'.
/// Then the overrides, checked as [`write`] checks them.
pub fn write_leaf_spine(env: &TestbedEnv, req: &Request, fabric: &Fabric) -> Result<String> {
    let leaves = env.number("leaves")?;
    let spines = env.number("spines")?;
    let trees = fabric.trees.unwrap_or(spines);
    if trees == 0 || trees > spines {
        return Err(TestbedConfigError::BadTrees { trees, spines });
    }
    let config = match fabric.role {
        Role::Spine(j) => {
            number_in(env, "spines", "spine", j)?;
            let ports = (0..leaves)
                .map(|i| {
                    env.get(&format!("spine_{j}_downlink_{i}_port"))
                        .map(str::to_owned)
                })
                .collect::<Result<Vec<_>>>()?;
            // The leaves' partials come from their gateways, 198.18.I.1:
            // every leaf subnet lies in leaf 0's /16.
            let leaf0 = net(env, "leaf_0_subnet", env.get("leaf_0_subnet")?.to_owned())?;
            let leaves_net = ipnet::Ipv4Net::new(leaf0.network(), 16)
                .expect("16 is a valid prefix length")
                .trunc();
            let mut config = ConfigBuilder::new(&ports, env.addr(&format!("spine_{j}_addr"))?)
                .set("forwarding", "bridge");
            for spec in &req.jobs {
                if spec.workers.is_some() {
                    return Err(TestbedConfigError::BadJob(
                        spec.id.to_string(),
                        "a spine's job has the leaves as its ranks: WORKERS must be `all`".into(),
                    ));
                }
                let secret = read_secret(spec.id, &spec.secret)?;
                config = config.job(JobBuilder::new(spec.id, leaves, &[leaves_net], &secret));
            }
            for t in tenants(req, &[leaves_net], None)? {
                config = config.tenant(t);
            }
            config
        }
        Role::Leaf(i) => {
            number_in(env, "leaves", "leaf", i)?;
            let wpl = env.number("workers_per_leaf")?;
            let hpl = env.number("hosts_per_leaf")?;
            let mut ports = Vec::new();
            for k in 0..wpl {
                ports.push(env.get(&format!("leaf_{i}_worker_{k}_port"))?.to_owned());
            }
            if req.host_ports {
                for k in 0..hpl {
                    ports.push(env.get(&format!("leaf_{i}_host_{k}_port"))?.to_owned());
                }
            }
            let gw = env.addr(&format!("leaf_{i}_gateway"))?;
            let tree_spines = (0..trees)
                .map(|j| {
                    Ok(format!(
                        "{}:{}",
                        env.addr(&format!("spine_{j}_addr"))?,
                        fabric.agg_port
                    ))
                })
                .collect::<Result<Vec<String>>>()?;
            let subnet_key = format!("leaf_{i}_subnet");
            let mut config = ConfigBuilder::new(&ports, gw)
                .set("uplink", format!("{gw}:{}", fabric.uplink_port));
            for spec in &req.jobs {
                let (n, sources) = match &spec.workers {
                    None => (
                        wpl,
                        vec![net(env, &subnet_key, env.get(&subnet_key)?.to_owned())?],
                    ),
                    Some(list) => {
                        if let Some(w) = list.iter().find(|&&w| w >= wpl) {
                            return Err(TestbedConfigError::BadJob(
                                spec.id.to_string(),
                                format!(
                                    "worker {w} is not under leaf {i} ({wpl} workers per leaf)"
                                ),
                            ));
                        }
                        let srcs = list
                            .iter()
                            .map(|w| {
                                let key = format!("leaf_{i}_worker_{w}_addr");
                                net(env, &key, format!("{}/32", env.addr(&key)?))
                            })
                            .collect::<Result<Vec<_>>>()?;
                        (list.len() as u16, srcs)
                    }
                };
                let secret = read_secret(spec.id, &spec.secret)?;
                config = config.job(JobBuilder::new(spec.id, n, &sources, &secret).upstream(
                    i,
                    leaves,
                    &tree_spines,
                ));
            }
            let subnet = net(env, &subnet_key, env.get(&subnet_key)?.to_owned())?;
            for t in tenants(req, &[subnet], Some((i, leaves, &tree_spines)))? {
                config = config.tenant(t);
            }
            config
        }
    };
    finish(config, env, req)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENV: &str = "prefix=tb\nswitch_ns=tb-sw\nswitch_addr=198.18.0.1\nsubnet=198.18.0.0/24\n\
        workers=2\nhosts=1\nworker_0_addr=198.18.0.10\nworker_0_port=sw-w0\n\
        worker_1_addr=198.18.0.11\nworker_1_port=sw-w1\nhost_0_port=sw-h0\n";
    const SECRET: &str = "5ca1ab1e5ca1ab1e0123456789abcdef5ca1ab1e5ca1ab1e0123456789abcdef";

    fn request(jobs: &[&str], sets: &[&str]) -> Request {
        Request {
            writer: "a test".into(),
            host_ports: false,
            jobs: jobs.iter().map(|j| j.parse().unwrap()).collect(),
            tenants: Vec::new(),
            overrides: sets.iter().map(|s| s.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn a_config_for_the_testbed_parses_as_switchd_would_read_it() {
        std::env::set_var("TBCFG_TEST_SECRET", SECRET);
        let env = TestbedEnv::parse(ENV).unwrap();
        let text = write(
            &env,
            &request(
                &["1:all:env:TBCFG_TEST_SECRET"],
                &[
                    "switch.queues=2",
                    "switch.admin_socket=\"/tmp/a.sock\"",
                    "job.1.dtype=bf16",
                ],
            ),
        )
        .unwrap();
        assert!(text.starts_with("# Written by switchd testbed-config for a test (testbed 'tb')"));
        let cfg = crate::config::Config::parse(&text, std::path::Path::new("x"), |_| Some(1500))
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(cfg.switch.ports, ["sw-w0", "sw-w1"]);
        assert_eq!(cfg.switch.addresses, [Ipv4Addr::new(198, 18, 0, 1)]);
        assert_eq!(cfg.switch.queues, 2);
        assert_eq!(cfg.switch.admin_socket, PathBuf::from("/tmp/a.sock"));
        let j = &cfg.jobs[0];
        assert_eq!((j.id, j.n_workers), (1, 2));
        assert_eq!(j.dtype, proto::wire::Dtype::Bf16);
        assert_eq!(j.allowed_sources.len(), 1);
    }

    #[test]
    fn jobs_of_some_workers_allow_exactly_those_addresses() {
        std::env::set_var("TBCFG_TEST_SECRET2", SECRET);
        let env = TestbedEnv::parse(ENV).unwrap();
        let mut req = request(&["7:1:env:TBCFG_TEST_SECRET2"], &[]);
        req.host_ports = true;
        let text = write(&env, &req).unwrap();
        assert!(text.contains("\"198.18.0.11/32\""), "{text}");
        assert!(!text.contains("198.18.0.10"), "{text}");
        assert!(text.contains("sw-h0"), "{text}");
        assert!(text.contains("n_workers = 1"), "{text}");
    }

    #[test]
    fn typos_and_bad_input_are_refused_with_what_to_fix() {
        std::env::set_var("TBCFG_TEST_SECRET3", SECRET);
        let env = TestbedEnv::parse(ENV).unwrap();
        let e = write(
            &env,
            &request(&["1:all:env:TBCFG_TEST_SECRET3"], &["switch.queus=2"]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("queus"), "{e}");
        let e = write(
            &env,
            &request(&["1:all:env:TBCFG_TEST_SECRET3"], &["job.2.window=8"]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no such job"), "{e}");
        let e = write(&env, &request(&["1:0-5:env:TBCFG_TEST_SECRET3"], &[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("worker 2 is not on this testbed"), "{e}");
        let e = write(&env, &request(&["1:all:env:TBCFG_NO_SUCH_VAR"], &[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("$TBCFG_NO_SUCH_VAR"), "{e}");
        assert!("1:all".parse::<JobSpec>().is_err());
        assert!("0:all:env:X".parse::<JobSpec>().is_err());
        assert!("1:3-1:env:X".parse::<JobSpec>().is_err());
        assert!("1:all:secret".parse::<JobSpec>().is_err());
        assert!("switch=2".parse::<Override>().is_err());
        assert!("sw.queues=2".parse::<Override>().is_err());
        let e = TestbedEnv::parse("prefix=x\n")
            .unwrap()
            .get("workers")
            .unwrap_err();
        assert!(e.to_string().contains("--print-env"), "{e}");
        assert!(TestbedEnv::parse("no equals sign\n").is_err());
    }

    const FABRIC_ENV: &str = "prefix=ls\ntopology=leafspine\nleaves=2\nspines=2\n\
        workers_per_leaf=2\nhosts_per_leaf=1\n\
        leaf_0_ns=ls-leaf0\nleaf_0_gateway=198.18.0.1\nleaf_0_subnet=198.18.0.0/24\n\
        leaf_0_worker_0_addr=198.18.0.10\nleaf_0_worker_0_port=sw-w0\n\
        leaf_0_worker_1_addr=198.18.0.11\nleaf_0_worker_1_port=sw-w1\nleaf_0_host_0_port=sw-h0\n\
        leaf_1_ns=ls-leaf1\nleaf_1_gateway=198.18.1.1\nleaf_1_subnet=198.18.1.0/24\n\
        leaf_1_worker_0_addr=198.18.1.10\nleaf_1_worker_0_port=sw-w0\n\
        leaf_1_worker_1_addr=198.18.1.11\nleaf_1_worker_1_port=sw-w1\nleaf_1_host_0_port=sw-h0\n\
        spine_0_ns=ls-spine0\nspine_0_addr=198.19.255.1\n\
        spine_0_downlink_0_port=dn-l0\nspine_0_downlink_1_port=dn-l1\n\
        spine_1_ns=ls-spine1\nspine_1_addr=198.19.255.2\n\
        spine_1_downlink_0_port=dn-l0\nspine_1_downlink_1_port=dn-l1\n";

    fn fabric(role: &str, trees: Option<u16>) -> Fabric {
        Fabric {
            role: role.parse().unwrap(),
            trees,
            agg_port: 48879,
            uplink_port: 40000,
        }
    }

    fn parsed(text: &str) -> crate::config::Config {
        crate::config::Config::parse(text, std::path::Path::new("x"), |_| Some(1500))
            .unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn a_spine_config_has_the_downlinks_and_the_leaves_as_ranks() {
        std::env::set_var("TBCFG_TEST_SECRET4", SECRET);
        let env = TestbedEnv::parse(FABRIC_ENV).unwrap();
        let req = request(
            &["3:all:env:TBCFG_TEST_SECRET4"],
            &["switch.admin_socket=\"/tmp/s1.sock\""],
        );
        let text = write_leaf_spine(&env, &req, &fabric("spine:1", None)).unwrap();
        let cfg = parsed(&text);
        assert_eq!(cfg.switch.ports, ["dn-l0", "dn-l1"]);
        assert_eq!(cfg.switch.addresses, [Ipv4Addr::new(198, 19, 255, 2)]);
        assert_eq!(cfg.switch.admin_socket, PathBuf::from("/tmp/s1.sock"));
        assert!(text.contains("forwarding = \"bridge\""), "{text}");
        assert!(text.contains("\"198.18.0.0/16\""), "{text}");
        assert_eq!((cfg.jobs[0].id, cfg.jobs[0].n_workers), (3, 2));
        assert!(cfg.jobs[0].upstream.is_none());
        let e = write_leaf_spine(
            &env,
            &request(&["3:0:env:TBCFG_TEST_SECRET4"], &[]),
            &fabric("spine:0", None),
        )
        .unwrap_err();
        assert!(e.to_string().contains("must be `all`"), "{e}");
    }

    #[test]
    fn a_leaf_config_sends_its_partials_to_the_tree_spines() {
        std::env::set_var("TBCFG_TEST_SECRET5", SECRET);
        let env = TestbedEnv::parse(FABRIC_ENV).unwrap();
        let mut req = request(
            &["1:all:env:TBCFG_TEST_SECRET5", "2:1:env:TBCFG_TEST_SECRET5"],
            &[],
        );
        req.host_ports = true;
        let text = write_leaf_spine(&env, &req, &fabric("leaf:1", Some(1))).unwrap();
        let cfg = parsed(&text);
        assert_eq!(cfg.switch.ports, ["sw-w0", "sw-w1", "sw-h0"]);
        assert_eq!(cfg.switch.addresses, [Ipv4Addr::new(198, 18, 1, 1)]);
        assert_eq!(cfg.switch.uplink, Some("198.18.1.1:40000".parse().unwrap()));
        assert!(text.contains("\"198.18.1.0/24\""), "{text}");
        assert!(text.contains("\"198.18.1.11/32\""), "{text}");
        assert!(!text.contains("198.18.1.10/32"), "{text}");
        assert_eq!((cfg.jobs[1].id, cfg.jobs[1].n_workers), (2, 1));
        let up = cfg.jobs[0]
            .upstream
            .as_ref()
            .expect("a leaf's job has an upstream");
        assert_eq!((up.leaf_index, up.n_leaves), (1, 2));
        assert_eq!(up.spines.len(), 1);
        assert_eq!(
            (up.spines[0].ip, up.spines[0].port),
            ([198, 19, 255, 1], 48879)
        );
        let two = write_leaf_spine(&env, &req, &fabric("leaf:0", None)).unwrap();
        assert!(two.contains("\"198.19.255.2:48879\""), "{two}");
    }

    fn key_file(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "switchd-tbcfg-{tag}-{}-{:x}.key",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::write(&p, format!("{SECRET}\n")).unwrap();
        p
    }

    #[test]
    fn tenants_go_on_every_switch_with_leaves_provisioning_upstream() {
        let key = key_file("fabric");
        let env = TestbedEnv::parse(FABRIC_ENV).unwrap();
        let mut req = request(&[], &["tenant.team.a.max_jobs=2"]);
        req.tenants = vec![format!("team.a:{}", key.display()).parse().unwrap()];
        let leaf = parsed(&write_leaf_spine(&env, &req, &fabric("leaf:1", None)).unwrap());
        assert!(leaf.jobs.is_empty());
        let t = &leaf.tenants[0];
        assert_eq!(
            (t.name.as_str(), t.max_jobs, t.job_ids),
            ("team.a", 2, (32768, 65535))
        );
        assert_eq!(t.allowed_sources[0].addr, [198, 18, 1, 0]);
        let up = t
            .upstream
            .as_ref()
            .expect("a leaf's tenant has an upstream");
        assert_eq!((up.leaf_index, up.n_leaves, up.spines.len()), (1, 2, 2));
        let spine = parsed(&write_leaf_spine(&env, &req, &fabric("spine:0", None)).unwrap());
        let t = &spine.tenants[0];
        assert!(t.upstream.is_none());
        assert_eq!(
            (t.allowed_sources[0].addr, t.allowed_sources[0].len),
            ([198, 18, 0, 0], 16)
        );
        // Single switch, two tenants: the default range split between them.
        let env = TestbedEnv::parse(ENV).unwrap();
        req.overrides.clear();
        req.tenants
            .push(format!("b:{}", key.display()).parse().unwrap());
        let one = parsed(&write(&env, &req).unwrap());
        assert_eq!(one.tenants[0].job_ids, (32768, 49151));
        assert_eq!(one.tenants[1].job_ids, (49152, 65535));
        // A weak key is refused when the config is written, naming the tenant.
        std::fs::write(&key, "00".repeat(32)).unwrap();
        let e = write(&env, &req).unwrap_err().to_string();
        assert!(
            e.contains("--tenant `team.a:") && e.contains("tenant key is weak"),
            "{e}"
        );
        let _ = std::fs::remove_file(&key);
        let e = write(&env, &req).unwrap_err().to_string();
        assert!(e.contains("reading"), "{e}");
        for bad in ["team-a", "team a:/k", ":/k", "a:"] {
            assert!(bad.parse::<TenantSpec>().is_err(), "{bad}");
        }
        let e = write(
            &env,
            &request(&["1:all:env:TBCFG_TEST_SECRET6"], &["tenant.x.max_jobs=2"]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no such tenant"), "{e}");
    }

    #[test]
    fn a_switch_or_tree_count_not_on_the_fabric_is_refused() {
        std::env::set_var("TBCFG_TEST_SECRET6", SECRET);
        let env = TestbedEnv::parse(FABRIC_ENV).unwrap();
        let req = request(&["1:all:env:TBCFG_TEST_SECRET6"], &[]);
        for (role, trees, why) in [
            ("leaf:2", None, "leaves=2"),
            ("spine:2", None, "spines=2"),
            ("leaf:0", Some(3), "--trees 3"),
            ("leaf:0", Some(0), "--trees 0"),
        ] {
            let e = write_leaf_spine(&env, &req, &fabric(role, trees))
                .unwrap_err()
                .to_string();
            assert!(e.contains(why), "{role} {trees:?}: {e}");
        }
        let e = write_leaf_spine(
            &env,
            &request(&["1:2:env:TBCFG_TEST_SECRET6"], &[]),
            &fabric("leaf:0", None),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("worker 2 is not under leaf 0"), "{e}");
        assert!("root:0".parse::<Role>().is_err());
        assert!("leaf".parse::<Role>().is_err());
        assert!("leaf:x".parse::<Role>().is_err());
        let e = write_leaf_spine(
            &TestbedEnv::parse(ENV).unwrap(),
            &req,
            &fabric("leaf:0", None),
        )
        .unwrap_err();
        assert!(e.to_string().contains("leaves"), "{e}");
    }
}
