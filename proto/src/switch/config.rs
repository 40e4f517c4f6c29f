//! What an operator declares: a job ([`JobConfig`], checked by
//! [`JobConfig::validate`]), where its workers are ([`Ipv4Prefix`],
//! [`Source`], [`Endpoint`]) and, on a leaf of an aggregation tree, where
//! its partials go ([`Upstream`], [`SpineAddr`], routed by
//! [`Upstream::route`]; [`UPSTREAM`] marks a reply to a spine).
//!
//! Layering: the bottom of the switch's declarations; it names only
//! [`super::priority`] (a job's class) of the switch, so every other part
//! (the job, its uplink, the replies, the table) may name it.
//!
//! Invariants: a validated config has every size inside the limits of
//! docs/PROTOCOL.md ("Limits"), and [`JobConfig::pool_bytes`] is the memory
//! its slot pool takes, computed without overflow; a job whose pool would
//! not fit the switch's budget is refused before anything is allocated.

use std::fmt;

use crate::tag::AuthMode;
use crate::wire::{Dtype, SECRET_LEN};

/// An IPv4 prefix (address, prefix length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Prefix {
    pub addr: [u8; 4],
    pub len: u8,
}

impl Ipv4Prefix {
    pub fn contains(&self, ip: [u8; 4]) -> bool {
        if self.len == 0 {
            return true;
        }
        let len = self.len.min(32) as u32;
        let mask = u32::MAX << (32 - len);
        (u32::from_be_bytes(self.addr) & mask) == (u32::from_be_bytes(ip) & mask)
    }
}

/// Where a worker's packets come from (checked on every DATA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Source {
    pub mac: [u8; 6],
    pub ip: [u8; 4],
    pub port: u16,
}

/// How to reach a worker: its source, plus which switch port and local
/// addresses its JOIN arrived on. The engine only compares `source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Endpoint {
    pub source: Source,
    pub local_mac: [u8; 6],
    pub local_ip: [u8; 4],
    pub local_port: u16,
    /// Index of the switch port (interface) the worker is behind.
    pub port_idx: u32,
    /// Queue of that port its JOIN arrived on.
    pub queue: u32,
    /// Lane replies granted to this member: L, the switch's seq lanes,
    /// when its accepted JOIN asked [`LANE_REPLIES`] and L > 1; 0
    /// otherwise. A RESULT of seq s to it then leaves from `local_port +
    /// (s mod L)` ([`Endpoint::for_result`]), every other reply from
    /// `local_port`. Only the table sets it, on a JOIN; shells make
    /// endpoints with 0.
    ///
    /// [`LANE_REPLIES`]: crate::wire::flags::LANE_REPLIES
    pub result_lanes: u16,
}

impl Endpoint {
    /// Where the RESULT of `seq` to this member goes from: with lane
    /// replies granted, `local_port + (seq mod result_lanes)`, and the
    /// grant spent (`result_lanes` 0: the address is final, so applying it
    /// again changes nothing); otherwise this endpoint as it is. Every
    /// RESULT [`super::Reply`] is made through it.
    #[inline]
    pub fn for_result(mut self, seq: u32) -> Endpoint {
        if self.result_lanes > 1 {
            self.local_port = crate::wire::seq_lane_port(self.local_port, seq, self.result_lanes);
            self.result_lanes = 0;
        }
        self
    }
}

/// `Endpoint::port_idx` of a reply that goes up to a spine: the shell sends
/// it through its uplink socket to `to.source`, not out of a switch port.
pub const UPSTREAM: u32 = u32::MAX;

/// Most slots a job's pool may have (docs/PROTOCOL.md, "Limits").
pub const MAX_POOL_SLOTS: u16 = 32768;
/// Most allowed-source prefixes a job may list.
pub const MAX_ALLOWED_SOURCES: usize = 256;
/// Most spines a job may have.
pub const MAX_SPINES: usize = 64;

/// A spine's address: its aggregation address and UDP port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpineAddr {
    pub ip: [u8; 4],
    pub port: u16,
}

/// A leaf's place in the trees of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// This leaf's rank in the spines' job (leaves are summed in this order).
    pub leaf_index: u16,
    /// Leaves of the job (the spines' job has this many ranks).
    pub n_leaves: u16,
    /// The spines, in tree order: chunk seq `s` goes through `spines[s mod K]`.
    pub spines: Vec<SpineAddr>,
    /// The leaf's own address and UDP port on the uplink (the JOIN's MAC
    /// covers it; the spine must see the same).
    pub local_ip: [u8; 4],
    pub local_port: u16,
}

impl std::fmt::Display for SpineAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b, c, d] = self.ip;
        write!(f, "{a}.{b}.{c}.{d}:{}", self.port)
    }
}

impl SpineAddr {
    /// Where a reply to this spine goes: the leaf's uplink, not a port.
    pub fn endpoint(self) -> Endpoint {
        Endpoint {
            source: Source {
                mac: [0; 6],
                ip: self.ip,
                port: self.port,
            },
            port_idx: UPSTREAM,
            ..Endpoint::default()
        }
    }
}

impl Upstream {
    pub fn k(&self) -> u32 {
        self.spines.len() as u32
    }

    /// The spine of leaf seq `seq`, and the seq it has there.
    pub fn route(&self, seq: u32) -> (usize, u32) {
        let k = self.k().max(1);
        ((seq % k) as usize, seq / k)
    }

    /// The leaf seq of seq `spine_seq` at spine `spine`.
    pub fn leaf_seq(&self, spine: usize, spine_seq: u32) -> u32 {
        spine_seq.wrapping_mul(self.k()).wrapping_add(spine as u32)
    }

    /// The first seq at spine `spine` of chunks from leaf seq `seq` on.
    pub fn spine_seq_from(&self, spine: usize, seq: u32) -> u32 {
        let k = self.k().max(1);
        let (s, r) = (seq / k, seq % k);
        if (spine as u32) < r {
            s + 1
        } else {
            s
        }
    }

    /// The index of the spine at `ip`:`port`, if it is one of ours.
    pub fn spine_at(&self, ip: [u8; 4], port: u16) -> Option<usize> {
        self.spines
            .iter()
            .position(|s| s.ip == ip && s.port == port)
    }
}

/// A job as declared to the switch.
#[derive(Clone)]
pub struct JobConfig {
    pub id: u16,
    pub n_workers: u16,
    pub allowed_sources: Vec<Ipv4Prefix>,
    pub secret: [u8; SECRET_LEN],
    /// Slots in the pool, a power of two.
    pub pool_slots: u16,
    pub elems_per_chunk: u16,
    /// Element type of DATA/RESULT payloads; JOINs must name it.
    pub dtype: Dtype,
    /// Chunks in flight the switch allows (≤ pool_slots).
    pub window: u16,
    /// The job's class: while a job of a higher class is busy, this one
    /// yields (docs/PROTOCOL.md, "Priorities").
    pub priority: super::priority::Priority,
    /// How DATA and RESULT are authenticated: by the member's source only,
    /// or by a tag after every payload (docs/PROTOCOL.md, "Per-packet
    /// authentication").
    pub auth: AuthMode,
    /// On a leaf of an aggregation tree: where partial sums go
    /// ([`super::uplink`]); `None` on a single switch or a spine.
    pub upstream: Option<Upstream>,
    /// Gradient statistics: every summed RESULT carries a 24-byte trailer
    /// (docs/PROTOCOL.md, "Gradient statistics").
    pub stats: bool,
}

impl fmt::Debug for JobConfig {
    // Secrets are never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobConfig")
            .field("id", &self.id)
            .field("n_workers", &self.n_workers)
            .field("allowed_sources", &self.allowed_sources)
            .field("secret", &"<redacted>")
            .field("pool_slots", &self.pool_slots)
            .field("elems_per_chunk", &self.elems_per_chunk)
            .field("dtype", &self.dtype)
            .field("window", &self.window)
            .field("priority", &self.priority)
            .field("auth", &self.auth)
            .field("upstream", &self.upstream)
            .field("stats", &self.stats)
            .finish()
    }
}

/// Formats a byte count for people: "3.1 TiB", "512 MiB".
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Why a job declaration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobConfigError {
    #[error("job id 0 is invalid (use 1..=65535)")]
    ZeroId,
    #[error("job {0}: n_workers must be at least 1")]
    NoWorkers(u16),
    #[error("job {0}: pool_slots {1} must be a power of two in 1..=32768")]
    PoolSlots(u16, u16),
    #[error("job {0}: elems_per_chunk must be 1..={2}, got {1}")]
    ElemsPerChunk(u16, u16, u16),
    #[error("job {0}: window must be 1..=pool_slots ({2}), got {1}")]
    Window(u16, u16, u16),
    #[error("job {0} is already declared")]
    Duplicate(u16),
    #[error("job {0}: allowed_sources is empty, no worker could join")]
    NoSources(u16),
    #[error("job {0}: {1} allowed_sources prefixes, at most 256")]
    TooManySources(u16, usize),
    #[error(
        "job {id}: its slot pool needs {} ({need} bytes: pool_slots × (n_workers + 2) × \
         elems_per_chunk × 4 plus bookkeeping), but the switch's pool memory budget is {} \
         with {} in use; lower pool_slots or n_workers, remove a job, or raise \
         [switch] pool_memory_mib",
        human_bytes(*need), human_bytes(*budget), human_bytes(*in_use)
    )]
    OverBudget {
        id: u16,
        need: u64,
        budget: u64,
        in_use: u64,
    },
    #[error(
        "job {0}: auth = \"mac\" is not supported on a leaf of an aggregation tree (its \
         partials to the spines would go untagged); declare the tree's jobs with auth = \"port\" \
         and enforce sources in the fabric"
    )]
    MacOnLeaf(u16),
    #[error("job {0}: upstream: {1}")]
    Upstream(u16, &'static str),
    #[error(
        "job {0}: the id is in tenant {1}'s job_ids [{2}, {3}], which its self-provisioned \
         jobs take; declare the job with an id outside every tenant's range"
    )]
    InTenantRange(u16, String, u16, u16),
    #[error("job {id}: allocating its slot pool ({}) failed: the machine is out of memory", human_bytes(*need))]
    OutOfMemory { id: u16, need: u64 },
}

impl JobConfig {
    /// Checks the declaration; `max_f32_elems` is how many float32 elements
    /// fit in the switch's frames (a half-precision job fits twice as many,
    /// except on a leaf, whose partials go up as float32).
    pub fn validate(&self, max_f32_elems: u16) -> Result<(), JobConfigError> {
        let max_elems = self.max_elems(max_f32_elems);
        if self.id == 0 {
            return Err(JobConfigError::ZeroId);
        }
        if self.n_workers == 0 {
            return Err(JobConfigError::NoWorkers(self.id));
        }
        if !self.pool_slots.is_power_of_two() || self.pool_slots > MAX_POOL_SLOTS {
            return Err(JobConfigError::PoolSlots(self.id, self.pool_slots));
        }
        if self.elems_per_chunk == 0 || self.elems_per_chunk > max_elems {
            return Err(JobConfigError::ElemsPerChunk(
                self.id,
                self.elems_per_chunk,
                max_elems,
            ));
        }
        if self.window == 0 || self.window > self.pool_slots {
            return Err(JobConfigError::Window(
                self.id,
                self.window,
                self.pool_slots,
            ));
        }
        if self.allowed_sources.is_empty() {
            return Err(JobConfigError::NoSources(self.id));
        }
        if self.allowed_sources.len() > MAX_ALLOWED_SOURCES {
            return Err(JobConfigError::TooManySources(
                self.id,
                self.allowed_sources.len(),
            ));
        }
        if let Some(u) = &self.upstream {
            if self.auth == AuthMode::Mac {
                return Err(JobConfigError::MacOnLeaf(self.id));
            }
            let bad = |why| Err(JobConfigError::Upstream(self.id, why));
            if u.spines.is_empty() || u.spines.len() > MAX_SPINES {
                return bad("list 1 to 64 spines");
            }
            if u.n_leaves == 0 || u.leaf_index >= u.n_leaves {
                return bad("leaf_index must be below n_leaves");
            }
            if u.local_port == 0 {
                return bad("the uplink's local UDP port must not be 0");
            }
        }
        Ok(())
    }

    /// Most elements per chunk when `max_f32_elems` float32 elements fill a
    /// frame: the same bytes in the job's chunk dtype, less the RESULT's tag
    /// or token (16 bytes in either auth mode) and the trailer of a `stats`
    /// job.
    pub fn max_elems(&self, max_f32_elems: u16) -> u16 {
        max_elems_for(max_f32_elems, self.chunk_dtype(), self.auth, self.stats)
    }

    /// The element type whose size bounds the job's chunks: its dtype, but
    /// float32 on a leaf (its partials and its spine's results are float32,
    /// so that a half-precision sum is rounded once, at the leaf, after the
    /// spine).
    pub fn chunk_dtype(&self) -> Dtype {
        if self.upstream.is_some() {
            Dtype::F32
        } else {
            self.dtype
        }
    }

    /// Bytes the job's slot pool and membership take (what the budget
    /// counts): per slot an accumulator, a result and one parked copy per
    /// rank, each `elems_per_chunk` floats, plus two rank bitmaps; per rank
    /// a member record; in an `auth = "mac"` job, per rank a DATA key and
    /// per slot a RESULT tag. u64 arithmetic: at most 2^15 × 2^16 × 2^12, no
    /// overflow.
    pub fn pool_bytes(&self) -> u64 {
        let slots = u64::from(self.pool_slots);
        let n = u64::from(self.n_workers);
        let e = u64::from(self.elems_per_chunk);
        // A leaf keeps one partial per slot besides the shadow.
        let per_slot = if self.upstream.is_some() {
            n + 3
        } else {
            n + 2
        };
        let floats = slots * per_slot * e;
        let bitmaps = slots * 2 * n.div_ceil(64) * 8;
        let members = n * 192;
        // An auth = "mac" job also keeps per rank a DATA key (an AES-GCM key
        // schedule) and per slot its RESULT's tags (with values, and NOVAL).
        let mac = match self.auth {
            AuthMode::Port => 0,
            AuthMode::Mac => n * MAC_BYTES_PER_RANK + slots * 48,
        };
        // A stats job's accumulator, result and partial have room for the
        // trailer after a full chunk, each parked row for a rank's part
        // (16 bytes), and a slot keeps a running sum of squares and count.
        let stats = if self.stats {
            slots * (3 * 24 + 16 + n * 16)
        } else {
            0
        };
        floats * 4 + bitmaps + members + slots * 64 + mac + stats
    }
}

/// What [`JobConfig::pool_bytes`] charges an `auth = "mac"` job per rank for
/// its DATA key (a test checks that the key fits).
pub const MAC_BYTES_PER_RANK: u64 = 512;

/// Most elements of `dtype` in the payload bytes of `f32_elems` float32
/// elements, less what follows a RESULT's values: its tag (`auth = "mac"`)
/// or token (`auth = "port"`), 16 bytes either way, and with `stats` the
/// statistics trailer (the default and the limit of a job's chunk size).
pub const fn max_elems_for(f32_elems: u16, dtype: Dtype, auth: AuthMode, stats: bool) -> u16 {
    let bytes = f32_elems as usize * 4;
    let tag = auth.result_tag_len() + if stats { crate::stats::STATS_LEN } else { 0 };
    if bytes <= tag {
        return 0;
    }
    let v = (bytes - tag) / dtype.size();
    if v > u16::MAX as usize {
        u16::MAX
    } else {
        v as u16
    }
}
