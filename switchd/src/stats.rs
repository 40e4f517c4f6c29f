//! A point-in-time view of every counter of the switch, for the periodic
//! log line, the `--stats-file` JSON, switchctl and the metrics endpoint.
//! Counters come from their one schema ([`CounterSchema`]): a counter added
//! there appears here, under its name, with no code in this file.
//!
//! Owns: the stats file's writing ([`write_stats_file`]): atomic, never
//! through a symlink, mode [`STATS_FILE_MODE`].

use std::collections::BTreeMap;
use std::path::Path;

use proto::switch::{
    CounterSchema, DropReason, JobCounters, JobDrops, JobState, JobTable, SpineCounters,
    TableCounters, MALFORMED_KINDS,
};
use serde::Serialize;

use crate::dataplane::counters::{DataplaneCounters, RingStats, ThreadCounters};

/// Every counter of a schema, by name.
pub fn counter_map(c: &dyn CounterSchema) -> BTreeMap<&'static str, u64> {
    let mut m = BTreeMap::new();
    c.visit(&mut |name, _, v| {
        m.insert(name, v);
    });
    m
}

#[derive(Debug, Clone, Serialize)]
pub struct JobStats {
    pub id: u16,
    pub state: &'static str,
    pub n_workers: u16,
    pub ranks_joined: u16,
    pub window: u16,
    /// The job's class ("low", "normal", "high").
    pub priority: &'static str,
    /// The declared window, which the switch enforces; `window` (what
    /// RESULTs advertise now) is its yield share while a job of a higher
    /// class is busy.
    pub declared_window: u16,
    /// A job of a higher class is busy now: this one yields.
    pub yielding: bool,
    pub floor_seq: u32,
    /// Slot-pool memory this job takes (charged against the budget).
    pub pool_bytes: u64,
    /// Ranks that have not sent the oldest incomplete seq (while it aggregates).
    pub ranks_missing_on_floor: Vec<u16>,
    /// [`proto::switch::JobCounters`], by name.
    #[serde(flatten)]
    pub counters: BTreeMap<&'static str, u64>,
    pub drops: BTreeMap<&'static str, u64>,
    /// The typed counters behind `counters` and `drops` (what `/metrics`
    /// renders, so a renamed counter cannot read as a silent 0).
    #[serde(skip)]
    pub job_counters: JobCounters,
    #[serde(skip)]
    pub drop_counts: JobDrops,
    /// Every rank has joined (`state` is its name).
    #[serde(skip)]
    pub active: bool,
    /// On a leaf: its trees, one entry per spine in tree order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub spines: Vec<SpineStats>,
}

/// A leaf's session with one spine (one tree of a job).
#[derive(Debug, Clone, Serialize)]
pub struct SpineStats {
    pub tree: u16,
    pub addr: String,
    /// "joined", "joining" or "refused".
    pub state: &'static str,
    /// Why the spine refuses the leaf (state "refused").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Seconds since anything came from the spine (None: never).
    pub last_heard_secs: Option<f64>,
    /// [`proto::switch::SpineCounters`], by name.
    #[serde(flatten)]
    pub counters: BTreeMap<&'static str, u64>,
    /// The typed counters behind `counters`, for `/metrics`.
    #[serde(skip)]
    pub spine_counters: SpineCounters,
    /// The session is up (`state` is "joined").
    #[serde(skip)]
    pub joined: bool,
}

/// A leaf job's spines as [`SpineStats`] (empty for other jobs).
pub fn spine_stats(j: &proto::switch::Job, now: std::time::Instant) -> Vec<SpineStats> {
    use proto::wire::SpineSessionState;
    let Some(u) = j.uplink() else {
        return Vec::new();
    };
    u.cfg
        .spines
        .iter()
        .zip(&u.spines)
        .enumerate()
        .map(|(tree, (addr, s))| {
            let state = s.state();
            SpineStats {
                tree: tree as u16,
                addr: addr.to_string(),
                state: match state {
                    SpineSessionState::Joined => "joined",
                    SpineSessionState::Joining => "joining",
                    SpineSessionState::Refused(_) => "refused",
                },
                refused: match state {
                    SpineSessionState::Refused(why) => Some(why.to_string()),
                    _ => None,
                },
                last_heard_secs: s
                    .last_heard
                    .map(|t| now.saturating_duration_since(t).as_secs_f64()),
                counters: counter_map(&s.counters),
                spine_counters: s.counters.clone(),
                joined: matches!(state, SpineSessionState::Joined),
            }
        })
        .collect()
}

impl JobStats {
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PortStats {
    pub name: String,
    pub xdp_steered: u64,
    pub xdp_passed: u64,
    pub xdp_malformed: u64,
    /// Steerable frames dropped in XDP (mode = "xdp-drop" only).
    pub xdp_dropped: u64,
    /// Frames the forwarding fast path redirected to another port.
    pub xdp_forwarded: u64,
    /// Frames dropped in XDP because they claimed one of the switch's own
    /// addresses (IPv4 source or source MAC) as their source: spoofed or
    /// looped, never forwarded nor steered.
    pub xdp_own_address_forged: u64,
    /// Frames the fast path left to the bridge, by the first rule they
    /// failed ([`crate::xdp::REFUSAL_NAMES`]; docs/FASTPATH.md).
    pub xdp_fwd_refused: BTreeMap<&'static str, u64>,
}

/// One AF_XDP socket: the port's name and the queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ThreadSocket {
    pub port: String,
    pub queue: u32,
}

/// One dataplane thread: the sockets it serves and its own counters (the
/// switch-wide ones are their sum).
#[derive(Debug, Clone, Serialize)]
pub struct ThreadStats {
    pub thread: usize,
    pub sockets: Vec<ThreadSocket>,
    /// Share of the last second the thread was awake rather than asleep in
    /// poll(2) (spinning on empty rings counts as awake): near 1.0 it has no
    /// time to spare.
    pub busy_share: f64,
    /// [`DataplaneCounters`] of this thread, by name.
    #[serde(flatten)]
    pub counters: BTreeMap<&'static str, u64>,
    /// The typed counters behind `counters`, for `/metrics`.
    #[serde(skip)]
    pub dataplane: DataplaneCounters,
}

/// The dataplane threads' counters as [`ThreadStats`], sockets named by
/// `ports` (by index; the index itself where a name is missing).
pub fn thread_stats(threads: &[ThreadCounters], ports: &[PortStats]) -> Vec<ThreadStats> {
    threads
        .iter()
        .enumerate()
        .map(|(i, t)| ThreadStats {
            thread: i,
            sockets: t
                .sockets
                .iter()
                .map(|&(p, queue)| ThreadSocket {
                    port: ports
                        .get(p as usize)
                        .map_or_else(|| p.to_string(), |p| p.name.clone()),
                    queue,
                })
                .collect(),
            busy_share: t.busy_share,
            counters: counter_map(&t.counters),
            dataplane: t.counters.clone(),
        })
        .collect()
}

/// Counters of each dataplane thread in the `switchctl stats` table, after
/// the thread, its busy share and before its sockets.
pub const THREAD_TABLE_COUNTERS: [&str; 3] = ["rx_frames", "tx_frames", "forwarded"];

/// The per-thread table of `switchctl stats`, from the stats reply's JSON
/// (`threads`): a header and one line per thread. Empty without threads.
pub fn thread_table(stats: &serde_json::Value) -> Vec<String> {
    let Some(threads) = stats["threads"].as_array().filter(|t| !t.is_empty()) else {
        return Vec::new();
    };
    let mut lines = vec![format!(
        "{:>6} {:>5} {:>12} {:>12} {:>12}  sockets (port/queue)",
        "thread",
        "busy",
        THREAD_TABLE_COUNTERS[0],
        THREAD_TABLE_COUNTERS[1],
        THREAD_TABLE_COUNTERS[2]
    )];
    for t in threads {
        let n = |k: &str| t[k].as_u64().unwrap_or(0);
        let sockets: Vec<String> = t["sockets"]
            .as_array()
            .map(|v| {
                v.iter()
                    .map(|s| format!("{}/{}", s["port"].as_str().unwrap_or("?"), s["queue"]))
                    .collect()
            })
            .unwrap_or_default();
        lines.push(format!(
            "{:>6} {:>4.0}% {:>12} {:>12} {:>12}  {}",
            n("thread"),
            t["busy_share"].as_f64().unwrap_or(0.0) * 100.0,
            n(THREAD_TABLE_COUNTERS[0]),
            n(THREAD_TABLE_COUNTERS[1]),
            n(THREAD_TABLE_COUNTERS[2]),
            if sockets.is_empty() {
                "none".to_string()
            } else {
                sockets.join(" ")
            }
        ));
    }
    lines
}

#[derive(Debug, Clone, Serialize)]
pub struct SwitchStats {
    pub generation: u32,
    pub uptime_secs: f64,
    /// [`DataplaneCounters`] summed over threads, then
    /// [`proto::switch::TableCounters`], by name.
    #[serde(flatten)]
    pub counters: BTreeMap<&'static str, u64>,
    /// The typed counters behind `counters`, for `/metrics`.
    #[serde(skip)]
    pub dataplane: DataplaneCounters,
    #[serde(skip)]
    pub table: TableCounters,
    /// Malformed aggregation frames by kind.
    pub malformed: BTreeMap<&'static str, u64>,
    pub malformed_total: u64,
    /// Slot-pool memory: the budget and what declared jobs take.
    pub pool_budget_bytes: u64,
    pub pool_in_use_bytes: u64,
    pub jobs: Vec<JobStats>,
    pub ports: Vec<PortStats>,
    pub rings: Vec<RingStats>,
    /// Per dataplane thread.
    pub threads: Vec<ThreadStats>,
}

impl SwitchStats {
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }
}

pub fn job_stats(table: &JobTable) -> Vec<JobStats> {
    let now = std::time::Instant::now();
    let mut jobs: Vec<JobStats> = table
        .jobs()
        .map(|j| (j, j.counts()))
        .map(|(j, (counters, drops))| JobStats {
            id: j.id(),
            state: j.state().name(),
            n_workers: j.n_workers(),
            ranks_joined: j.joined_ranks(),
            window: j.window(),
            priority: j.priority().name(),
            declared_window: j.declared_window(),
            yielding: j.core().priority.outranked_now(),
            floor_seq: j.floor(),
            pool_bytes: j.config.pool_bytes(),
            ranks_missing_on_floor: j.missing_on_floor(),
            counters: counter_map(&counters),
            drops: DropReason::ALL
                .iter()
                .map(|r| (r.name(), drops.count(*r)))
                .collect(),
            spines: spine_stats(j, now),
            job_counters: counters,
            drop_counts: drops,
            active: j.state() == JobState::Active,
        })
        .collect();
    jobs.sort_by_key(|j| j.id);
    jobs
}

pub fn snapshot(
    table: &JobTable,
    dp: &DataplaneCounters,
    ports: Vec<PortStats>,
    uptime_secs: f64,
) -> SwitchStats {
    let mut counters = counter_map(dp);
    let table_counters = table.table_counters();
    counters.extend(counter_map(&table_counters));
    let mut malformed: BTreeMap<&'static str, u64> = MALFORMED_KINDS
        .iter()
        .zip(table.malformed.iter())
        .map(|(k, v)| (*k, *v))
        .collect();
    malformed.insert("bad_frame", dp.bad_frame);
    malformed.insert("wrong_port", dp.wrong_port);
    let (budget, in_use) = table.pool_memory();
    SwitchStats {
        generation: table.gen(),
        uptime_secs,
        counters,
        dataplane: dp.clone(),
        table: table_counters,
        malformed_total: malformed.values().sum(),
        malformed,
        pool_budget_bytes: budget,
        pool_in_use_bytes: in_use,
        jobs: job_stats(table),
        ports,
        rings: Vec::new(),
        threads: Vec::new(),
    }
}

/// One job as `switchctl jobs` gets it (JSON): its state, shape and window,
/// how it was made (`origin`: "declared" or "provisioned"; a provisioned
/// one's `tenant`, `job_name` and `lease_left_secs`, else null), and a
/// leaf's trees.
pub fn job_listing(j: &proto::switch::Job, now: std::time::Instant) -> serde_json::Value {
    use proto::switch::JobOrigin;
    let (tenant, name) = match j.origin() {
        JobOrigin::Provisioned { tenant, name } => (Some(tenant.as_str()), Some(name.as_str())),
        JobOrigin::Declared => (None, None),
    };
    serde_json::json!({
        "id": j.id(),
        "state": j.state().name(),
        "n_workers": j.n_workers(),
        "ranks_joined": j.joined_ranks(),
        "pool_slots": j.config.pool_slots,
        "elems_per_chunk": j.config.elems_per_chunk,
        "dtype": j.config.dtype.name(),
        "auth": j.auth().name(),
        "stats": j.config.stats,
        "window": j.window(),
        "priority": j.priority().name(),
        "declared_window": j.declared_window(),
        "yielding": j.core().priority.outranked_now(),
        "priority_marked": j.counters().priority_marked,
        "pool_bytes": j.config.pool_bytes(),
        "origin": j.origin().kind(),
        "tenant": tenant,
        "job_name": name,
        "lease_left_secs": j.lease_left(now).map(|d| d.as_secs()),
        "upstream": j.uplink().map(|u| serde_json::json!({
            "leaf_index": u.cfg.leaf_index,
            "n_leaves": u.cfg.n_leaves,
            "spines": spine_stats(j, now),
        })),
    })
}

/// `switchctl jobs`' table from [`job_listing`]s: a header and one line per
/// job ("window" is what RESULTs advertise now, below "declared" while the
/// job yields to a busy higher class; "marked" counts its chunks marked for
/// priority; "origin", "tenant", "name" and "lease" say how it was made and,
/// for a provisioned job, the seconds left of its idle lease). Auth stays
/// last (tests read it). A leaf job's trees follow its line.
pub fn jobs_table(jobs: &[serde_json::Value]) -> Vec<String> {
    let row = |c: [&str; 16], auth: &str| {
        format!(
            "{:>6}  {:<8} {:>7} {:>7} {:>6} {:>6} {:>8} {:>5} {:>6} {:<6} {:>8} {:>5} {:<11} \
             {:<12} {:<16} {:>6} {:>4}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            c[6],
            c[7],
            c[8],
            c[9],
            c[10],
            c[11],
            c[12],
            c[13],
            c[14],
            c[15],
            auth
        )
    };
    let mut out = vec![row(
        [
            "job", "state", "ranks", "joined", "slots", "window", "declared", "dtype", "elems",
            "class", "marked", "stats", "origin", "tenant", "name", "lease",
        ],
        "auth",
    )];
    for j in jobs {
        // Numbers as text: Value's Display ignores widths.
        let n = |k: &str| j[k].as_u64().unwrap_or(0).to_string();
        let t = |k: &str| j[k].as_str().unwrap_or("-").to_string();
        let cells = [
            n("id"),
            j["state"].as_str().unwrap_or("?").to_string(),
            n("n_workers"),
            n("ranks_joined"),
            n("pool_slots"),
            n("window"),
            n("declared_window"),
            t("dtype"),
            n("elems_per_chunk"),
            t("priority"),
            n("priority_marked"),
            (if j["stats"].as_bool().unwrap_or(false) {
                "on"
            } else {
                "off"
            })
            .to_string(),
            t("origin"),
            t("tenant"),
            t("job_name"),
            j["lease_left_secs"]
                .as_u64()
                .map_or_else(|| "-".to_string(), |s| format!("{s}s")),
        ];
        let cells: [&str; 16] = std::array::from_fn(|i| cells[i].as_str());
        out.push(row(cells, j["auth"].as_str().unwrap_or("?")));
        let up = &j["upstream"];
        if let Some(spines) = up["spines"].as_array() {
            out.push(format!(
                "        leaf {} of {}, spines in tree order:",
                up["leaf_index"], up["n_leaves"]
            ));
            out.extend(spine_lines(spines, "          "));
        }
    }
    out
}

/// One line per tree of a leaf job: the spine, its session, its traffic
/// (from [`SpineStats`] as JSON).
pub fn spine_lines(spines: &[serde_json::Value], indent: &str) -> Vec<String> {
    spines
        .iter()
        .map(|s| {
            let state = match s["refused"].as_str() {
                Some(why) => format!("REFUSED: {why}"),
                None => s["state"].as_str().unwrap_or("?").to_string(),
            };
            let heard = s["last_heard_secs"]
                .as_f64()
                .map_or("never heard".to_string(), |t| format!("heard {t:.1} s ago"));
            format!(
                "{indent}tree {} {} {state}, {heard}: partials {} sent {} resent, {} results, \
                 {} heartbeats",
                s["tree"],
                s["addr"].as_str().unwrap_or("?"),
                s["partials_sent"],
                s["partials_resent"],
                s["results"],
                s["heartbeats_sent"],
            )
        })
        .collect()
}

/// One line per job for the log: state, progress and non-zero drops.
pub fn summary_line(j: &JobStats, prev_bytes: u64, secs: f64) -> String {
    let bytes = j.counter("bytes_aggregated");
    let rate = (bytes.saturating_sub(prev_bytes)) as f64 * 8.0 / secs.max(1e-9) / 1e9;
    let drops: Vec<String> = j
        .drops
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    format!(
        "job {}: {} {}/{} ranks, {} chunks, {:.2} Gbit/s in, {} retransmits served, window {}, drops [{}]{}",
        j.id,
        j.state,
        j.ranks_joined,
        j.n_workers,
        j.counter("chunks_completed"),
        rate,
        j.counter("retransmits_served"),
        j.window,
        drops.join(" "),
        if j.ranks_missing_on_floor.is_empty() {
            String::new()
        } else {
            format!(
                ", seq {} waits for ranks {:?}",
                j.floor_seq, j.ranks_missing_on_floor
            )
        }
    )
}

/// Mode of the stats file: owner read-write, group read, others nothing
/// (the counters name jobs and addresses of a shared cluster).
pub const STATS_FILE_MODE: u32 = 0o640;

/// Writes `s` as JSON to `path` atomically and without following links: a
/// new file with a random name is created exclusively (`O_CREAT|O_EXCL|
/// O_NOFOLLOW`, mode [`STATS_FILE_MODE`]) in `path`'s directory, written,
/// then renamed over `path`. A reader sees the old file or the new one,
/// never half of one; a symlink planted at `path` or at any temporary name
/// is replaced (rename) or refused (exclusive create), never written
/// through, so a user who can write the directory cannot make switchd
/// overwrite another file.
pub fn write_stats_file(path: &Path, s: &SwitchStats) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(s)?;
    write_atomic(path, &json)
}

/// [`write_stats_file`]'s mechanism, for any bytes.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let base = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("stats file {} names no file", path.display()),
        )
    })?;
    // A few tries: a name taken (by chance or planted) is skipped.
    let mut last_err = None;
    for _ in 0..8 {
        let mut name = std::ffi::OsString::from(".");
        name.push(base);
        name.push(format!(".{:016x}.tmp", rand::random::<u64>()));
        let tmp = dir.join(name);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(STATS_FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp);
        let mut file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                last_err = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        let written = (|| {
            // The umask may only make it stricter; set it exactly.
            file.set_permissions(std::fs::Permissions::from_mode(STATS_FILE_MODE))?;
            file.write_all(bytes)?;
            drop(file);
            std::fs::rename(&tmp, path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        return written;
    }
    Err(last_err.unwrap_or_else(|| std::io::Error::other("no free temporary name")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn tempdir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "switchd-stats-{tag}-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir(&d).unwrap();
        d
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn writes_the_file_with_mode_0640_or_stricter() {
        let d = tempdir("mode");
        let target = d.join("stats.json");
        write_atomic(&target, b"{\"a\":1}").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"{\"a\":1}");
        let m = mode(&target);
        assert_eq!(m & !0o640, 0, "stats file mode {m:o} is looser than 0640");
        // Replacing an existing, looser file leaves the strict mode.
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o666)).unwrap();
        write_atomic(&target, b"{\"a\":2}").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"{\"a\":2}");
        assert_eq!(mode(&target) & !0o640, 0);
        // Nothing but the target is left in the directory.
        let left: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
        assert_eq!(left.len(), 1, "temporary files left behind: {left:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn symlink_at_the_old_tmp_name_is_not_followed() {
        let d = tempdir("tmp");
        let victim = d.join("victim");
        std::fs::write(&victim, b"root only").unwrap();
        let target = d.join("stats.json");
        // The name the old code wrote through.
        symlink(&victim, target.with_extension("tmp")).unwrap();
        write_atomic(&target, b"{}").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"root only");
        assert_eq!(std::fs::read(&target).unwrap(), b"{}");
        assert!(!std::fs::symlink_metadata(&target)
            .unwrap()
            .file_type()
            .is_symlink());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn symlink_at_the_target_is_replaced_not_written_through() {
        let d = tempdir("target");
        let victim = d.join("victim");
        std::fs::write(&victim, b"root only").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let target = d.join("stats.json");
        symlink(&victim, &target).unwrap();
        write_atomic(&target, b"{\"x\":3}").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"root only");
        assert_eq!(mode(&victim), 0o600);
        let meta = std::fs::symlink_metadata(&target).unwrap();
        assert!(meta.file_type().is_file(), "target is still a symlink");
        assert_eq!(std::fs::read(&target).unwrap(), b"{\"x\":3}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_missing_directory_is_an_error_not_a_panic() {
        let d = tempdir("missing");
        let target = d.join("no/such/dir/stats.json");
        let e = write_atomic(&target, b"{}").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_declared_job_is_listed_as_declared_with_no_tenant_name_or_lease() {
        use proto::switch::{Ipv4Prefix, JobConfig};
        let now = std::time::Instant::now();
        let mut t = JobTable::new(proto::switch::TableConfig::new(7, [1; 32]), now);
        t.add(
            JobConfig {
                id: 9,
                n_workers: 2,
                allowed_sources: vec![Ipv4Prefix {
                    addr: [198, 18, 0, 0],
                    len: 24,
                }],
                secret: [7; 32],
                pool_slots: 4,
                elems_per_chunk: 64,
                dtype: proto::wire::Dtype::F32,
                window: 4,
                priority: Default::default(),
                upstream: None,
                stats: false,
                auth: proto::tag::AuthMode::Mac,
            },
            1000,
        )
        .unwrap();
        let jobs: Vec<serde_json::Value> = t.jobs().map(|j| job_listing(j, now)).collect();
        let j = &jobs[0];
        assert_eq!(
            (j["id"].as_u64(), j["origin"].as_str()),
            (Some(9), Some("declared"))
        );
        for k in ["tenant", "job_name", "lease_left_secs"] {
            assert!(j[k].is_null(), "{k}: {j}");
        }
        let lines = jobs_table(&jobs);
        let head: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(
            head[12..],
            ["origin", "tenant", "name", "lease", "auth"],
            "{}",
            lines[0]
        );
        let row: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(row.len(), head.len(), "{}", lines[1]);
        assert_eq!(
            row[12..],
            ["declared", "-", "-", "-", "mac"],
            "{}",
            lines[1]
        );
        // A provisioned job's row, from its JSON.
        let mut p = j.clone();
        p["origin"] = "provisioned".into();
        p["tenant"] = "team-a".into();
        p["job_name"] = "run-42".into();
        p["lease_left_secs"] = 57.into();
        let row = jobs_table(&[p]).pop().unwrap();
        let row: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(row[12..], ["provisioned", "team-a", "run-42", "57s", "mac"]);
    }

    /// A snapshot of a switch with three dataplane threads: thread 0 serves
    /// sw-w0/0 and port 2 queue 0 (unnamed), thread 1 sw-w1/0, thread 2
    /// nothing.
    fn with_threads() -> SwitchStats {
        let table = JobTable::new(
            proto::switch::TableConfig::new(7, [1; 32]),
            std::time::Instant::now(),
        );
        let counters = |rx: u64, fwd: u64, stalls: u64| {
            let mut c = DataplaneCounters::default();
            c.visit_mut(&mut |name, v| {
                *v = match name {
                    "rx_frames" => rx,
                    "tx_frames" => rx * 3,
                    "forwarded" => fwd,
                    "dataplane_stalls" => stalls,
                    _ => 0,
                }
            });
            c
        };
        let threads = [
            ThreadCounters {
                counters: counters(1000, 7, 0),
                sockets: vec![(0, 0), (2, 0)],
                busy_share: 0.875,
            },
            ThreadCounters {
                counters: counters(500, 0, 1),
                sockets: vec![(1, 0)],
                busy_share: 0.0,
            },
            ThreadCounters::default(),
        ];
        let ports: Vec<PortStats> = ["sw-w0", "sw-w1"]
            .iter()
            .map(|n| PortStats {
                name: n.to_string(),
                xdp_steered: 0,
                xdp_passed: 0,
                xdp_malformed: 0,
                xdp_dropped: 0,
                xdp_forwarded: 0,
                xdp_own_address_forged: 0,
                xdp_fwd_refused: BTreeMap::new(),
            })
            .collect();
        let mut total = DataplaneCounters::default();
        for t in &threads {
            total.add(&t.counters);
        }
        let mut s = snapshot(&table, &total, ports.clone(), 1.0);
        s.threads = thread_stats(&threads, &ports);
        s
    }

    #[test]
    fn the_stats_json_lists_each_thread_with_its_sockets_and_every_counter() {
        let v = serde_json::to_value(with_threads()).unwrap();
        let t = v["threads"].as_array().unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0]["thread"], 0);
        assert_eq!(
            t[0]["sockets"],
            serde_json::json!([{"port": "sw-w0", "queue": 0}, {"port": "2", "queue": 0}]),
            "a port index without a name is shown as the index"
        );
        assert_eq!(t[0]["busy_share"], 0.875);
        assert_eq!(t[1]["dataplane_stalls"], 1);
        // Every counter of the schema, per thread; the totals are their sum.
        DataplaneCounters::default().visit(&mut |name, _, _| {
            let sum: u64 = t.iter().map(|th| th[name].as_u64().unwrap()).sum();
            assert_eq!(v[name].as_u64(), Some(sum), "{name}");
        });
        assert_eq!(v["rx_frames"], 1500);
    }

    #[test]
    fn the_switchctl_thread_table_shows_busy_share_counters_and_sockets() {
        // Its columns are counters of the schema (a rename fails here,
        // not as a silent 0 in the table).
        let mut names = Vec::new();
        DataplaneCounters::default().visit(&mut |name, _, _| names.push(name));
        for c in THREAD_TABLE_COUNTERS {
            assert!(names.contains(&c), "{c} is not a dataplane counter");
        }
        let v = serde_json::to_value(with_threads()).unwrap();
        let lines = thread_table(&v);
        assert_eq!(lines.len(), 4, "{lines:#?}");
        let words = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(
            words(&lines[0]),
            [
                "thread",
                "busy",
                "rx_frames",
                "tx_frames",
                "forwarded",
                "sockets",
                "(port/queue)"
            ]
        );
        assert_eq!(
            words(&lines[1]),
            ["0", "88%", "1000", "3000", "7", "sw-w0/0", "2/0"]
        );
        assert_eq!(words(&lines[2]), ["1", "0%", "500", "1500", "0", "sw-w1/0"]);
        assert_eq!(words(&lines[3]), ["2", "0%", "0", "0", "0", "none"]);
        // No threads (an old switchd's reply): no table.
        assert!(thread_table(&serde_json::json!({"rx_frames": 3})).is_empty());
    }
}
