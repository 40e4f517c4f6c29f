//! The worker library: join a job on the aggregation switch, then
//! `all_reduce(&mut [T])`, `reduce_scatter(&[T], &mut [T])`,
//! `all_gather(&[T], &mut [T])` or `broadcast(root, &mut [T])` as many times
//! as the training loop needs, `T` the job's element type ([`Element`]: f32,
//! bf16 or f16). Every kind runs through the same loop (window, resends,
//! ECE, stall errors, re-join); `proto::member::Shape` says which chunks
//! carry values each way (docs/PROTOCOL.md, "Collective kinds").
//!
//! Owns: one UDP socket connected to the switch, the job session (switch
//! generation, pool size, chunk size, next seq and collective id) and the
//! inputs of the current and previous collective, kept so that a re-join
//! after a switch or worker restart can resend from any resume point (an
//! all-reduce's is kept chunk by chunk as the chunks are first sent:
//! [`buffers`]). Inputs are kept as wire bytes (little-endian elements of the job's
//! dtype), so one drive loop serves every element type: DATA payloads are
//! slices of them and RESULT payloads are copied back as they came.
//!
//! The protocol logic lives in proto (sans-IO): `proto::member::Member`
//! owns the membership (join, NACKs, rejoin, probes, heartbeats and their
//! answers, the stall), the collective's chunks and resends, RTT, DCTCP and
//! the advertised window, and writes whole DATA frames; this is the byte
//! mover around it: sockets, batches (mmsg/GSO), seq lanes' ports, waiting,
//! copying RESULT values out, and which inputs to resend after a re-join.
//! Sockets are nonblocking; the loop blocks in `poll(2)` only when it has
//! nothing to send and nothing has arrived.
//!
//! Self-provisioned jobs (`WorkerConfig::provision`, docs/PROTOCOL.md
//! "Tenants and self-provisioned jobs"): the session provisions the job by
//! tenant and name before it joins, and again after the switch forgot it;
//! [`Worker::job`] is the id the switch gave, and a refusal is
//! [`WorkerError::Provision`] (its `refusal.quota()` names a quota hit).
//! Such a job ends after its lease without traffic: a caller idle between
//! collectives for longer runs [`Worker::keepalive`] every
//! [`Worker::keepalive_interval`] (it never blocks; a session lost
//! meanwhile is joined again by the next collective).
//!
//! Gradient statistics: in a `stats = true` job the switch measures
//! Σᵢ‖gᵢ‖² and ‖Σᵢ gᵢ‖² of every summed chunk and sends them with its
//! RESULT; [`Worker::gradient_stats`] gives the last collective's, folded
//! by `proto::member::Collective` in seq order (docs/PROTOCOL.md,
//! "Gradient statistics"). A switch restart keeps them whole, also when
//! the collective goes on with fewer threads (the old shares' trailers
//! move to the new share 0); a collective whose job was declared
//! `stats = true` anew at the restart is [`GradStatsError::Incomplete`].
//!
//! Transports ([`TransportKind`], `WorkerConfig::transport_kind`): `mmsg`
//! moves one datagram per `mmsghdr` with `sendmmsg`/`recvmmsg`; `udp-gso`
//! also coalesces consecutive DATA into `UDP_SEGMENT` super-datagrams and
//! receives RESULTs with `UDP_GRO` (several per buffer, split here), so the
//! kernel walks its UDP/IP send and receive paths once per super-datagram
//! instead of once per chunk. `auto` (the default) turns `UDP_GRO` on and
//! sends the join's first HELLO with a one-segment `UDP_SEGMENT` message: if
//! the kernel takes both, `udp-gso`, else `mmsg` with one warning saying why
//! (see [`gso`] for the kernel facts). The wire is the same either way.

pub mod buffers;
pub mod gso;
pub mod loopback;
pub mod mmsg;
pub mod probe;
mod sockets;
pub mod threads;

use std::io;
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

pub use proto::handshake::JoinAckError;
use proto::handshake::{ChallengeError, JoinParams};
pub use proto::member::SpineWait;
use proto::member::{Event as MemberEvent, Member, MemberStats, Shape, TransportConfig, Waiting};
pub use proto::provisioner::{ProvisionError, ProvisionSpec};
use proto::seq::serial_offset;
use proto::session::{Lost, SessionConfig, SessionError};
pub use proto::stats::GradStats;
pub use proto::tag::AuthMode;
pub use proto::wire::Kind;
use proto::wire::{Dtype, MsgType, NackReason, OP_SUM, SECRET_LEN};

use crate::buffers::{Input, KeptBits, KeptInput, Output};
pub use crate::gso::TransportKind;
use crate::mmsg::DatagramBatch;
use crate::threads::{Lane, LaneJob, LaneSockets, Progress, SocketFailed};

/// How to reach the switch and which job to join.
#[derive(Clone)]
pub struct WorkerConfig {
    pub switch: SocketAddrV4,
    /// Local address to bind (default: any address, ephemeral port).
    pub bind: Option<SocketAddrV4>,
    pub job: u16,
    pub rank: u16,
    pub n_workers: u16,
    pub secret: [u8; SECRET_LEN],
    /// Element type of the job (its JOIN names it; the switch refuses
    /// another).
    pub dtype: Dtype,
    pub transport: TransportConfig,
    /// How datagrams move to and from the switch (default: auto).
    pub transport_kind: TransportKind,
    /// How long to wait for all ranks to join.
    pub join_timeout: Duration,
    /// Fail a collective when no RESULT made progress for this long.
    pub stall_timeout: Duration,
    /// A self-provisioned job (docs/PROTOCOL.md, "Tenants and
    /// self-provisioned jobs"): the tenant, its key and the job's name; the
    /// worker provisions the job and joins it with the id and derived
    /// secret the switch gives (`job` and `secret` are replaced then).
    /// `None`: a declared job, `job` and `secret` as given.
    pub provision: Option<ProvisionSpec>,
    /// Threads that carry one collective (docs/design/worker-threads.md):
    /// 0 picks them per collective from the tensor's size and the cores
    /// this process may use ([`auto_threads`]); 1 is one thread and one
    /// socket, as before lane replies existed. More than one needs a
    /// switch with seq lanes that grants lane replies; T is clamped to its
    /// lanes (a power of two).
    pub threads: usize,
}

impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("switch", &self.switch)
            .field("job", &self.job)
            .field("rank", &self.rank)
            .field("n_workers", &self.n_workers)
            .field("dtype", &self.dtype)
            .field("secret", &"<redacted>")
            .field("provision", &self.provision)
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

impl WorkerConfig {
    pub fn new(
        switch: SocketAddrV4,
        job: u16,
        rank: u16,
        n_workers: u16,
        secret: [u8; SECRET_LEN],
    ) -> WorkerConfig {
        WorkerConfig {
            switch,
            bind: None,
            job,
            rank,
            n_workers,
            secret,
            dtype: Dtype::F32,
            transport: TransportConfig::default(),
            transport_kind: TransportKind::Auto,
            join_timeout: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(5),
            provision: None,
            threads: 0,
        }
    }

    /// A worker of tenant `spec.tenant`'s self-provisioned job
    /// `spec.job_name`: the job id and secret come from the switch.
    pub fn provisioned(
        switch: SocketAddrV4,
        spec: ProvisionSpec,
        rank: u16,
        n_workers: u16,
    ) -> WorkerConfig {
        WorkerConfig {
            provision: Some(spec),
            ..WorkerConfig::new(switch, 0, rank, n_workers, [0; SECRET_LEN])
        }
    }
}

/// A spine silent this long is reported as dead or unreachable: an alive
/// one answers its leaf's HEARTBEATs, sent every 0.5 s while it waits.
pub const SPINE_SILENT: Duration = Duration::from_millis(1500);

/// The end of a stall error: what the switch said the chunk waits for.
fn stall_reason(missing: Option<&[u16]>, upstream: Option<&SpineWait>) -> String {
    if let Some(w) = upstream {
        let (spine, tree) = (w.spine, w.tree);
        if let Some(why) = w.refused {
            use proto::wire::SpineRefusal as R;
            // A self-provisioned job's tree is the tenants' declarations.
            let fix = match why {
                R::ProvisionRefused(_) | R::ProvisionQuota(_) => "the tenant on the spine",
                _ => "the job's declaration",
            };
            return format!(
                "the leaf switch cannot join spine {spine} (tree {tree}): {why}; see the leaf's \
                 log and fix {fix}"
            );
        }
        return match w.silent_for {
            Some(d) if d < SPINE_SILENT && !w.leaves.is_empty() => format!(
                "the leaf switch waits for spine {spine} (tree {tree}), which waits for leaves \
                 {:?} (are those leaf switches and their ranks running?)",
                w.leaves
            ),
            Some(d) if d < SPINE_SILENT => format!(
                "the leaf switch waits for spine {spine} (tree {tree}), which answers but sent \
                 no RESULT (RESULTs are being lost between spine and leaf)"
            ),
            Some(d) => format!(
                "the leaf switch waits for spine {spine} (tree {tree}), silent for {:.1} s: \
                 that switch is dead or unreachable from the leaf; restart it (or take it out \
                 of the job's spines on every leaf) and restart the job",
                d.as_secs_f64()
            ),
            None => format!(
                "the leaf switch waits for spine {spine} (tree {tree}), which it has never \
                 heard from: that switch is dead or unreachable from the leaf; restart it (or \
                 take it out of the job's spines on every leaf) and restart the job"
            ),
        };
    }
    match missing {
        Some(m) if !m.is_empty() => {
            format!("the switch is waiting for ranks {m:?} (did they die? restart them to rejoin)")
        }
        Some(_) => "the switch reports nothing missing (RESULTs are being lost)".to_string(),
        None => "the switch did not answer heartbeats (is it running and reachable?)".to_string(),
    }
}

/// An element type a job can all-reduce: its wire encoding is its
/// little-endian memory (the crate supports little-endian targets only).
pub trait Element: bytemuck::Pod {
    const DTYPE: Dtype;
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
}

impl Element for half::bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
}

impl Element for half::f16 {
    const DTYPE: Dtype = Dtype::F16;
}

/// What the worker asked for, named in a refusal for differing parameters.
fn refusal_hint(reason: &NackReason, n_workers: u16, dtype: Dtype) -> String {
    match reason {
        NackReason::ParametersDiffer => format!(
            "; this worker joined with n_workers {n_workers}, dtype {dtype}, op sum: match the \
             job's declaration (switchctl jobs shows its n_workers and dtype; a job resized \
             with switchctl job resize takes workers of its new size only)"
        ),
        NackReason::RankOutOfRange => format!(
            "; this worker joined as one of {n_workers}: the job has fewer ranks (switchctl \
             jobs shows its n_workers; it may have been resized)"
        ),
        _ => String::new(),
    }
}

/// What `call`'s lengths count.
fn unit(call: &str) -> &'static str {
    if call.ends_with("_bytes") {
        "bytes"
    } else {
        "elements"
    }
}

/// What a [`WorkerError::WrongLength`] asks for.
fn length_rule(call: &str, input: usize, n: u16) -> String {
    let n_us = usize::from(n);
    match call {
        "reduce_scatter" if !input.is_multiple_of(n_us) => format!(
            "the input must be n × m elements (n = {n} ranks), and {input} is not a multiple of {n}"
        ),
        "reduce_scatter" => format!(
            "the input must be n × the output (n = {n} ranks): pass an output of {} elements",
            input / n_us
        ),
        "all_gather" | "all_gather_bytes" => format!(
            "the output must be n × the input (n = {n} ranks): pass an output of {} {}",
            input.saturating_mul(n_us),
            unit(call)
        ),
        _ => format!("every rank passes the same length (n = {n} ranks)"),
    }
}

/// Errors of the worker library.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The switch refused to provision the job (a quota: `refusal.quota()`).
    /// Not an error `source`: the message already says it, and a chain
    /// printer (anyhow's `{:#}`) would say it twice.
    #[error("rank {rank}: {refusal}")]
    Provision { rank: u16, refusal: ProvisionError },
    #[error(
        "job {job} rank {rank}: the switch forgot the provisioned job {rounds} times in a row \
         before this rank could join it: check that no one removes it (switchctl jobs) and \
         that the switch is not restarting in a loop"
    )]
    ProvisionedJobVanishes { job: u16, rank: u16, rounds: u32 },
    #[error("{call} failed on the UDP socket to switch {switch}: {source}")]
    Io {
        call: &'static str,
        switch: SocketAddrV4,
        source: io::Error,
    },
    #[error(
        "job {job} rank {rank}: the switch refused: {reason}{}",
        refusal_hint(reason, *n_workers, *dtype)
    )]
    Refused {
        job: u16,
        rank: u16,
        reason: NackReason,
        n_workers: u16,
        dtype: Dtype,
    },
    #[error(
        "job {job} rank {rank}: {call} of {tensor} elements, but the worker joined the job \
         as {joined} (pass a tensor of {joined}, or join with dtype {tensor})"
    )]
    WrongDtype {
        job: u16,
        rank: u16,
        /// The method called: "all_reduce", "reduce_scatter", ...
        call: &'static str,
        tensor: Dtype,
        joined: Dtype,
    },
    #[error(
        "job {job} rank {rank}: {call} with an input of {input} and an output of {output} \
         {}: {}",
        unit(call),
        length_rule(call, *input, *n)
    )]
    WrongLength {
        job: u16,
        rank: u16,
        call: &'static str,
        input: usize,
        output: usize,
        /// Ranks in the job.
        n: u16,
    },
    #[error(
        "job {job} rank {rank}: all_gather_bytes of {bytes} bytes, which is not a whole number \
         of the job's {dtype} elements ({} bytes each)",
        dtype.size()
    )]
    NotWholeElements {
        job: u16,
        rank: u16,
        bytes: usize,
        dtype: Dtype,
    },
    #[error("job {job} rank {rank}: broadcast from root {root}, but the job's ranks are 0..{n}")]
    BadRoot {
        job: u16,
        rank: u16,
        root: u16,
        n: u16,
    },
    #[error(
        "job {job} rank {rank}: the switch refused a {kind} (NACK 10, collective kind not \
         supported): reduce-scatter, all-gather and broadcast need a job on a single switch, \
         not an aggregation tree; declare the job on one switch, or use all_reduce"
    )]
    KindNotSupported { job: u16, rank: u16, kind: Kind },
    #[error(
        "job {job} rank {rank}: no JOIN_ACK from switch {switch} within {waited:?}: \
         is switchd running with job {job} declared, and have all {n} ranks started?"
    )]
    JoinTimeout {
        job: u16,
        rank: u16,
        n: u16,
        switch: SocketAddrV4,
        waited: Duration,
    },
    #[error(
        "job {job} rank {rank}: collective {collective} stalled at seq {seq}: no RESULT for \
         {waited:?}; {}",
        stall_reason(missing.as_deref(), upstream.as_ref())
    )]
    Stalled {
        job: u16,
        rank: u16,
        collective: u32,
        seq: u32,
        waited: Duration,
        /// What the switch last said the seq waits for (None: no answer).
        missing: Option<Vec<u16>>,
        /// A leaf's answer instead: the seq waits for this spine.
        upstream: Option<SpineWait>,
    },
    #[error(
        "job {job} rank {rank}: the switch resumes at collective {resume_collective} seq \
         {resume_seq}, which this worker no longer has the input for (it is at collective \
         {collective})"
    )]
    ResumeOutOfReach {
        job: u16,
        rank: u16,
        resume_collective: u32,
        resume_seq: u32,
        collective: u32,
    },
    #[error("job {job} rank {rank}: joining failed: {source}")]
    Handshake {
        job: u16,
        rank: u16,
        source: ChallengeError,
    },
    #[error("job {job} rank {rank}: {source}")]
    JoinAck {
        job: u16,
        rank: u16,
        source: JoinAckError,
    },
    #[error("job {job}: the switch's chunk size {elems} or pool size {slots} is unusable")]
    BadJoinAck { job: u16, elems: u16, slots: u16 },
    #[error(
        "job {job} rank {rank}: the switch's JOIN_ACK names gradient statistics mode {value} \
         (0 off, 1 on), which this worker does not know: upgrade the worker to the switch's \
         version"
    )]
    UnknownStats { job: u16, rank: u16, value: u8 },
    #[error(
        "{call} failed on the UDP socket to switch {switch}: {source}: transport \"udp-gso\" \
         cannot work here: {reason}; {fix}"
    )]
    TransportUnavailable {
        call: &'static str,
        switch: SocketAddrV4,
        source: io::Error,
        reason: &'static str,
        fix: &'static str,
    },
    #[error(
        "job {job} rank {rank}: an all-reduce of this auth = \"mac\" job failed, and its chunks \
         may not be tagged again with other data under this join's key; make a new Worker (a \
         new join) to go on"
    )]
    MacNeedsNewJoin { job: u16, rank: u16 },
    #[error("tensor of {len} elements is too long for one collective (max {max})")]
    TensorTooLong { len: usize, max: usize },
}

impl From<SocketFailed> for WorkerError {
    fn from(e: SocketFailed) -> WorkerError {
        WorkerError::Io {
            call: e.call,
            switch: e.peer,
            source: e.source,
        }
    }
}

/// Why [`Worker::gradient_stats`] has no statistics to give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GradStatsError {
    #[error(
        "job {job} rank {rank}: gradient_stats: the job is not declared with stats = true, so \
         the switch measures nothing; declare the job with stats = true to get them"
    )]
    NotAStatsJob { job: u16, rank: u16 },
    #[error(
        "job {job} rank {rank}: gradient_stats: no collective has completed on this worker yet \
         (or the last one failed); call it after all_reduce or reduce_scatter returns"
    )]
    NoCollective { job: u16, rank: u16 },
    #[error(
        "job {job} rank {rank}: gradient_stats: the last collective ({collective}) was an \
         all-gather or broadcast, which sums nothing; call it after all_reduce or reduce_scatter"
    )]
    NotSummed {
        job: u16,
        rank: u16,
        collective: u32,
    },
    #[error(
        "job {job} rank {rank}: gradient_stats: collective {collective} was summed, but some of \
         its chunks' RESULTs came without statistics: the switch restarted during it with the \
         job newly declared stats = true, and the chunks summed before the restart were never \
         measured; the next collective's statistics are whole"
    )]
    Incomplete {
        job: u16,
        rank: u16,
        collective: u32,
    },
}

/// Counters of a worker session.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct WorkerStats {
    pub collectives: u64,
    pub chunks_sent: u64,
    /// Of those, DATA that carried values (the others were NOVAL: an
    /// all-gather's other ranks, a reduce-scatter's own kept shard).
    pub values_sent: u64,
    pub chunks_resent: u64,
    /// Of those, resent early because later RESULTs arrived.
    pub chunks_fast_resent: u64,
    /// HEARTBEATs asking what a timed-out oldest chunk waits for (the
    /// straggler hold's probes; docs/PROTOCOL.md, "Reliability"), every
    /// thread's.
    pub hold_probes: u64,
    /// Timeouts of the oldest chunk that resent nothing: the switch had
    /// this rank's DATA and waited for another rank's.
    pub held_timeouts: u64,
    /// HEARTBEATs sent: every thread's probes (thread 0 sends them all),
    /// the stall watch's and an idle provisioned job's keepalives.
    pub heartbeats_sent: u64,
    pub results: u64,
    pub duplicate_results: u64,
    pub ece_results: u64,
    pub rejoins: u64,
    pub nacks: u64,
    /// NACKs whose tag did not verify under the session key, and RESULTs
    /// of another generation, during a collective: ignored (each may make
    /// the worker probe; docs/PROTOCOL.md, "Sessions").
    pub unauthenticated_dropped: u64,
    /// HELLOs sent to ask the switch whether it restarted.
    pub probes_sent: u64,
    /// Probes the switch answered under the session's generation: what
    /// triggered them was spoofed.
    pub spoofed_triggers: u64,
    /// RESULTs whose payload was not `count` elements of the job's dtype
    /// (ignored).
    pub bad_length_results: u64,
    /// RESULTs of another collective kind than the chunk's, or with values
    /// where this rank was due a NOVAL RESULT (or the reverse): ignored.
    pub mismatched_results: u64,
    /// In an `auth = "mac"` job: RESULTs whose tag did not verify under the
    /// activation's RESULT key (ignored, never written to the tensor).
    pub bad_tag_results: u64,
    /// JOIN_ACKs whose tag did not verify under this join's session key
    /// (ignored).
    pub bad_tag_join_acks: u64,
    /// Current congestion window (chunks).
    pub window: u16,
    /// DCTCP α.
    pub alpha: f64,
    /// Smoothed RTT in microseconds (0 before any sample).
    pub srtt_us: u64,
    /// Current retransmission timeout in microseconds.
    pub rto_us: u64,
    /// DATA sent inside `UDP_SEGMENT` super-datagrams of several (udp-gso).
    pub tx_coalesced: u64,
    /// Datagrams received in `UDP_GRO` buffers holding several (udp-gso).
    pub rx_coalesced: u64,
}

/// The gradient statistics of a completed collective.
#[derive(Debug, Clone, Copy)]
enum Grad {
    /// Every chunk's trailer, folded.
    Whole(GradStats),
    /// An all-gather or broadcast (or a job without statistics): nothing
    /// was measured.
    NotSummed,
    /// Summed, but a chunk's RESULT came without a trailer: the job became
    /// `stats = true` at a switch restart during the collective.
    Incomplete,
}

/// What the receive loop learned.
enum Event {
    /// The collective finished.
    Completed,
    /// The switch asked us to re-join (an authenticated NACK 6/7, or a probe
    /// answered under a new gen); done, at this resume point.
    Resumed { collective: u32, seq: u32 },
}

/// How thread 0's loop ended.
enum Drive {
    /// Every share of the collective is complete.
    Completed,
    /// The switch lost our session (`why`) and the member started joining
    /// again: the caller rejoins from the oldest unanswered seq of every
    /// share.
    Lost(Lost),
    /// A lane thread failed; its error says why.
    LaneFailed,
}

/// A joined member of a job.
pub struct Worker {
    cfg: WorkerConfig,
    sock: UdpSocket,
    /// The member (docs/PROTOCOL.md, "Joining" and "Sessions"): it decides
    /// what each message from the switch means, which control messages go,
    /// which chunk goes next under which window, and writes the DATA.
    member: Member,
    next_seq: u32,
    next_collective: u32,
    /// Input of the current collective as wire bytes (resends read from
    /// here).
    input: KeptInput,
    /// Input of the previous collective, kept until the current completes.
    prev_input: KeptInput,
    /// Which chunks of the current in-place input are kept (buffers.rs).
    kept_bits: KeptBits,
    /// The last collective failed: `input` holds its input (for
    /// `last_input`), `prev_input` still the last completed one's.
    last_failed: bool,
    prev_first_seq: u32,
    prev_collective: Option<u32>,
    /// The previous collective's shape (what `prev_input` holds).
    prev_shape: Shape,
    buf: Vec<u8>,
    rx: Vec<u8>,
    /// DATA queued for one `sendmmsg`, RESULTs from one `recvmmsg`.
    txb: DatagramBatch,
    rxb: DatagramBatch,
    /// The transport in use: `Mmsg` until the GSO probe succeeded.
    kind: TransportKind,
    /// `UDP_GRO` is on: single receives must cut at the first datagram.
    gro: bool,
    /// The next HELLO is the GSO probe (auto or udp-gso, not yet decided).
    probe_gso: bool,
    /// Datagrams per GSO super-datagram while chunks are being lost.
    burst: gso::BurstLimit,
    stats: WorkerStats,
    /// A collective of an `auth = "mac"` job failed: its (seq, collective)
    /// pairs were tagged under this membership's DATA key and must not tag
    /// other data, so this worker sends no more DATA.
    data_key_spent: bool,
    /// The last completed collective's id and what [`Worker::gradient_stats`]
    /// answers for it; `None`: none completed, or the last one failed.
    last_grad: Option<(u32, Grad)>,
    /// The switch lost our session between collectives ([`Worker::keepalive`]
    /// saw it): the next collective joins again before it sends.
    rejoin_due: bool,
    /// The session failed for good while idle ([`Worker::keepalive`]):
    /// every later collective fails with it at once.
    failed: Option<SessionError>,
    /// Sockets 1..L, open while the switch grants lane replies
    /// (docs/design/worker-threads.md); `sock` is socket 0.
    lane_socks: LaneSockets,
    /// Shares 1.. of the collectives carried by more than one thread (the
    /// member above carries share 0), kept between collectives.
    lanes: Vec<Lane>,
    /// Joins (JOIN_ACKs) so far: a lane follows the session of the last.
    joins: u64,
    /// Threads that carry the current (or last) collective.
    active: usize,
}

/// What `cfg`'s worker joins with from `sock`: its job and rank, and the
/// address and port the socket is bound to (the JOIN's MAC covers them).
pub(crate) fn join_params(cfg: &WorkerConfig, sock: &UdpSocket) -> Result<JoinParams, WorkerError> {
    let local = match sock
        .local_addr()
        .map_err(io_err("getsockname", cfg.switch))?
    {
        std::net::SocketAddr::V4(a) => a,
        std::net::SocketAddr::V6(_) => SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0),
    };
    Ok(JoinParams {
        job: cfg.job,
        rank: cfg.rank,
        n_workers: cfg.n_workers,
        dtype: cfg.dtype as u8,
        op: OP_SUM,
        secret: cfg.secret,
        ip: local.ip().octets(),
        port: local.port(),
        provision: cfg.provision.clone(),
    })
}

pub(crate) fn io_err(
    call: &'static str,
    switch: SocketAddrV4,
) -> impl FnOnce(io::Error) -> WorkerError {
    move |source| WorkerError::Io {
        call,
        switch,
        source,
    }
}

/// Waits up to `timeout` for `fd` to become readable.
pub fn wait_readable(fd: i32, timeout: Duration) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().clamp(0, 1000) as i32;
    // SAFETY: one valid pollfd on the stack, count 1.
    unsafe {
        libc::poll(&mut p, 1, ms);
    }
}

impl Worker {
    /// Opens the socket, joins the job and waits until every rank has joined.
    pub fn join(cfg: WorkerConfig) -> Result<Worker, WorkerError> {
        let sw = cfg.switch;
        let sock = open_socket(&cfg).map_err(io_err("opening", sw))?;
        let wants_gso = cfg.transport_kind != TransportKind::Mmsg;
        let gro = wants_gso
            && match gso::set_gro(sock.as_raw_fd(), true) {
                Ok(()) => true,
                Err(e) => {
                    Self::gso_refused(&cfg, "setsockopt(UDP_GRO)", e)?;
                    false
                }
            };
        let params = join_params(&cfg, &sock)?;
        let session_cfg = SessionConfig {
            join_timeout: cfg.join_timeout,
            stall_timeout: cfg.stall_timeout,
        };
        let mut w = Worker {
            member: Member::new(params, session_cfg, cfg.transport, rand::random()),
            sock,
            next_seq: 0,
            next_collective: 0,
            input: KeptInput::default(),
            prev_input: KeptInput::default(),
            kept_bits: KeptBits::default(),
            last_failed: false,
            prev_first_seq: 0,
            prev_collective: None,
            prev_shape: Shape::all_reduce(0),
            buf: vec![0u8; 9216],
            rx: vec![0u8; 9216],
            txb: DatagramBatch::new(mmsg::BATCH, mmsg::SLOT),
            rxb: DatagramBatch::new(mmsg::BATCH, mmsg::SLOT),
            kind: TransportKind::Mmsg,
            gro,
            probe_gso: gro,
            burst: gso::BurstLimit::default(),
            stats: WorkerStats::default(),
            data_key_spent: false,
            last_grad: None,
            rejoin_due: false,
            failed: None,
            lane_socks: LaneSockets::default(),
            lanes: Vec::new(),
            joins: 0,
            active: 1,
            cfg,
        };
        if w.wants_threads() {
            w.member.ask_lane_replies(true);
        }
        w.member.start_join(0, 0, Instant::now());
        let (c, s) = w.join_round()?;
        w.next_collective = c;
        w.next_seq = s;
        Ok(w)
    }

    pub fn rank(&self) -> u16 {
        self.cfg.rank
    }

    /// The input of the last collective this worker ran, completed or
    /// failed, as wire bytes (a reduce-scatter's whole input, an
    /// all-gather's shard); empty before the first. An all-reduce writes its
    /// RESULTs into its buffer as they come, so after a failed one only this
    /// copy still holds what the rank contributed: a host path that finishes
    /// the collective without the switch starts from it.
    pub fn last_input(&self) -> &[u8] {
        if self.last_failed {
            self.input.bytes()
        } else {
            self.prev_input.bytes()
        }
    }
    /// The transport in use (`Mmsg` or `UdpGso`, never `Auto`).
    pub fn transport(&self) -> TransportKind {
        self.kind
    }

    /// A kernel refused `call` of the udp-gso transport with `e`: an error
    /// when it was asked for, else one warning and `Ok` (mmsg it is).
    fn gso_refused(
        cfg: &WorkerConfig,
        call: &'static str,
        e: io::Error,
    ) -> Result<(), WorkerError> {
        let (reason, fix) = gso::unavailable_hint(&e);
        if cfg.transport_kind == TransportKind::UdpGso {
            return Err(WorkerError::TransportUnavailable {
                call,
                switch: cfg.switch,
                source: e,
                reason,
                fix,
            });
        }
        tracing::warn!(
            job = cfg.job,
            rank = cfg.rank,
            "transport auto: using mmsg, not udp-gso: {call} failed: {e}: {reason}"
        );
        Ok(())
    }

    /// Sends the HELLO in `buf[..len]` as the GSO probe and settles the
    /// transport: udp-gso with its batches when the kernel took it, else
    /// mmsg (UDP_GRO off again) and the HELLO sent plainly.
    fn probe_gso(&mut self, len: usize) -> Result<(), WorkerError> {
        self.probe_gso = false;
        let fd = self.sock.as_raw_fd();
        match gso::send_probe(fd, &self.buf[..len]) {
            Ok(()) => {
                self.kind = TransportKind::UdpGso;
                self.txb = DatagramBatch::new_gso(mmsg::GSO_BATCH, mmsg::SLOT);
                self.rxb = DatagramBatch::new_gro(mmsg::GRO_BATCH);
                Ok(())
            }
            Err(e) => {
                Self::gso_refused(&self.cfg, "sendmsg(UDP_SEGMENT)", e)?;
                gso::set_gro(fd, false)
                    .map_err(io_err("setsockopt(UDP_GRO off)", self.cfg.switch))?;
                self.gro = false;
                self.send(len)
            }
        }
    }
    pub fn elems_per_chunk(&self) -> u16 {
        self.member.elems_per_chunk()
    }
    pub fn pool_slots(&self) -> u16 {
        self.member.pool_slots()
    }
    /// The switch generation this worker joined under.
    pub fn generation(&self) -> u32 {
        self.member.session().gen()
    }
    /// The UDP socket to the switch (connected, nonblocking): for tools
    /// that drive the protocol themselves after joining (`aggblast`, bench/).
    /// With the udp-gso transport it has `UDP_GRO` on (a receive may hold
    /// several datagrams): such tools join with [`TransportKind::Mmsg`].
    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }
    /// The window the switch advertised in its last JOIN_ACK, RESULT or
    /// HEARTBEAT answer.
    pub fn advertised_window(&self) -> u16 {
        self.member.advertised_window()
    }
    /// The next chunk's seq and collective (the resume point after a join).
    pub fn next_seq(&self) -> (u32, u32) {
        (self.next_seq, self.next_collective)
    }
    /// The counters of this worker: every thread's chunks, and share 0's
    /// window, DCTCP α and RTT (each lane thread has its own).
    pub fn stats(&self) -> WorkerStats {
        let mut s = self.stats;
        for ms in std::iter::once(&self.member)
            .chain(self.lanes.iter().map(|l| &l.member))
            .map(Member::stats)
        {
            s.chunks_sent += ms.chunks.sent;
            s.values_sent += ms.values_sent;
            s.chunks_resent += ms.chunks.resent;
            s.chunks_fast_resent += ms.chunks.fast_resent;
            s.hold_probes += ms.chunks.probes;
            s.held_timeouts += ms.chunks.held_timeouts;
            s.results += ms.chunks.results;
            s.duplicate_results += ms.chunks.duplicate_results;
            s.ece_results += ms.chunks.ece_results;
            s.mismatched_results += ms.mismatched_results;
        }
        let ss = self.member.session().stats();
        s.heartbeats_sent = ss.heartbeats_sent;
        s.rejoins = ss.rejoins;
        s.nacks = ss.nacks;
        s.unauthenticated_dropped = ss.unauthenticated_dropped;
        s.probes_sent = ss.probes_sent;
        s.spoofed_triggers = ss.spoofed_triggers;
        s.bad_length_results = ss.bad_length_results;
        s.bad_tag_results = ss.bad_tag_results;
        s.bad_tag_join_acks = ss.bad_tag_join_acks;
        s.window = self.member.window();
        s.alpha = self.member.dctcp().alpha();
        s.srtt_us = self.member.rtt().srtt().map_or(0, |d| d.as_micros() as u64);
        s.rto_us = self.member.rtt().rto().as_micros() as u64;
        s.tx_coalesced = self.txb.coalesced();
        s.rx_coalesced = self.rxb.coalesced();
        for l in &self.lanes {
            s.tx_coalesced += l.txb.coalesced();
            s.rx_coalesced += l.rxb.coalesced();
        }
        s
    }

    /// Each thread's counters over every collective it carried: share 0's
    /// member first, then each lane thread's (those kept from a collective
    /// of more threads than the last included). [`Worker::stats`] sums
    /// their chunks.
    pub fn share_stats(&self) -> Vec<MemberStats> {
        std::iter::once(&self.member)
            .chain(self.lanes.iter().map(|l| &l.member))
            .map(Member::stats)
            .collect()
    }

    /// Threads that carried the current or last collective (1 before the
    /// first; docs/design/worker-threads.md).
    pub fn threads(&self) -> usize {
        self.active
    }

    /// Whether the switch granted lane replies at the last join (its
    /// RESULTs come from its lane ports, and more than one thread may
    /// carry a collective).
    pub fn lane_replies(&self) -> bool {
        self.lane_socks.lanes() > 1
    }

    fn send(&self, len: usize) -> Result<(), WorkerError> {
        match self.sock.send(&self.buf[..len]) {
            Ok(_) => Ok(()),
            // A full socket buffer or an ICMP error is loss: the resend timer
            // covers it.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::ConnectionRefused
                ) || e.raw_os_error() == Some(libc::ENOBUFS) =>
            {
                Ok(())
            }
            Err(e) => Err(io_err("send", self.cfg.switch)(e)),
        }
    }

    /// Receives one datagram into `self.rx` (with UDP_GRO on: the first of
    /// a coalesced buffer, the rest are dropped like lost datagrams); None
    /// when nothing is waiting.
    fn recv(&mut self) -> Result<Option<usize>, WorkerError> {
        let got = if self.gro {
            gso::recv_first(self.sock.as_raw_fd(), &mut self.rx)
        } else {
            self.sock.recv(&mut self.rx)
        };
        match got {
            Ok(n) => Ok(Some(n)),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::ConnectionRefused
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(io_err("recv", self.cfg.switch)(e)),
        }
    }

    /// Sends the control messages the session has now (HELLO, JOIN, probe,
    /// HEARTBEAT); the join's first HELLO is the GSO probe.
    fn send_control(&mut self, now: Instant) -> Result<(), WorkerError> {
        while let Some(t) = self.member.poll_control(now) {
            let len = t.bytes().len();
            self.buf[..len].copy_from_slice(t.bytes());
            if self.probe_gso && t.msg_type == MsgType::Hello && !t.probe {
                self.probe_gso(len)?;
            } else {
                self.send(len)?;
            }
        }
        Ok(())
    }

    /// Joins (HELLO → CHALLENGE → JOIN, each repeated until answered) until
    /// a JOIN_ACK, the member having started the join; returns the resume
    /// point.
    fn join_round(&mut self) -> Result<(u32, u32), WorkerError> {
        loop {
            let now = Instant::now();
            if let Some(ev) = self.member.handle_timeout(now) {
                if let Some(resume) = self.on_join_event(ev)? {
                    return Ok(resume);
                }
            }
            self.send_control(now)?;
            let Some(n) = self.recv()? else {
                let until = self
                    .member
                    .poll_timeout()
                    .map_or(Duration::from_millis(50), |d| {
                        d.saturating_duration_since(now)
                    });
                wait_readable(self.sock.as_raw_fd(), until);
                continue;
            };
            if let Some(ev) = self.member.handle(&self.rx[..n], Instant::now()) {
                if let Some(resume) = self.on_join_event(ev)? {
                    return Ok(resume);
                }
            }
        }
    }

    /// What the session said while joining: the resume point once joined.
    fn on_join_event(&mut self, ev: MemberEvent) -> Result<Option<(u32, u32)>, WorkerError> {
        let j = match ev {
            MemberEvent::Joined(j) => j,
            MemberEvent::Failed(e) => return Err(self.session_failed(e)),
            MemberEvent::Provisioned {
                job,
                lease_secs,
                created,
            } => {
                // Errors and logs name the job the switch gave.
                self.cfg.job = job;
                tracing::info!(
                    job,
                    rank = self.cfg.rank,
                    lease_secs,
                    created,
                    "provisioned"
                );
                return Ok(None);
            }
            _ => return Ok(None),
        };
        // DATA of seq s to the switch's port + (s mod lanes): its NIC may
        // steer each lane to a core of its own (docs/PROTOCOL.md, "Seq
        // lanes").
        self.txb.set_lanes(self.cfg.switch, j.seq_lanes);
        self.joins += 1;
        self.set_up_lane_sockets(j.lane_replies, j.seq_lanes)?;
        tracing::debug!(
            job = self.cfg.job,
            rank = self.cfg.rank,
            gen = j.gen,
            resume_collective = j.collective,
            resume_seq = j.seq,
            "joined"
        );
        Ok(Some((j.collective, j.seq)))
    }

    /// Whether this worker asks for lane replies: it may run more than one
    /// thread (`threads` > 1, or auto on a host with a CPU to spare per
    /// rank).
    fn wants_threads(&self) -> bool {
        match self.cfg.threads {
            0 => {
                let (cpus, local) = threads::host_share();
                cpus / local >= 2
            }
            t => t > 1,
        }
    }

    /// After a JOIN_ACK: sockets 1..L open while the switch grants lane
    /// replies on L > 1 lanes (its RESULTs then come from its lane ports),
    /// none otherwise.
    fn set_up_lane_sockets(&mut self, granted: bool, seq_lanes: u16) -> Result<(), WorkerError> {
        let lanes = proto::wire::seq_lanes_from_wire(seq_lanes);
        let want = if granted { usize::from(lanes) } else { 1 };
        if self.lane_socks.lanes() == want {
            return Ok(());
        }
        if want == 1 {
            if self.wants_threads() {
                tracing::info!(
                    job = self.cfg.job,
                    rank = self.cfg.rank,
                    seq_lanes = lanes,
                    "the switch does not grant lane replies (seq_lanes 1, or an older switch): \
                     one thread carries each collective; set seq_lanes to the worker threads \
                     on the switch for more"
                );
            }
            self.lane_socks = LaneSockets::default();
            return Ok(());
        }
        let local = match self
            .sock
            .local_addr()
            .map_err(io_err("getsockname", self.cfg.switch))?
        {
            std::net::SocketAddr::V4(a) => a,
            std::net::SocketAddr::V6(_) => SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0),
        };
        self.lane_socks = LaneSockets::open(local, self.cfg.switch, lanes, self.gro)?;
        Ok(())
    }

    /// Threads for a collective of `chunks` chunks: the configured count
    /// (or [`threads::auto_threads`]'s), a power of two no larger than the
    /// lanes whose replies the switch grants, nor than the chunks.
    fn threads_for(&self, chunks: u32) -> usize {
        let lanes = self.lane_socks.lanes();
        if lanes <= 1 {
            return 1;
        }
        let want = match self.cfg.threads {
            0 => {
                let (cpus, local) = threads::host_share();
                threads::auto_threads(chunks, cpus, local)
            }
            t => t.min(chunks.max(1) as usize),
        };
        threads::pow2_floor(want.min(lanes))
    }

    /// Shares 0..`t` for the collectives from now on (fewer when the last
    /// join granted fewer lanes): the member carries share 0, lane `i`
    /// share `i + 1`, each lane following the session of the last join.
    fn set_shares(&mut self, t: usize) {
        // Both powers of two: the smaller divides the larger.
        let t = t.min(self.lane_socks.lanes()).max(1);
        self.active = t;
        self.member.set_share(0, t as u32);
        let lanes = self.member.seq_lanes();
        while self.lanes.len() < t - 1 {
            let share = self.lanes.len() as u32 + 1;
            let mut member = self.member.lane(share, t as u32);
            // Thread 0 sends its probes and hands it their answers
            // (threads::Progress): the lane holds as share 0 does.
            member.relay_probes(true);
            let mut lane = Lane::new(member, self.kind, self.cfg.switch, lanes);
            lane.followed = self.joins;
            self.lanes.push(lane);
        }
        for (i, lane) in self.lanes[..t - 1].iter_mut().enumerate() {
            lane.member.set_share(i as u32 + 1, t as u32);
            if lane.followed != self.joins {
                lane.member.follow(&self.member);
                lane.txb.set_lanes(self.cfg.switch, lanes);
                lane.followed = self.joins;
            }
        }
    }

    /// The members of the shares carrying the collective: share 0's and the
    /// active lanes'.
    fn shares_mut(&mut self) -> impl Iterator<Item = &mut Member> {
        std::iter::once(&mut self.member).chain(
            self.lanes[..self.active - 1]
                .iter_mut()
                .map(|l| &mut l.member),
        )
    }

    /// Every share of this collective begins collective `collective` of
    /// `shape` at `first_seq`.
    fn begin_all(&mut self, collective: u32, first_seq: u32, shape: Shape) {
        for m in self.shares_mut() {
            m.begin(collective, first_seq, shape);
        }
    }

    /// Every share resends from `seq` (a JOIN_ACK's resume point), after
    /// following the session that joined. A switch that came back with
    /// fewer lanes than this collective's threads gets the rest of it on
    /// fewer threads: every share begins it again, counts the chunks
    /// before `seq` as answered (their RESULTs are here: `seq` is at most
    /// this rank's oldest unanswered one) and resends from `seq`. A
    /// `stats = true` job's trailers that the old shares got go to the new
    /// share 0, so the collective's statistics are whole again once the
    /// rest is answered (docs/PROTOCOL.md, "Gradient statistics").
    fn restart_all(&mut self, seq: u32) {
        let before = self.active;
        self.set_shares(before);
        if self.active != before {
            let c = self.member.collective();
            let (collective, first, shape) = (c.collective(), c.first_seq(), c.shape());
            tracing::info!(
                job = self.cfg.job,
                rank = self.cfg.rank,
                threads = self.active,
                "the switch came back with fewer seq lanes: the rest of the collective runs on \
                 fewer threads"
            );
            let trailers = {
                let mut old: Vec<&mut Member> = std::iter::once(&mut self.member)
                    .chain(self.lanes[..before - 1].iter_mut().map(|l| &mut l.member))
                    .collect();
                Member::take_trailers_of_shares(&mut old)
            };
            self.begin_all(collective, first, shape);
            if let Some(t) = trailers {
                self.member.keep_trailers(t);
            }
            for m in self.shares_mut() {
                m.answered_before(seq);
            }
        }
        for m in self.shares_mut() {
            m.restart_from(seq);
        }
    }

    /// The error of a session that cannot go on.
    fn session_failed(&self, e: SessionError) -> WorkerError {
        let (job, rank) = (self.cfg.job, self.cfg.rank);
        match e {
            SessionError::Refused(reason) => self.refused(reason),
            SessionError::Handshake(source) => WorkerError::Handshake { job, rank, source },
            SessionError::JoinAck(source) => WorkerError::JoinAck { job, rank, source },
            SessionError::BadJoinAck { elems, slots } => {
                WorkerError::BadJoinAck { job, elems, slots }
            }
            SessionError::UnknownStats(value) => WorkerError::UnknownStats { job, rank, value },
            SessionError::JoinTimeout(waited) => WorkerError::JoinTimeout {
                job,
                rank,
                n: self.cfg.n_workers,
                switch: self.cfg.switch,
                waited,
            },
            SessionError::Provision(refusal) => WorkerError::Provision { rank, refusal },
            SessionError::ProvisionedJobVanishes { rounds } => {
                WorkerError::ProvisionedJobVanishes { job, rank, rounds }
            }
        }
    }

    fn refused(&self, reason: NackReason) -> WorkerError {
        WorkerError::Refused {
            job: self.cfg.job,
            rank: self.cfg.rank,
            reason,
            n_workers: self.cfg.n_workers,
            dtype: self.cfg.dtype,
        }
    }

    /// How the job authenticates DATA and RESULT (from the switch's
    /// JOIN_ACK, whose tag proves it came from the switch that took our
    /// JOIN).
    pub fn auth(&self) -> AuthMode {
        self.member.session().auth()
    }

    /// The switch's seq lanes (from its CHALLENGE): DATA of seq s goes to
    /// its port + (s mod lanes).
    pub fn seq_lanes(&self) -> usize {
        self.txb.lanes()
    }

    /// The job's id: the declared one, or the one the switch gave a
    /// self-provisioned job.
    pub fn job(&self) -> u16 {
        self.cfg.job
    }

    /// The job's element type (what this worker joined with).
    pub fn dtype(&self) -> Dtype {
        self.cfg.dtype
    }

    /// Whether the job is `stats = true` (the switch's JOIN_ACK says).
    pub fn has_gradient_stats(&self) -> bool {
        self.member.session().grad_stats()
    }

    /// The gradient statistics of the last completed collective, an
    /// all-reduce or reduce-scatter of a `stats = true` job: Σᵢ‖gᵢ‖² over
    /// every rank's own input, ‖Σᵢ gᵢ‖² of their float32 sum (before
    /// rounding to the job's dtype) and the ranks they cover, the same bits
    /// on every rank (docs/PROTOCOL.md, "Gradient statistics"). Both are of
    /// the raw sum: an average is the caller's division. A reduce-scatter's
    /// cover the whole n·m input, every shard.
    pub fn gradient_stats(&self) -> Result<GradStats, GradStatsError> {
        let (job, rank) = (self.cfg.job, self.cfg.rank);
        if !self.member.session().grad_stats() {
            return Err(GradStatsError::NotAStatsJob { job, rank });
        }
        match self.last_grad {
            None => Err(GradStatsError::NoCollective { job, rank }),
            Some((collective, Grad::NotSummed)) => Err(GradStatsError::NotSummed {
                job,
                rank,
                collective,
            }),
            Some((collective, Grad::Incomplete)) => Err(GradStatsError::Incomplete {
                job,
                rank,
                collective,
            }),
            Some((_, Grad::Whole(s))) => Ok(s),
        }
    }

    /// Sums `data` element-wise across every rank of the job, in place.
    /// Every rank calls it with a tensor of the same length; the result is
    /// the rank-order sum, bit-identical on every rank (for bf16 and f16,
    /// summed in float32 and rounded once by the switch). `T` must be the
    /// dtype the worker joined with.
    pub fn all_reduce<T: Element>(&mut self, data: &mut [T]) -> Result<(), WorkerError> {
        self.check_dtype::<T>("all_reduce")?;
        let shape = Shape::all_reduce(data.len());
        self.run_shape(shape, None, bytemuck::cast_slice_mut(data))
    }

    /// Reduce-scatter: `input` holds n shards of m elements (n the job's
    /// ranks), shard r for rank r; `output` (m elements) gets this rank's
    /// shard of the element-wise sum over every rank. This rank's own shard
    /// never leaves it (its link carries (n−1)/n of the input): the switch
    /// sums the other ranks in rank order and this rank adds its own last,
    /// rounding once more in bf16/f16 (docs/PROTOCOL.md, "Collective
    /// kinds"), so the bits are reproducible but not those of
    /// [`Worker::all_reduce`]; a `stats = true` job sends every shard and
    /// gets the all-reduce's bits. Only the sum: an
    /// average (FSDP's default) is the caller's division by n, after this
    /// returns (aggswitch.torch divides), so every rank divides the same
    /// bits the same way. Every rank calls it with the same lengths.
    pub fn reduce_scatter<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
    ) -> Result<(), WorkerError> {
        self.check_dtype::<T>("reduce_scatter")?;
        let n = self.cfg.n_workers;
        if input.len() != output.len().saturating_mul(n.into()) {
            return Err(self.wrong_length("reduce_scatter", input.len(), output.len()));
        }
        self.run_shape(
            self.reduce_scatter_shape(output.len()),
            Some(bytemuck::cast_slice(input)),
            bytemuck::cast_slice_mut(output),
        )
    }

    /// This rank's part in a reduce-scatter into shards of `m` elements:
    /// it keeps its own shard ([`Shape::owner_keeps`]) unless the job is
    /// `stats = true`, whose statistics need every rank's gradient at the
    /// switch.
    pub fn reduce_scatter_shape(&self, m: usize) -> Shape {
        let shape = Shape::reduce_scatter(self.cfg.rank, self.cfg.n_workers, m);
        if self.member.session().grad_stats() {
            shape.sending_own_shard()
        } else {
            shape
        }
    }

    /// All-gather: `output` (n·m elements) gets every rank's `input` (m
    /// elements), rank r's at `r·m`, bit for bit (the switch copies whole
    /// elements of the job's size, never converting them). This rank's own
    /// shard is copied locally. Every rank calls it with the same lengths.
    pub fn all_gather<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
    ) -> Result<(), WorkerError> {
        self.check_dtype::<T>("all_gather")?;
        let n = self.cfg.n_workers;
        if output.len() != input.len().saturating_mul(n.into()) {
            return Err(self.wrong_length("all_gather", input.len(), output.len()));
        }
        self.gather(
            input.len(),
            bytemuck::cast_slice(input),
            bytemuck::cast_slice_mut(output),
        )
    }

    /// [`Worker::all_gather`] of raw bytes: the switch copies elements of
    /// the job's size without looking at them, so any data whose length is
    /// a whole number of them can be gathered, e.g. float32 parameters
    /// through a bf16 job (FSDP's mixed precision: parameters gathered in
    /// their own dtype, gradients reduced in the job's). `input` is this
    /// rank's shard, `output` n times its length.
    pub fn all_gather_bytes(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), WorkerError> {
        let size = self.cfg.dtype.size();
        if !input.len().is_multiple_of(size) {
            return Err(WorkerError::NotWholeElements {
                job: self.cfg.job,
                rank: self.cfg.rank,
                bytes: input.len(),
                dtype: self.cfg.dtype,
            });
        }
        if output.len() != input.len().saturating_mul(self.cfg.n_workers.into()) {
            return Err(self.wrong_length("all_gather_bytes", input.len(), output.len()));
        }
        self.gather(input.len() / size, input, output)
    }

    /// All-gather of shards of `m` elements given as wire bytes, lengths
    /// already checked.
    fn gather(&mut self, m: usize, input: &[u8], output: &mut [u8]) -> Result<(), WorkerError> {
        let own = usize::from(self.cfg.rank) * input.len();
        output[own..own + input.len()].copy_from_slice(input);
        let shape = Shape::all_gather(self.cfg.rank, self.cfg.n_workers, m);
        self.run_shape(shape, Some(input), output)
    }

    /// Broadcast: every rank's `data` becomes `root`'s, bit for bit (an
    /// all-gather whose every chunk `root` owns). Every rank calls it with
    /// the same root and length.
    pub fn broadcast<T: Element>(&mut self, root: u16, data: &mut [T]) -> Result<(), WorkerError> {
        self.check_dtype::<T>("broadcast")?;
        if root >= self.cfg.n_workers {
            return Err(WorkerError::BadRoot {
                job: self.cfg.job,
                rank: self.cfg.rank,
                root,
                n: self.cfg.n_workers,
            });
        }
        let shape = Shape::broadcast(self.cfg.rank, root, data.len());
        let data: &mut [u8] = bytemuck::cast_slice_mut(data);
        if root == self.cfg.rank {
            // The root's tensor is only read: it is the input, and its
            // output is empty.
            return self.run_shape(shape, Some(data), &mut []);
        }
        self.run_shape(shape, Some(&[]), data)
    }

    fn check_dtype<T: Element>(&self, call: &'static str) -> Result<(), WorkerError> {
        if T::DTYPE != self.cfg.dtype {
            return Err(WorkerError::WrongDtype {
                job: self.cfg.job,
                rank: self.cfg.rank,
                call,
                tensor: T::DTYPE,
                joined: self.cfg.dtype,
            });
        }
        Ok(())
    }

    fn wrong_length(&self, call: &'static str, input: usize, output: usize) -> WorkerError {
        WorkerError::WrongLength {
            job: self.cfg.job,
            rank: self.cfg.rank,
            call,
            input,
            output,
            n: self.cfg.n_workers,
        }
    }

    /// Runs one collective of `shape` over wire bytes: `input` (None: the
    /// output is also the input, as in an all-reduce) is kept for resends,
    /// RESULT values are copied into `out`.
    fn run_shape(
        &mut self,
        shape: Shape,
        input: Option<&[u8]>,
        out: &mut [u8],
    ) -> Result<(), WorkerError> {
        let len = shape.layout_len();
        let max = (self.member.elems_per_chunk() as usize) * (i32::MAX as usize);
        if len > max {
            return Err(WorkerError::TensorTooLong { len, max });
        }
        if let Some(e) = self.failed {
            return Err(self.session_failed(e));
        }
        if self.data_key_spent {
            return Err(WorkerError::MacNeedsNewJoin {
                job: self.cfg.job,
                rank: self.cfg.rank,
            });
        }
        let collective = self.next_collective;
        let first_seq = self.next_seq;
        let values_len = input.map_or(out.len(), <[u8]>::len);
        // The two kept inputs swap each collective. When they must grow,
        // both grow now (the previous input keeps its bytes), their pages
        // touched here, so the next collective, which writes the other
        // one, faults in none of them: steady state after one collective.
        self.prev_input.reserve(values_len);
        let mut kept = std::mem::take(&mut self.input);
        let elems = usize::from(self.member.elems_per_chunk().max(1));
        let chunks = len.div_ceil(elems);
        match input {
            Some(values) => kept.copy_from(values),
            // In place (an all-reduce): kept chunk by chunk as the threads
            // send (buffers.rs); only its length is set here.
            None => {
                kept.set_len(values_len);
            }
        }
        let mut bits = std::mem::take(&mut self.kept_bits);
        bits.reset(chunks);
        self.set_shares(self.threads_for(chunks as u32));
        self.begin_all(collective, first_seq, shape);
        self.last_grad = None;
        let cur = (collective, first_seq, shape);
        let result = self
            .rejoin_if_due(collective, first_seq)
            .and_then(|resume| match input {
                Some(_) => self.run_collective(
                    cur,
                    resume,
                    Input::Whole(kept.bytes()),
                    Some(Output::new(out)),
                ),
                None => {
                    let chunk_bytes = elems * self.cfg.dtype.size();
                    let (input, out) = Input::in_place(out, kept.bytes_mut(), chunk_bytes, &bits);
                    let r = self.run_collective(cur, resume, input, Some(out));
                    // Also after a failure: a host path redoes the
                    // collective from it (`last_input`).
                    input.finish();
                    r
                }
            });
        self.kept_bits = bits;
        self.last_failed = result.is_err();
        if result.is_ok() {
            // Keep this input as the previous one: another rank may still
            // need this collective's chunks after a restart.
            self.input = std::mem::replace(&mut self.prev_input, kept);
        } else {
            // A collective that failed is nobody's previous one: the last
            // completed collective's input (`prev_collective` names it)
            // stays for a catch-up, or a catch-up would send these values
            // under its seqs. This one stays for `last_input`.
            self.input = kept;
        }
        if result.is_err() && self.auth() == AuthMode::Mac {
            // The next call would tag other data under the same (seq,
            // collective) and key: a GMAC nonce used twice gives its key
            // away. Only a new join (a new DATA key) may send again.
            self.data_key_spent = true;
        }
        result?;
        let cur = self.member.collective();
        let grad = match (self.member.session().grad_stats(), shape.kind()) {
            (false, _) | (true, Kind::AllGather) => Grad::NotSummed,
            // An empty collective has no chunk to carry a trailer: it sums
            // nothing.
            (true, _) if cur.n_chunks() == 0 => Grad::Whole(GradStats {
                ranks: self.cfg.n_workers.into(),
                ..GradStats::default()
            }),
            (true, _) => {
                let shares = std::iter::once(&self.member)
                    .chain(self.lanes[..self.active - 1].iter().map(|l| &l.member));
                // Every chunk has its RESULT, and every RESULT of a stats
                // session its trailer (the old shares' moved to the new
                // ones when the threads changed): one is missing only if
                // it came before the job became stats = true.
                Member::grad_stats_of_shares(&shares.collect::<Vec<_>>())
                    .map_or(Grad::Incomplete, Grad::Whole)
            }
        };
        self.last_grad = Some((collective, grad));
        self.prev_first_seq = first_seq;
        self.prev_collective = Some(collective);
        self.prev_shape = shape;
        self.next_seq = cur.end_seq();
        self.next_collective = collective.wrapping_add(1);
        self.stats.collectives += 1;
        Ok(())
    }

    /// Joins again before collective `collective` (at `first_seq`) if the
    /// session was lost while idle ([`Worker::keepalive`]); returns the
    /// JOIN_ACK's resume point then.
    fn rejoin_if_due(
        &mut self,
        collective: u32,
        first_seq: u32,
    ) -> Result<Option<(u32, u32)>, WorkerError> {
        if !std::mem::take(&mut self.rejoin_due) {
            return Ok(None);
        }
        self.member
            .start_join(collective, first_seq, Instant::now());
        self.join_round().map(Some)
    }

    /// Drives the member's current collective (`cur`: its id, first seq
    /// and shape) to its end, through re-joins; `resume`: a rejoin before
    /// it started gave this resume point.
    fn run_collective(
        &mut self,
        cur: (u32, u32, Shape),
        resume: Option<(u32, u32)>,
        input: Input<'_>,
        out: Option<Output<'_>>,
    ) -> Result<(), WorkerError> {
        let mut pending = resume.map(|(collective, seq)| Event::Resumed { collective, seq });
        loop {
            let ev = match pending.take() {
                Some(ev) => ev,
                None => self.drive_all(input, out)?,
            };
            match ev {
                Event::Completed => return Ok(()),
                Event::Resumed { collective, seq } => {
                    if collective == cur.0 {
                        self.restart_all(seq);
                    } else if Some(collective) == self.prev_collective
                        && serial_offset(self.prev_first_seq, seq) >= 0
                    {
                        self.catch_up_previous(seq)?;
                        // Ours again, from its first chunk.
                        self.set_shares(self.active);
                        self.begin_all(cur.0, cur.1, cur.2);
                    } else {
                        return Err(WorkerError::ResumeOutOfReach {
                            job: self.cfg.job,
                            rank: self.cfg.rank,
                            resume_collective: collective,
                            resume_seq: seq,
                            collective: cur.0,
                        });
                    }
                }
            }
        }
    }

    /// Re-contributes the previous collective from `seq` (another rank lost
    /// its last RESULTs); our own results of it are already delivered.
    fn catch_up_previous(&mut self, seq: u32) -> Result<(), WorkerError> {
        let prev = std::mem::take(&mut self.prev_input);
        let c = self.prev_collective.unwrap_or(0);
        self.set_shares(self.active);
        self.begin_all(c, self.prev_first_seq, self.prev_shape);
        // This rank has every RESULT of it: the chunks before the resume
        // point are owed to nobody (a restarted switch, whose floor is
        // there, would never answer them), those from it on are resent.
        for m in self.shares_mut() {
            m.answered_before(seq);
        }
        self.restart_all(seq);
        let r = loop {
            match self.drive_all(Input::Whole(prev.bytes()), None) {
                Ok(Event::Completed) => break Ok(()),
                Ok(Event::Resumed { collective, seq }) if collective == c => self.restart_all(seq),
                Ok(Event::Resumed { collective, seq }) => {
                    break Err(WorkerError::ResumeOutOfReach {
                        job: self.cfg.job,
                        rank: self.cfg.rank,
                        resume_collective: collective,
                        resume_seq: seq,
                        collective: c,
                    })
                }
                Err(e) => break Err(e),
            }
        };
        self.prev_input = prev;
        r
    }

    /// Drives the collective the shares began to its end over
    /// `self.active` threads, through re-joins (performed here).
    fn drive_all(
        &mut self,
        input: Input<'_>,
        out: Option<Output<'_>>,
    ) -> Result<Event, WorkerError> {
        let t = self.active;
        let sock0 = self.sock.as_raw_fd();
        let fds: Vec<Vec<RawFd>> = (0..t)
            .map(|i| self.lane_socks.fds_of(sock0, i, t))
            .collect();
        if t <= 1 {
            return match self.drive(&fds[0], input, out, None)? {
                Drive::Lost(why) => self.rejoin(why),
                _ => Ok(Event::Completed),
            };
        }
        let mut lanes = std::mem::take(&mut self.lanes);
        let progress = Progress::new(t);
        let job = LaneJob {
            switch: self.cfg.switch,
            dtype: self.cfg.dtype,
            input,
            out,
            progress: &progress,
        };
        let (r0, rest) = std::thread::scope(|s| {
            let handles: Vec<_> = lanes[..t - 1]
                .iter_mut()
                .zip(&fds[1..])
                .enumerate()
                .map(|(i, (lane, fds))| {
                    s.spawn(move || {
                        let r = threads::lane_loop(i + 1, lane, fds, job);
                        if r.is_err() {
                            job.progress.stop();
                        }
                        r
                    })
                })
                .collect();
            let r0 = self.drive(&fds[0], input, out, Some(&progress));
            // Whatever thread 0 saw, the lanes end now (after a completion
            // they have ended already).
            progress.stop();
            let rest: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
            (r0, rest)
        });
        self.lanes = lanes;
        // A lane's failure first: it is why thread 0 stopped.
        for r in rest {
            match r {
                Ok(r) => r?,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        match r0? {
            Drive::Completed => Ok(Event::Completed),
            Drive::Lost(why) => self.rejoin(why),
            Drive::LaneFailed => unreachable!("a lane's error is returned above"),
        }
    }

    /// Thread 0's loop: sends and receives share 0 of the collective on
    /// `fds` (socket 0 and its lanes' sockets), takes every control
    /// message, and watches the lane threads (`progress`) until every share
    /// is complete, the switch loses the session, or a lane fails.
    fn drive(
        &mut self,
        fds: &[RawFd],
        input: Input<'_>,
        out: Option<Output<'_>>,
        progress: Option<&Progress>,
    ) -> Result<Drive, WorkerError> {
        let lanes_done = |p: Option<&Progress>| p.is_none_or(|p| p.lanes_done());
        while !self.member.is_complete() || !lanes_done(progress) {
            if progress.is_some_and(|p| p.stopped()) {
                return Ok(Drive::LaneFailed);
            }
            // Results first: a worker that was not scheduled for a while has
            // RESULTs waiting, and its resend timers must not fire for them.
            // The batch is lent out of `self` for the drain, as
            // `on_datagram` needs the rest of it (the placeholder allocates
            // nothing; the transport, which may replace the batch, is
            // settled at the first join, before any collective).
            debug_assert!(!self.probe_gso, "the transport is settled");
            let mut rxb = std::mem::take(&mut self.rxb);
            let lost = threads::drain(&mut rxb, fds, self.cfg.switch, |d| {
                self.on_datagram(d, input, out, progress)
            });
            self.rxb = rxb;
            if let Some(lost) = lost? {
                return Ok(Drive::Lost(lost));
            }
            let now = Instant::now();
            if !self.member.is_complete() {
                threads::send_share(
                    &mut self.member,
                    &mut self.txb,
                    &mut self.burst,
                    self.sock.as_raw_fd(),
                    input,
                    now,
                )
                .map_err(io_err("sendmmsg", self.cfg.switch))?;
            }
            if self.member.is_complete() && lanes_done(progress) {
                break;
            }
            let now = Instant::now();
            let c = self.member.collective();
            let own = (!c.is_complete())
                .then(|| (c.oldest_unacked_seq(), c.last_progress().unwrap_or(now)));
            let watched = match progress {
                Some(p) => p.watched(own),
                None => own,
            };
            match self.member.handle_timeout_watching(now, watched) {
                Some(MemberEvent::Stalled {
                    collective,
                    seq,
                    waited,
                    waiting,
                }) => {
                    let (missing, upstream) = match waiting {
                        Some(Waiting::Ranks(r)) => (Some(r), None),
                        Some(Waiting::Spine(w)) => (None, Some(w)),
                        None => (None, None),
                    };
                    return Err(WorkerError::Stalled {
                        job: self.cfg.job,
                        rank: self.cfg.rank,
                        collective,
                        seq,
                        waited,
                        missing,
                        upstream,
                    });
                }
                Some(MemberEvent::Failed(e)) => return Err(self.session_failed(e)),
                // The switch made our provisioned job again without us.
                Some(MemberEvent::Rejoining(why)) => return Ok(Drive::Lost(why)),
                _ => {}
            }
            // The lanes' probes go out as share 0's do, one HEARTBEAT each
            // (the session's own probe went with share 0's send).
            if let Some(p) = progress {
                for t in 1..self.active {
                    if let Some(seq) = p.take_probe(t) {
                        self.member.ask_about(seq);
                    }
                }
            }
            // A HEARTBEAT, when the member wants one.
            self.send_control(now)?;
            // Every socket is drained: sleep until a datagram or the next
            // timer (a RESULT that came meanwhile returns at once). At a
            // bottleneck each wake then costs one receive, one send and
            // this poll. Lanes that hold wake this thread at their timers,
            // whose expiry may ask for a probe.
            let own = match self.member.collective().next_timeout() {
                Some(d) if !self.member.is_complete() => Some(d),
                _ => None,
            };
            let lanes = progress
                .filter(|_| self.cfg.transport.straggler_hold)
                .and_then(|p| p.next_lane_wake(now));
            let until = match (own, lanes) {
                (Some(a), Some(b)) => a.min(b).saturating_duration_since(now),
                (Some(a), None) => a.saturating_duration_since(now),
                // Share 0 is complete and the lanes are not: a lane's
                // completion wakes nothing here, so look again soon
                // (the collective ends at most this much after its
                // last share).
                _ if progress.is_some() => Duration::from_millis(1),
                _ => Duration::from_millis(50),
            };
            threads::wait_turn(fds, until);
        }
        Ok(Drive::Completed)
    }

    /// Handles `datagram`, one of thread 0's turn (`input`: the
    /// collective's, for a reduce-scatter's kept shard; `progress`: the
    /// lane threads', which a HEARTBEAT answer about their seq goes to);
    /// the session lost, if the datagram said so.
    fn on_datagram(
        &mut self,
        datagram: &[u8],
        input: Input<'_>,
        out: Option<Output<'_>>,
        progress: Option<&Progress>,
    ) -> Result<Option<Lost>, WorkerError> {
        let now = Instant::now();
        let ev = self.member.handle(datagram, now);
        // A probe, if the datagram made the session ask the switch.
        self.send_control(now)?;
        match ev {
            Some(ev @ MemberEvent::Result { .. }) => {
                threads::write_result(&ev, datagram, self.cfg.dtype, input, out);
                Ok(None)
            }
            Some(MemberEvent::Rejoining(why)) => Ok(Some(why)),
            // A lane's probe answered: its thread holds on it.
            Some(MemberEvent::ShareProbeAnswer { seq, answer }) => {
                if let Some(p) = progress {
                    p.answer(seq, answer, now);
                }
                Ok(None)
            }
            Some(MemberEvent::Failed(SessionError::Refused(NackReason::KindNotSupported))) => {
                Err(WorkerError::KindNotSupported {
                    job: self.cfg.job,
                    rank: self.cfg.rank,
                    kind: self.member.collective().shape().kind(),
                })
            }
            Some(MemberEvent::Failed(e)) => Err(self.session_failed(e)),
            _ => Ok(None),
        }
    }

    /// The member lost its session (`why`) and started joining again: joins
    /// (blocking, as the first join) from the oldest unanswered seq of
    /// every share, and returns the resume point. With one share the
    /// member's own join is that; with more, a lane's hole may lie below
    /// share 0's, and a rejoin from share 0's would leave it below the new
    /// switch's floor (docs/design/worker-threads.md).
    fn rejoin(&mut self, why: Lost) -> Result<Event, WorkerError> {
        let c = self.member.collective();
        let (collective, first) = (c.collective(), c.first_seq());
        let oldest = threads::oldest_seq(
            first,
            std::iter::once(c.oldest_unacked_seq()).chain(
                self.lanes[..self.active - 1]
                    .iter()
                    .map(|l| l.member.collective().oldest_unacked_seq()),
            ),
        );
        tracing::info!(
            job = self.cfg.job,
            rank = self.cfg.rank,
            collective,
            seq = oldest,
            ?why,
            "switch lost our session (restart, re-join or job made again); joining again"
        );
        if self.active > 1 && oldest != c.oldest_unacked_seq() {
            self.member.start_join(collective, oldest, Instant::now());
        }
        let (collective, seq) = self.join_round()?;
        Ok(Event::Resumed { collective, seq })
    }

    /// How often [`Worker::keepalive`] should run while this worker is idle
    /// between collectives: a third of a self-provisioned job's lease, at
    /// most 20 s (docs/PROTOCOL.md, "Leases"). `None` for a declared
    /// job, which has no lease.
    pub fn keepalive_interval(&self) -> Option<Duration> {
        self.member.session().keepalive()
    }

    /// Keeps a self-provisioned job's lease while the caller is idle
    /// between collectives (evaluation, checkpointing): takes what the
    /// switch sent, and sends the keepalive HEARTBEAT when one is due. It
    /// never blocks; call it at least every [`Worker::keepalive_interval`]
    /// (more often is harmless: it sends only when due). A declared job
    /// needs none: this does nothing then but take stray datagrams.
    ///
    /// If the switch lost the job meanwhile (removed, restarted, or made
    /// again by another rank), the next collective joins it again first,
    /// from where this rank stopped; the error is only a socket failure or
    /// a final refusal.
    pub fn keepalive(&mut self) -> Result<(), WorkerError> {
        if let Some(e) = self.failed {
            return Err(self.session_failed(e));
        }
        if self.rejoin_due {
            return Ok(());
        }
        while let Some(n) = self.recv()? {
            match self.member.handle(&self.rx[..n], Instant::now()) {
                Some(MemberEvent::Rejoining(why)) => return self.defer_rejoin(why),
                Some(MemberEvent::Failed(e)) => return Err(self.failed_idle(e)),
                // Late RESULTs of the last collective, HEARTBEAT answers.
                _ => {}
            }
            self.send_control(Instant::now())?;
        }
        let now = Instant::now();
        match self.member.handle_timeout(now) {
            Some(MemberEvent::Rejoining(why)) => return self.defer_rejoin(why),
            Some(MemberEvent::Failed(e)) => return Err(self.failed_idle(e)),
            _ => {}
        }
        self.send_control(now)
    }

    /// The session failed for good while idle: kept, so that the next
    /// collective fails with the same error instead of waiting.
    fn failed_idle(&mut self, e: SessionError) -> WorkerError {
        self.failed = Some(e);
        self.session_failed(e)
    }

    /// The session was lost while idle: the rejoin waits for the next
    /// collective (the other ranks may stay idle longer than a join may
    /// take), which starts it afresh.
    fn defer_rejoin(&mut self, why: Lost) -> Result<(), WorkerError> {
        tracing::info!(
            job = self.cfg.job,
            rank = self.cfg.rank,
            ?why,
            "switch lost our session between collectives; the next collective joins again"
        );
        self.rejoin_due = true;
        Ok(())
    }

    /// Tells the switch this rank is done (best effort; the LEAVE carries a
    /// MAC over the accepted JOIN's nonce, so nobody else can send it).
    pub fn leave(mut self) -> Result<(), WorkerError> {
        match self.member.emit_leave(&mut self.buf) {
            Some(len) => self.send(len),
            None => Ok(()),
        }
    }

    /// [`Worker::leave`] for a member whose job goes on without the switch,
    /// on the host path: the LEAVE says so (`LEAVE_FOR_HOSTS`), and a switch
    /// that is still alive counts it (`members_left_for_hosts`).
    pub fn leave_for_hosts(mut self) -> Result<(), WorkerError> {
        match self.member.emit_leave_for_hosts(&mut self.buf) {
            Some(len) => self.send(len),
            None => Ok(()),
        }
    }
}

pub(crate) fn open_socket(cfg: &WorkerConfig) -> io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    // ECT(0): the switch ORs CE marks into its RESULTs (docs/PROTOCOL.md).
    s.set_tos(0x02)?;
    // Bursts of a whole window of RESULTs arrive at once: 256 RESULTs need
    // more than the default net.core.rmem_max (208 KiB) allows.
    sockets::size_buffers(&s, 8 << 20);
    let bind = cfg
        .bind
        .unwrap_or(SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0));
    if cfg.threads != 1 {
        // Lane sockets join this port's group (docs/design/
        // worker-threads.md); the kernel lets only this user's sockets in.
        s.set_reuse_port(true)?;
    }
    s.bind(&bind.into())?;
    s.connect(&cfg.switch.into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::wire::{flags, HeaderRepr};

    fn answer(flags: u8, count: u16, payload: &[u8]) -> Waiting {
        let mut h = HeaderRepr::new(MsgType::Heartbeat, 1);
        h.flags = flags;
        h.count = count;
        Waiting::parse(&h, payload)
    }

    /// A kernel that refuses UDP GSO: a forced udp-gso is an error naming
    /// the call and the fix; auto goes on (with mmsg).
    #[test]
    fn a_refused_gso_fails_a_forced_udp_gso_and_lets_auto_fall_back() {
        let mut cfg = WorkerConfig::new("198.18.0.1:48879".parse().unwrap(), 1, 0, 2, [0; 32]);
        let eio = || io::Error::from_raw_os_error(libc::EIO);
        cfg.transport_kind = TransportKind::UdpGso;
        let e = Worker::gso_refused(&cfg, "sendmsg(UDP_SEGMENT)", eio())
            .expect_err("forced udp-gso cannot fall back")
            .to_string();
        for want in [
            "sendmsg(UDP_SEGMENT) failed",
            "198.18.0.1:48879",
            "transport \"udp-gso\" cannot work here",
            "transmit checksum offload off",
            "ethtool -K DEV tx on",
        ] {
            assert!(e.contains(want), "{want:?} missing from: {e}");
        }
        let old = Worker::gso_refused(
            &cfg,
            "setsockopt(UDP_GRO)",
            io::Error::from_raw_os_error(libc::ENOPROTOOPT),
        )
        .expect_err("forced udp-gso cannot fall back")
        .to_string();
        assert!(old.contains("lacks UDP GSO/GRO"), "{old}");
        cfg.transport_kind = TransportKind::Auto;
        assert!(Worker::gso_refused(&cfg, "sendmsg(UDP_SEGMENT)", eio()).is_ok());
    }

    /// A leaf's HEARTBEAT answer becomes an error that names the spine and
    /// says what to do; an ordinary answer names the ranks.
    #[test]
    fn stall_errors_name_what_the_chunk_waits_for() {
        let spine = |silent_ms: u32, leaves: &[u16]| {
            let mut p = vec![0u8; proto::wire::UPSTREAM_WAIT_LEN];
            proto::wire::UpstreamWaitPayload {
                spine_ip: [198, 19, 255, 2],
                spine_port: 48879,
                tree: 1,
                silent_ms,
                session: proto::wire::SpineSessionState::Joined,
            }
            .emit(&mut p)
            .unwrap();
            p.extend(leaves.iter().flat_map(|l| l.to_be_bytes()));
            let Waiting::Spine(w) = answer(flags::UPSTREAM, leaves.len() as u16, &p) else {
                panic!("a spine answer")
            };
            stall_reason(None, Some(&w))
        };
        let dead = spine(4200, &[]);
        assert!(dead.contains("spine 198.19.255.2:48879 (tree 1), silent for 4.2 s"));
        assert!(dead.contains("dead or unreachable"));
        let never = spine(proto::wire::UpstreamWaitPayload::NEVER, &[]);
        assert!(never.contains("never heard from"), "{never}");
        let waits = spine(100, &[0, 3]);
        assert!(waits.contains("waits for leaves [0, 3]"), "{waits}");
        let lost = spine(100, &[]);
        assert!(lost.contains("RESULTs are being lost"), "{lost}");
        let refused = stall_reason(
            None,
            Some(&SpineWait {
                spine: "198.19.255.1:48879".parse().unwrap(),
                tree: 0,
                silent_for: Some(Duration::ZERO),
                leaves: vec![],
                refused: Some(proto::wire::SpineRefusal::Nack(NackReason::BadSecret)),
            }),
        );
        assert!(
            refused.contains("cannot join spine 198.19.255.1:48879 (tree 0): bad secret"),
            "{refused}"
        );
        // A spine that will not provision a tree's self-provisioned job
        // names the quota its tenant hit.
        let quota = stall_reason(
            None,
            Some(&SpineWait {
                spine: "198.19.255.1:48879".parse().unwrap(),
                tree: 0,
                silent_for: Some(Duration::ZERO),
                leaves: vec![],
                refused: Some(proto::wire::SpineRefusal::ProvisionQuota(
                    proto::wire::Quota::MaxWorkersPerJob,
                )),
            }),
        );
        assert!(
            quota.contains("quota max_workers_per_job")
                && quota.contains("fix the tenant on the spine"),
            "{quota}"
        );

        let Waiting::Ranks(r) = answer(0, 2, &[0, 1, 0, 4]) else {
            panic!("ranks")
        };
        assert_eq!(r, [1, 4]);
        assert!(stall_reason(Some(&r), None).contains("waiting for ranks [1, 4]"));
        assert!(stall_reason(None, None).contains("did not answer heartbeats"));
    }
}
