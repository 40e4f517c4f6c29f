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

// `Worker` is defined here; its methods live by concern in join (the
// session: join, re-join, control messages, leave), collectives (the
// public calls and the inputs they keep), drive (one collective over T
// threads, through re-joins), keepalive (idle between collectives) and
// report (what it tells about itself). The types they share sit below
// them: config, error, stats.
pub mod buffers;
mod collectives;
mod config;
mod drive;
mod error;
pub mod gso;
mod join;
mod keepalive;
pub mod loopback;
pub mod mmsg;
pub mod probe;
mod report;
mod sockets;
mod stats;
pub mod threads;

use std::net::UdpSocket;

pub use proto::handshake::JoinAckError;
pub use proto::member::SpineWait;
use proto::member::{Member, Shape};
pub use proto::provisioner::{ProvisionError, ProvisionSpec};
use proto::session::SessionError;
pub use proto::stats::GradStats;
pub use proto::tag::AuthMode;
pub use proto::wire::Kind;

use crate::buffers::{KeptBits, KeptInput};
pub use crate::config::{Element, WorkerConfig};
pub use crate::error::{GradStatsError, WorkerError, SPINE_SILENT};
pub use crate::gso::TransportKind;
use crate::mmsg::DatagramBatch;
pub use crate::sockets::wait_readable;
use crate::stats::Grad;
pub use crate::stats::WorkerStats;
use crate::threads::{Lane, LaneSockets};

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
