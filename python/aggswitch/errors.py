"""Exceptions raised by aggswitch.

Every error of the worker library arrives as one of these, carrying the
library's message (which names the job, the rank and what to do).
"""

from __future__ import annotations


class AggSwitchError(Exception):
    """Base class of every aggswitch error."""


class RefusedError(AggSwitchError):
    """The switch refused this worker (a NACK).

    ``reason`` is one of ``"unknown_job"``, ``"bad_secret"``,
    ``"source_not_allowed"``, ``"rank_out_of_range"``,
    ``"parameters_differ"``, ``"malformed"``, ``"stale_nonce"``,
    ``"kind_not_supported"`` (a reduce-scatter or all-gather through an
    aggregation tree, which serves all-reduce only); for a self-provisioned
    job also ``"unknown_tenant"`` and ``"quota_exceeded"`` (a
    ``QuotaError``). ``"bad_secret"`` there means the tenant key.
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class QuotaError(RefusedError):
    """The switch refused to create a self-provisioned job: the tenant is
    at one of its quotas. ``quota`` names it (``"max_jobs"``,
    ``"max_workers_per_job"``, ``"max_pool_bytes"``, ``"dtypes"``,
    ``"auth"``, ``"max_priority"``, ``"job_ids"`` or the switch's
    ``"pool_memory_mib"``); the message says what to do. ``reason`` is
    ``"quota_exceeded"``."""

    def __init__(self, message: str, reason: str, quota: str) -> None:
        super().__init__(message, reason)
        self.quota = quota


class JoinTimeoutError(AggSwitchError, TimeoutError):
    """No JOIN_ACK in time: the switch is unreachable, the job is not
    declared, or not every rank has started."""


class StalledError(AggSwitchError, TimeoutError):
    """A collective made no progress for ``stall_timeout`` seconds.

    ``missing_ranks`` lists the ranks the switch is still waiting for (a dead
    or stuck peer), ``[]`` when the switch has everything (RESULTs are being
    lost), or ``None`` when the switch did not answer at all.

    In an aggregation tree, the worker's leaf switch may instead say the chunk
    waits for a spine: ``spine`` is that switch's ``"ip:port"``,
    ``spine_silent_for`` how many seconds it had been silent (``None`` if the
    leaf never heard from it; a dead spine shows several seconds), and
    ``missing_leaves`` the leaves the spine said it waits for. All three are
    ``None`` when the stall is not at a spine.
    """

    def __init__(
        self,
        message: str,
        missing_ranks: list[int] | None,
        collective: int,
        seq: int,
        spine: str | None = None,
        spine_silent_for: float | None = None,
        missing_leaves: list[int] | None = None,
    ) -> None:
        super().__init__(message)
        self.missing_ranks = missing_ranks
        self.collective = collective
        self.seq = seq
        self.spine = spine
        self.spine_silent_for = spine_silent_for
        self.missing_leaves = missing_leaves


class SwitchRestartedError(AggSwitchError):
    """The switch restarted and resumes at a point this worker no longer has
    the input for; the job cannot continue without restarting its ranks."""


class TransportError(AggSwitchError, OSError):
    """A socket call to the switch failed; ``errno`` is the OS error number
    when there is one."""

    def __init__(self, message: str, errno: int | None) -> None:
        AggSwitchError.__init__(self, message)
        self.errno = errno

    def __str__(self) -> str:
        return str(self.args[0])


class ProtocolError(AggSwitchError):
    """The switch answered with parameters this worker cannot use."""


class GradientStatsError(AggSwitchError):
    """``Worker.gradient_stats()`` has nothing to give; ``reason`` says why:

    * ``"not_a_stats_job"``: the job is not declared with ``stats = true``,
      so the switch measures nothing;
    * ``"no_collective"``: no collective has completed on this worker yet,
      or the last one failed;
    * ``"not_summed"``: the last collective was an all-gather or broadcast,
      which sums nothing;
    * ``"incomplete"``: the last collective was summed, but the switch
      restarted during it with the job newly declared ``stats = true``, so
      its chunks summed before the restart were never measured; the next
      collective's statistics are whole. (A restart of a job that was
      ``stats = true`` all along keeps them whole.)
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


__all__ = [
    "AggSwitchError",
    "RefusedError",
    "QuotaError",
    "JoinTimeoutError",
    "StalledError",
    "SwitchRestartedError",
    "TransportError",
    "ProtocolError",
    "GradientStatsError",
]
