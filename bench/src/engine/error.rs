//! [`EngineError`]: every way an engine benchmark run fails, in its setup
//! (the spec, declaring the jobs, joining the ranks) or in what the engine
//! answered (a wrong or lost RESULT, a refused DATA, a stuck window). A run
//! that fails reports no number.

use proto::switch::{JoinOutcome, Reply, Verdict};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(
        "backend {backend} is not built yet: the lock-free DATA path of issue 21 plugs in at \
         bench/src/engine/backend.rs, fn lock_free; measure --backend table-lock meanwhile"
    )]
    NotBuilt { backend: &'static str },
    #[error("invalid benchmark parameters: {0}")]
    Spec(String),
    #[error("setup: JobTable::add of job {job}: {why}")]
    AddJob { job: u16, why: String },
    #[error("setup: the JOIN of job {job} rank {rank} got {verdict:?}, not {want:?}")]
    Join {
        job: u16,
        rank: u16,
        verdict: Verdict,
        want: JoinOutcome,
    },
    #[error("setup: the HELLO of job {job} rank {rank} was not answered with a CHALLENGE")]
    NoChallenge { job: u16, rank: u16 },
    #[error(
        "backend {backend}: wrong RESULT of job {job} seq {seq} to rank {rank}: {what} \
         (the rank-order reference sum differs)"
    )]
    WrongResult {
        backend: &'static str,
        job: u16,
        seq: u32,
        rank: u16,
        what: String,
    },
    #[error("backend {backend}: {count} DATA refused (first: {first:?}); the harness feeds only in-window, fresh DATA")]
    Refused {
        backend: &'static str,
        count: u64,
        first: Verdict,
    },
    #[error("backend {backend}: {count} replies other than RESULT, or that failed to encode (first: {first:?})")]
    UnexpectedReply {
        backend: &'static str,
        count: u64,
        first: Option<Reply>,
    },
    #[error(
        "backend {backend}: {results} RESULTs encoded for {seqs} completed seqs of {ranks} ranks \
         each: fan-out lost or duplicated RESULTs"
    )]
    ResultCount {
        backend: &'static str,
        results: u64,
        seqs: u64,
        ranks: u16,
    },
    #[error(
        "backend {backend}: job {job}: a window stuck at seq {seq} for {secs:.1} s: {encoded} \
         of the {ranks} RESULTs it counts were encoded (a RESULT was lost)"
    )]
    WindowStuck {
        backend: &'static str,
        job: u16,
        seq: u32,
        encoded: u32,
        ranks: u16,
        secs: f64,
    },
    #[error(
        "backend {backend}: job {job} seq {seq} could not be handed to a thread that sends \
         its RESULTs (outbox full)"
    )]
    HandOffRefused {
        backend: &'static str,
        job: u16,
        seq: u32,
    },
    #[error("backend {backend}: no seq completed in the run; run longer (--seconds)")]
    NothingCompleted { backend: &'static str },
}
