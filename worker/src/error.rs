//! The worker library's errors: [`WorkerError`], why a join, a collective
//! or the socket failed, and [`GradStatsError`], why
//! [`Worker::gradient_stats`](crate::Worker::gradient_stats) has nothing to
//! give; then the helpers their messages are written with.
//!
//! Owns: the messages, each naming the job and rank where the worker knows
//! them and, where there is one, the fix: a failed rank's log should be
//! enough to act on.

use std::io;
use std::net::SocketAddrV4;
use std::time::Duration;

use proto::handshake::{ChallengeError, JoinAckError};
use proto::member::SpineWait;
use proto::provisioner::ProvisionError;
use proto::wire::{Dtype, Kind, NackReason};

use crate::threads::SocketFailed;

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

/// Why [`Worker::gradient_stats`](crate::Worker::gradient_stats) has no
/// statistics to give.
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

#[cfg(test)]
mod tests {
    use super::*;
    use proto::member::Waiting;
    use proto::wire::{flags, HeaderRepr, MsgType};

    fn answer(flags: u8, count: u16, payload: &[u8]) -> Waiting {
        let mut h = HeaderRepr::new(MsgType::Heartbeat, 1);
        h.flags = flags;
        h.count = count;
        Waiting::parse(&h, payload)
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
