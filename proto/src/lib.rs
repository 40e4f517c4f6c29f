//! The aggregation protocol (version 4, docs/PROTOCOL.md), with no I/O.
//!
//! * [`wire`]: header views and payload codecs for every message type.
//! * [`dtype`]: the element types of payloads (float32, bf16, f16); the
//!   bottom layer, re-exported by [`wire`].
//! * [`switch`]: the switch's job table and slot pools, fed datagrams and
//!   time; it queues the replies the I/O shells send.
//! * [`auth`]: the HMAC-SHA256 of the JOIN handshake and the switch's nonces.
//! * [`checksum`]: the Internet checksum of IPv4 headers and UDP datagrams.
//! * [`tag`]: per-packet tags of `auth = "mac"` jobs (AES-GMAC) and of JOIN_ACKs.
//! * [`handshake`]: the worker's side of joining (HELLO, CHALLENGE, JOIN).
//! * [`session`]: a worker's membership (join, NACKs, rejoin, heartbeats,
//!   the stall decision), fed datagrams and time; it queues what to send.
//! * [`member`]: one worker's member of a job: its session, the collective
//!   in progress (chunking, window, retransmission), RTT, DCTCP and the
//!   advertised window, fed datagrams and time; it writes whole DATA frames.
//! * [`reference`]: the rank-order sum every result must equal bit for bit.
//! * [`host_sum`]: the same sums done on a host, for the host path (a
//!   collective finished without the switch, with its bits).
//! * [`stats`]: a `stats = true` job's gradient statistics: the trailer and
//!   the reference float64 order.
//! * [`provision`]: tenant and job names and the cryptography of
//!   self-provisioned jobs (the derived job secret, the PROVISION MAC).
//! * [`provisioner`]: the requester's side of provisioning (ask, claim,
//!   PROVISIONED or a typed refusal), fed datagrams and time.
//! * [`secret`]: a job secret from a file, the environment or an argument,
//!   and the weak-secret rule.
//!
//! Layers: a file imports only from files below it. Bottom to top:
//! [`dtype`], [`simd`], [`seq`], [`checksum`]; [`elements`]; [`wire`] and
//! [`reference`](mod@reference); [`tag`], [`auth`], [`provision`], [`secret`], [`stats`];
//! the state machines ([`handshake`], [`provisioner`], [`host_sum`], [`session`],
//! [`member`], [`switch`]), each above what it uses.
//!
//! Everything here is deterministic: time is passed in, nothing is read from
//! the system, so loss, duplication and reordering are tested without sockets.
#![deny(unsafe_code)]

pub mod auth;
pub mod checksum;
pub mod dtype;
pub mod elements;
pub mod handshake;
pub mod host_sum;
pub mod member;
pub mod provision;
pub mod provisioner;
pub mod reference;
pub mod secret;
pub mod seq;
pub mod session;
pub mod simd;
pub mod stats;
pub mod switch;
pub mod tag;
pub mod wire;
