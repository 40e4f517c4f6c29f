//! Counters of the switch's protocol state, declared once with their help
//! text ([`crate::counter_schema!`]): switchctl, `/metrics` and the stats file are
//! all rendered from [`CounterSchema::visit`], so a counter added here shows
//! everywhere, under one name.
//!
//! Owns: [`DropReason`] (why a message that reached a job was dropped),
//! [`JobCounters`] (per job) and [`TableCounters`] (the switch's, for
//! messages that reached no job, and the handshake's replies).
//!
//! Invariants: counters only grow; a message is counted at most once per
//! family (a dropped DATA is one drop, under one reason).

/// Renders counters without knowing their names: `visit` calls `f(name,
/// help, value)` for each, in declaration order.
pub trait CounterSchema {
    fn visit(&self, f: &mut dyn FnMut(&'static str, &'static str, u64));
}

/// Declares a struct of `u64` counters, each with its help text, and
/// implements [`CounterSchema`] and `add` (sum of two snapshots) for it.
#[macro_export]
macro_rules! counter_schema {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[doc = $doc:literal])+ $field:ident,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct $name {
            $($(#[doc = $doc])+ pub $field: u64,)*
        }
        impl $name {
            /// Adds `o`'s counts to these.
            pub fn add(&mut self, o: &$name) {
                $(self.$field += o.$field;)*
            }
            /// Calls `f(name, counter)` for each counter, in declaration
            /// order (tests set every counter without naming them).
            pub fn visit_mut(&mut self, f: &mut dyn FnMut(&'static str, &mut u64)) {
                $(f(stringify!($field), &mut self.$field);)*
            }
        }
        impl $crate::switch::counters::CounterSchema for $name {
            fn visit(&self, f: &mut dyn FnMut(&'static str, &'static str, u64)) {
                $(f(stringify!($field), concat!($($doc),+).trim_ascii(), self.$field);)*
            }
        }
    };
}

counter_schema! {
    /// A leaf's traffic with one spine (one tree of its job).
    pub struct SpineCounters {
        /// Partial sums sent to this spine (first sends).
        partials_sent,
        /// Partial sums sent again (the spine's RESULT was late).
        partials_resent,
        /// RESULTs taken from this spine.
        results,
        /// HEARTBEATs sent to it about a partial that waited.
        heartbeats_sent,
        /// JOINs it refused (or answered with a job unlike ours).
        refusals,
        /// NACKs and RESULTs of another generation from its address that
        /// were not authenticated (ignored: docs/PROTOCOL.md, "Sessions").
        unauthenticated,
        /// HELLOs sent to ask whether it restarted, after those.
        probes_sent,
        /// Probes answered under the session's generation: the trigger was
        /// spoofed.
        spoofed_triggers,
        /// Probes answered under a new generation: it restarted; rejoined.
        probed_restarts,
        /// RESULTs of its generation whose token did not verify (forged, or
        /// from its previous activation): ignored.
        bad_tokens,
        /// Rounds of provisioning a self-provisioned job on it (PROVISION
        /// ask, claim: docs/PROTOCOL.md, "Tenants and self-provisioned
        /// jobs", Trees): the first, after its restart, after a refusal.
        provisions,
    }
}

/// Why a message that reached a job was dropped, one counter each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(usize)]
pub enum DropReason {
    /// This rank's contribution to this seq was already taken.
    Duplicate = 0,
    /// Older than the slot's shadow copy: nothing left to answer with.
    Stale,
    /// A newer seq for a slot that still aggregates an older one.
    SlotBusy,
    /// `count` differs from the slot's (or exceeds the job's chunk size).
    CountMismatch,
    /// `collective` differs from the slot's.
    CollectiveMismatch,
    /// seq − floor ≥ window.
    BeyondWindow,
    /// Source MAC/IP/port is not the rank's recorded one.
    SourceMismatch,
    /// rank ≥ n_workers.
    RankOutOfRange,
    /// Job is not active (answered with NACK 6 only at the rank's bound
    /// member: its source and switch port).
    NotActive,
    /// `gen` is not the switch's (answered with NACK 7 when allowed).
    StaleGeneration,
    /// Source outside the job's prefixes, on a message that needs membership.
    SourceNotAllowed,
    /// A message type the switch does not take (RESULT, JOIN_ACK, NACK,
    /// CHALLENGE).
    UnexpectedType,
    /// A LEAVE whose MAC does not verify.
    Unauthenticated,
    /// A DATA payload that is not `count` elements of the job's dtype (a
    /// worker of another element size, or, in an `auth = "mac"` job, a
    /// payload without its tag).
    PayloadLength,
    /// DATA, HEARTBEAT or LEAVE with a member's source (MAC, IP, UDP port)
    /// that arrived on another switch port than its JOIN: spoofed.
    WrongPort,
    /// An `auth = "mac"` job's DATA whose tag does not verify under the
    /// member's DATA key: never summed.
    BadTag,
    /// A DATA whose kind, owner or `count` differs from what its seq's
    /// first DATA named (a reduce-scatter or all-gather; an all-reduce's
    /// other count is `CountMismatch`), whose owner is not a rank, or that
    /// carries values where its kind wants none or none where it wants
    /// them (docs/PROTOCOL.md, "Collective kinds").
    KindMismatch,
    /// A reduce-scatter or all-gather DATA to a leaf or a spine: trees
    /// serve all-reduce alone (answered with NACK 10).
    KindNotSupported,
}

impl DropReason {
    pub const COUNT: usize = 18;
    pub const ALL: [DropReason; DropReason::COUNT] = [
        DropReason::Duplicate,
        DropReason::Stale,
        DropReason::SlotBusy,
        DropReason::CountMismatch,
        DropReason::CollectiveMismatch,
        DropReason::BeyondWindow,
        DropReason::SourceMismatch,
        DropReason::RankOutOfRange,
        DropReason::NotActive,
        DropReason::StaleGeneration,
        DropReason::SourceNotAllowed,
        DropReason::UnexpectedType,
        DropReason::Unauthenticated,
        DropReason::PayloadLength,
        DropReason::WrongPort,
        DropReason::BadTag,
        DropReason::KindMismatch,
        DropReason::KindNotSupported,
    ];

    /// Stable name, for counters and metrics.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Duplicate => "duplicate",
            DropReason::Stale => "stale",
            DropReason::SlotBusy => "slot_busy",
            DropReason::CountMismatch => "count_mismatch",
            DropReason::CollectiveMismatch => "collective_mismatch",
            DropReason::BeyondWindow => "beyond_window",
            DropReason::SourceMismatch => "source_mismatch",
            DropReason::RankOutOfRange => "rank_out_of_range",
            DropReason::NotActive => "not_active",
            DropReason::StaleGeneration => "stale_generation",
            DropReason::SourceNotAllowed => "source_not_allowed",
            DropReason::UnexpectedType => "unexpected_type",
            DropReason::Unauthenticated => "unauthenticated",
            DropReason::PayloadLength => "payload_length",
            DropReason::WrongPort => "wrong_port",
            DropReason::BadTag => "bad_tag",
            DropReason::KindMismatch => "kind_mismatch",
            DropReason::KindNotSupported => "kind_not_supported",
        }
    }
}

counter_schema! {
    /// Counters of one job.
    pub struct JobCounters {
        /// Chunks whose sum completed.
        chunks_completed,
        /// Payload bytes (of the job's dtype) taken into sums.
        bytes_aggregated,
        /// DATA messages taken into a slot.
        contributions,
        /// RESULT messages handed to the transmit path.
        results_sent,
        /// RESULTs sent again from a shadow copy to a rank that lost one.
        retransmits_served,
        /// Chunks whose RESULT carried ECE.
        ece_marked,
        /// Chunks completed while a job of a higher class was busy: their
        /// RESULTs carry ECE and the yield window (counted in `ece_marked`
        /// too).
        priority_marked,
        /// JOIN messages received (any outcome).
        joins,
        /// HELLOs answered with a CHALLENGE.
        challenges,
        /// JOINs whose MAC did not verify (wrong secret or forged).
        join_bad_mac,
        /// JOINs whose nonce this switch did not issue to that rank and address.
        join_bad_nonce,
        /// JOINs whose nonce was older than the nonce lifetime.
        join_stale_nonce,
        /// Copies of a rank's accepted JOIN (its own resends, or a replay): state unchanged.
        join_repeats,
        /// JOINs with a nonce older than the rank's accepted one (replays): dropped, unanswered.
        join_replays,
        /// NACKs sent for this job.
        nacks,
        /// Times the job became active (every rank joined).
        activations,
        /// Members that left to go on with the job on the host path (a
        /// LEAVE with count 1: aggswitch.torch's fallback after a collective
        /// failed here); each rank of a job that falls back counts once.
        members_left_for_hosts,
        /// Times an active job went back to joining because a rank re-joined.
        resets,
        /// A restarted leaf switch re-joined keeping its place (no reset).
        rejoins_in_place,
        /// A leaf's partial sums sent up to their spine (first sends).
        partials_sent,
        /// A leaf's partial sums sent again (their spine's RESULT was late).
        partials_resent,
    }
}

/// Drops of one job, by reason (a labelled family beside [`JobCounters`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobDrops(pub [u64; DropReason::COUNT]);

impl JobDrops {
    pub fn count(&self, r: DropReason) -> u64 {
        self.0[r as usize]
    }
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
    pub fn bump(&mut self, r: DropReason) {
        self.0[r as usize] += 1;
    }
}

/// Kinds of malformed aggregation messages, one counter each.
pub const MALFORMED_KINDS: [&str; 6] = [
    "truncated",
    "bad_version",
    "unknown_type",
    "reserved_flags",
    "zero_job",
    "payload_length",
];

counter_schema! {
    /// Counters of the job table: messages that reached no job, and replies.
    pub struct TableCounters {
        /// Messages for a job that is not declared (or was removed).
        unknown_job,
        /// Messages of a type the switch does not take.
        unexpected_type,
        /// JOINs of protocol version 1, refused with a version-1 NACK.
        version_refused,
        /// RESULTs handed to the transmit path.
        results_sent,
        /// JOIN_ACKs handed to the transmit path.
        join_acks_sent,
        /// CHALLENGEs handed to the transmit path.
        challenges_sent,
        /// NACKs handed to the transmit path.
        nacks_sent,
        /// Replies dropped because the reply queue was full (the worker resends).
        reply_queue_full,
        /// Log events dropped because the event queue was full (counters stay exact).
        events_dropped,
        /// HELLOs dropped unanswered: their source (address and switch port)
        /// sent more than its rate allows.
        hello_rate_limited,
        /// NACKs not sent: their destination (address and switch port) was
        /// sent more than its rate allows.
        nack_rate_limited,
        /// PROVISION asks answered with a CHALLENGE.
        provision_challenges,
        /// Jobs created by a tenant's PROVISION claim.
        provisioned_jobs,
        /// PROVISIONED answers to claims of a job that existed already
        /// (another rank's, or a resend).
        provision_repeats,
        /// PROVISION asks and claims refused (a NACK 2, 3, 5, 7, 8, 9, 11 or
        /// 12, sent unless the source's rate is spent).
        provision_refused,
        /// Provisioned jobs removed because every member left.
        jobs_ended_left,
        /// Provisioned jobs removed because their idle lease ran out.
        jobs_ended_lease,
    }
}
