//! What a worker is told: how to reach the switch and which job to join
//! ([`WorkerConfig`]), and the element types a job's tensors may have
//! ([`Element`]).
//!
//! Owns: the configuration only (the session it leads to is the
//! [`Worker`](crate::Worker)'s). Invariants: its `Debug` never prints the
//! secret; an [`Element`]'s wire encoding is its little-endian memory.

use std::net::SocketAddrV4;
use std::time::Duration;

use proto::member::TransportConfig;
use proto::provisioner::ProvisionSpec;
use proto::wire::{Dtype, SECRET_LEN};

use crate::gso::TransportKind;

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
    /// this process may use
    /// ([`auto_threads`](crate::threads::auto_threads)); 1 is one thread
    /// and one socket, as before lane replies existed. More than one needs a
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
