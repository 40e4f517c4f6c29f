"""Where an ``AggSwitchState``'s collectives run: on the switch, or on the
host path (``_hosts``), and the agreement that moves every rank between the
two at the same collective.

Owns: the state's path (switch or hosts), its counters, the host path's
own gloo process group, and the prober thread that watches for the switch
while the job runs without it.

The agreement (``fallback`` on, the default): after every collective tried
on the switch, every rank sends its outcome (0: done) to every other rank
on the host group, one all-to-all of int32s. If every outcome is 0 the
collective is done. Otherwise **every** rank finishes that same
collective on the host path, from its own input (an all-reduce restores
it from the worker library's copy, since RESULTs already overwrote part of
the buffer; ranks that had all their RESULTs recompute the same bits), and
the job stays on the host path. So no rank moves on while another is
stuck, no gradient is counted twice or lost, and the bits are the switch's
either way.

Before a join (the first collective, or a return), every rank probes the
switch with a HELLO (``_native.probe_switch``) and the ranks agree on the
answers first, so a dead switch costs seconds, not the join timeout, and no
rank waits in a join the others never start. While on the host path a
thread probes every ``probe_interval`` seconds; at each collective the
ranks agree on their latest answers, and once every rank has seen the
switch alive they join again and run that collective on it.

Invariants: every method here runs on the state's one background thread,
in the order the ranks issue collectives (the same on every rank), so the
host group's collectives pair up; the host group carries nothing else.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from . import _hosts, _native
from .errors import (
    AggSwitchError,
    GradientStatsError,
    JoinTimeoutError,
    ProtocolError,
    RefusedError,
    StalledError,
    SwitchRestartedError,
    TransportError,
)

_log = logging.getLogger("aggswitch.torch")

# A rank's outcome in a vote (index = rank in the host group); a refusal
# carries its reason: _REFUSED + the index in _REASONS.
_OK, _STALLED, _UNREACHABLE, _JOINING, _RESTARTED, _TRANSPORT, _OTHER = range(7)
_REFUSED = 16
_REASONS = [
    "unknown_job", "bad_secret", "source_not_allowed", "rank_out_of_range", "parameters_differ",
    "malformed", "stale_nonce", "kind_not_supported", "quota_exceeded", "unknown_tenant",
]
_OUTCOME = {
    _STALLED: "stalled",
    _UNREACHABLE: "the switch did not answer",
    _JOINING: "still joining",
    _RESTARTED: "the switch restarted past the resume point",
    _TRANSPORT: "socket error",
    _OTHER: "protocol error",
}

# A join waits for every rank; the ranks vote on how far theirs got every
# this many seconds, so a rank refused at once (a wrong secret) is known to
# every rank within one interval, not after the whole join timeout.
_JOIN_SLICE = 2.0

# How long the probe before a join waits for the switch's CHALLENGE (its
# HELLO is resent every 200 ms): a switchd starved of CPU on a loaded host
# was seen to take 4 s, and a dead switch costs this once, at start.
_START_PROBE = 5.0


def _refusal_code(reason: Any) -> int:
    """A refusal's outcome in a vote: _REFUSED + its reason's index."""
    return _REFUSED + (_REASONS.index(reason) if reason in _REASONS else len(_REASONS))


def _outcome(e: BaseException) -> int:
    if isinstance(e, RefusedError):
        return _refusal_code(getattr(e, "reason", ""))
    for cls, code in (
        (StalledError, _STALLED),
        (JoinTimeoutError, _UNREACHABLE),
        (SwitchRestartedError, _RESTARTED),
        (TransportError, _TRANSPORT),
        (ProtocolError, _OTHER),
    ):
        if isinstance(e, cls):
            return code
    return _OTHER


def _describe(code: int) -> str:
    if code >= _REFUSED:
        i = code - _REFUSED
        return "refused by the switch: " + (_REASONS[i] if i < len(_REASONS) else "another reason")
    return _OUTCOME.get(code, "failed")


def _others_error(job: int, rank: int, codes: list[int], what: str) -> AggSwitchError:
    """The error a rank raises when *other* ranks failed (fail-fast): it names
    them and why, typed as the first one's failure."""
    failed = [(r, c) for r, c in enumerate(codes) if c not in (_OK, _JOINING)]
    text = "; ".join(f"rank {r}: {_describe(c)}" for r, c in failed)
    msg = f"job {job} rank {rank}: {what} failed for other ranks ({text}); their own errors say what to fix"
    first = failed[0][1] if failed else _UNREACHABLE
    if first >= _REFUSED:
        i = first - _REFUSED
        return RefusedError(msg, _REASONS[i] if i < len(_REASONS) else "other")
    if first == _UNREACHABLE:
        return JoinTimeoutError(msg)
    if first == _STALLED:
        return StalledError(msg, None, -1, -1)
    return AggSwitchError(msg)


class _BackgroundJoin:
    """One ``Worker`` join on a thread of its own, so the state's thread can
    vote while it waits. Abandoned (the ranks agreed to give up), a worker
    that still gets in later is closed at once."""

    def __init__(self, state: Any, group: Any, timeout: float) -> None:
        from . import Worker

        rank, n = state._resolve(group)
        options = dict(state._options, join_timeout=timeout)
        self._lock = threading.Lock()
        self._worker: Any = None
        self._error: BaseException | None = None
        self._abandoned: bool | None = None  # None: not abandoned; else for_hosts

        def run() -> None:
            try:
                w = Worker(state.switch, job=state.job, rank=rank, world_size=n, secret=state._secret or "", **options)
            except BaseException as e:  # noqa: BLE001 - reported by outcome()
                with self._lock:
                    self._error = e
                return
            with self._lock:
                abandoned, self._worker = self._abandoned, w
            if abandoned is not None:
                _close_quietly(w, abandoned)

        self._thread = threading.Thread(target=run, name=f"aggswitch-join-job{state.job}", daemon=True)
        self._thread.start()

    def wait(self, seconds: float) -> None:
        self._thread.join(seconds)

    def outcome(self) -> tuple[int, BaseException | None]:
        with self._lock:
            if self._worker is not None:
                return _OK, None
            if self._error is None:
                return _JOINING, None
            e = self._error
        if isinstance(e, JoinTimeoutError):
            return _JOINING, e
        return (_outcome(e), e) if isinstance(e, AggSwitchError) else (_OTHER, e)

    def take(self) -> Any:
        with self._lock:
            w, self._worker = self._worker, None
        return w

    def abandon(self, for_hosts: bool) -> None:
        with self._lock:
            self._abandoned = for_hosts
            w, self._worker = self._worker, None
        if w is not None:
            _close_quietly(w, for_hosts)


def _close_quietly(w: Any, for_hosts: bool) -> None:
    try:
        w.close(for_hosts=for_hosts)
    except AggSwitchError:
        pass


class _Agreed(Exception):
    """A join failed and every rank knows it (the votes said so): ``error``
    is what this rank raises when it fails fast."""

    def __init__(self, error: BaseException, codes: list[int]) -> None:
        super().__init__(str(error))
        self.error = error
        self.codes = codes


class CollectivePath:
    def __init__(self, state: Any) -> None:
        self._state = state
        self._on_hosts = state.mode == "hosts"
        self._groups: dict[Any, Any] = {}
        self._counts = dict(fallbacks=0, returns=0, failed_returns=0, switch_collectives=0, host_collectives=0)
        self._last_reason: str | None = None
        self._last_timing: dict | None = None
        self._host_stats: tuple[float, float, int] | None = None
        self._last_on_hosts = False
        self._chunk: int | None = None
        self._stats_job = False
        # The prober's latest answer: (monotonic time, alive).
        self._seen: tuple[float, bool] | None = None
        self._stop = threading.Event()
        self._prober: threading.Thread | None = None
        # After a failed return, wait this long before the next try.
        self._backoff = float(state.probe_interval)
        self._not_before = 0.0

    # --- what the state reads -------------------------------------------------

    def counters(self) -> dict:
        out: dict[str, Any] = dict(self._counts)
        out["path"] = "hosts" if self._on_hosts else "switch"
        out["last_fallback_reason"] = self._last_reason
        out["last_fallback_timing"] = None if self._last_timing is None else dict(self._last_timing)
        return out

    def gradient_stats(self) -> dict:
        """The last all-reduce's statistics, from the switch or the host path."""
        if self._last_on_hosts:
            if self._host_stats is None:
                raise GradientStatsError("no statistics were computed for the last collective", "no_collective")
            s, q, n = self._host_stats
            return {"sum_of_squares": s, "square_of_sum": q, "n": n}
        return self._state._joined().gradient_stats()

    def stop(self) -> None:
        self._stop.set()

    # --- the collectives ----------------------------------------------------

    def all_reduce(self, host: torch.Tensor, group: Any) -> None:
        st = self._state

        def on_hosts(hg: Any, rank: int, n: int) -> None:
            chunk = None
            if st._gns is not None:
                chunk = self._chunk or st.elems_per_chunk or _native.default_stats_chunk(st.dtype)
            self._host_stats = _hosts.all_reduce(
                host, rank, n, st.dtype, hg, leaf_sizes=st.leaf_sizes, stats_chunk=chunk
            )

        def restore(w: Any) -> None:
            w.restore_input(host.reshape(-1).view(torch.uint8).numpy())

        self._run(group, lambda w: w.all_reduce(host), on_hosts, restore, host.numel() * host.element_size())

    def reduce_scatter(self, src: torch.Tensor, out: torch.Tensor, group: Any) -> None:
        st = self._state

        def on_hosts(hg: Any, rank: int, n: int) -> None:
            _hosts.reduce_scatter(src, out, rank, n, st.dtype, hg, owner_keeps=not self._stats_job)

        self._run(group, lambda w: w.reduce_scatter(src, out), on_hosts, None, src.numel() * src.element_size())

    def all_gather(self, src: torch.Tensor, out: torch.Tensor, job_dtype: torch.dtype, group: Any) -> None:
        def on_hosts(hg: Any, rank: int, n: int) -> None:
            _hosts.all_gather(src, out, n, hg)

        self._run(group, lambda w: w.all_gather(src.view(job_dtype), out), on_hosts, None, out.numel() * out.element_size())

    # --- the agreement ------------------------------------------------------

    def _run(
        self,
        group: Any,
        on_switch: Callable[[Any], None],
        on_hosts: Callable[[Any, int, int], None],
        restore: Callable[[Any], None] | None,
        nbytes: int,
    ) -> None:
        st = self._state
        if st.mode == "hosts":
            self._hosts(group, on_hosts)
            return
        if not (dist.is_available() and dist.is_initialized()):
            # Without a process group there is no host path to fall back to
            # and nothing to agree on (a state used with rank= and
            # world_size= alone): fail fast.
            on_switch(st._joined(group))
            self._switch_done()
            return
        hg = self._host_group(group)
        if not st.fallback:
            # Fail fast, but every rank learns at once why a join failed.
            if st._failure is not None:
                st._joined(group)  # raises: an earlier collective failed
            if st._worker is None:
                try:
                    self._join_together(hg, group)
                except _Agreed as a:
                    raise a.error from None
            on_switch(st._joined(group))
            self._switch_done()
            return
        returning = False
        if self._on_hosts:
            if not self._agree_back(hg):
                self._hosts(group, on_hosts)
                return
            returning = True
        err: BaseException | None = None
        ran = None
        started = time.monotonic()
        try:
            if st._worker is None:
                self._join_together(hg, group)
            w = st._joined(group)
            ran = w
            on_switch(w)
        except _Agreed as e:
            err = e  # every rank knows from the join's votes: no second vote
        except AggSwitchError as e:
            err = e
        failed_at = time.monotonic()
        if not isinstance(err, _Agreed):
            try:
                codes = self._vote(hg, 0 if err is None else _outcome(err))
            except RuntimeError as gone:
                # The process group cannot agree either: a peer rank is gone
                # (it died), which no path survives. The switch's own error
                # names it (StalledError's missing ranks). A rank whose
                # collective completed keeps its result: its next collective
                # stalls on the switch and says which rank is missing.
                if err is not None:
                    raise err from gone
                codes = [0]
            if not any(codes):
                if returning:
                    self._backoff = st.probe_interval
                    self._counts["returns"] += 1
                    _log.warning("%s: the switch is back; collectives run on it again", self._who(hg))
                self._on_hosts = False
                self._switch_done()
                return
            reason = self._reason(codes, err)
            if ran is not None and restore is not None:
                restore(ran)
        else:
            reason = str(err.error)
        # The errors' messages start with "job J rank R: ", as the log does.
        reason = re.sub(rf"^job {st.job} rank {st.rank}: ", "", reason)
        self._drop_worker()
        agreed = time.monotonic()
        self._hosts(group, on_hosts)
        done = time.monotonic()
        if returning:
            self._counts["failed_returns"] += 1
            # A switch that answers HELLOs but cannot finish a collective (a
            # leaf whose spine is dead): try less and less often.
            self._backoff = min(self._backoff * 2, 64 * st.probe_interval)
            self._not_before = time.monotonic() + self._backoff
            _log.info(
                "%s: the switch answered but could not take the job back (%s); "
                "staying on the hosts, next try in %.0f s", self._who(hg), reason, self._backoff,
            )
        else:
            self._counts["fallbacks"] += 1
            self._last_reason = reason
            self._last_timing = {
                "on_switch_s": failed_at - started,
                "agreement_s": agreed - failed_at,
                "host_collective_s": done - agreed,
                "bytes": nbytes,
            }
            _log.warning(
                "%s: %s; this collective and the next ones run on the hosts over "
                "the process group, with the switch's bits; probing the switch every %.0f s to come back",
                self._who(hg), reason, st.probe_interval,
            )
        self._on_hosts = True
        self._start_prober()

    def _who(self, hg: Any) -> str:
        """"aggswitch job J rank R" for the log, with the process group's
        rank when it differs (a tree's job numbers its ranks per leaf)."""
        st = self._state
        who = f"aggswitch job {st.job} rank {st.rank}"
        pg = dist.get_rank(hg)
        return who if pg == st.rank else f"{who} (process rank {pg})"

    def _switch_done(self) -> None:
        w = self._state._worker
        if self._chunk is None and w is not None:
            self._chunk = int(w.elems_per_chunk)
            self._stats_job = bool(w.has_gradient_stats)
        self._counts["switch_collectives"] += 1
        self._last_on_hosts = False

    def _hosts(self, group: Any, on_hosts: Callable[[Any, int, int], None]) -> None:
        hg = self._host_group(group)
        on_hosts(hg, dist.get_rank(hg), dist.get_world_size(hg))
        self._counts["host_collectives"] += 1
        self._last_on_hosts = True

    def _reason(self, codes: list[int], err: BaseException | None) -> str:
        if err is not None:
            # The library's advice to restart the job is for fail-fast; here
            # the job goes on.
            text = str(err).replace(" and restart the job", "")
            return f"this rank's collective failed on the switch ({type(err).__name__}: {text})"
        failed = [f"rank {r}: {_describe(c)}" for r, c in enumerate(codes) if c]
        return "the switch failed for other ranks (" + "; ".join(failed) + ")"

    def _vote(self, hg: Any, code: int) -> list[int]:
        # Indexed by the host group's ranks: a tree's job at a leaf numbers
        # its ranks per leaf, the host path by the process group.
        #
        # An all-to-all, not an all-reduce: every rank hears from every
        # other one directly, so a dead rank's closed connection fails the
        # vote on every survivor at once. In a ring, a survivor that is not
        # the dead rank's neighbour waits for a neighbour that has already
        # given up on the vote, until that neighbour's process exits.
        n = dist.get_world_size(hg)
        if n == 1:
            return [code]
        out = torch.zeros(n, dtype=torch.int32)
        dist.all_to_all_single(out, torch.full((n,), code, dtype=torch.int32), group=hg)
        return [int(x) for x in out.tolist()]

    def _join_together(self, hg: Any, group: Any) -> None:
        """Joins with every rank or with none, so no rank waits in a join
        the others never finish: first every rank probes the switch and the
        ranks agree on the answers; then each joins (one join, on a thread)
        and the ranks vote every ``_JOIN_SLICE`` seconds until all joined,
        one failed (a refusal: every rank knows which and why within one
        interval), or the join timeout passed. A failure raises the same
        ``_Agreed`` on every rank (fail-fast: this rank's own error, or one
        naming the ranks that failed)."""
        st = self._state
        what, _, refused = self._probe_once(group, timeout=_START_PROBE)
        code = _OK if what == "alive" else _UNREACHABLE
        if what == "refused":
            code = _refusal_code(refused)
        codes = self._vote(hg, code)
        if any(codes):
            silent = [r for r, c in enumerate(codes) if c == _UNREACHABLE]
            own = None
            if code == _UNREACHABLE:
                own = JoinTimeoutError(
                    f"job {st.job} rank {st.rank}: the switch {st.switch} did not answer a HELLO within {_START_PROBE:.0f} s "
                    f"(ranks {silent} got no answer): is switchd running, and is it reachable from this host?"
                )
            elif code != _OK:
                own = RefusedError(f"job {st.job} rank {st.rank}: the switch refused this rank's HELLO: {_describe(code)}", refused or "other")
            raise _Agreed(own or _others_error(st.job, st.rank, codes, "joining"), codes)
        timeout = float(st._options.get("join_timeout", 30.0))
        deadline = time.monotonic() + timeout
        join = _BackgroundJoin(st, group, timeout)
        while True:
            # One join, never restarted (a new one from a new socket would
            # reset the job at the switch for the ranks that got in); the
            # votes between slices only say how far each rank is.
            join.wait(_JOIN_SLICE)
            code, err = join.outcome()
            codes = self._vote(hg, code)
            if not any(codes):
                st._worker = join.take()
                return
            if any(c not in (_OK, _JOINING) for c in codes) or time.monotonic() >= deadline:
                join.abandon(for_hosts=st.fallback)
                if all(c in (_OK, _JOINING) for c in codes):
                    waiting = [r for r, c in enumerate(codes) if c == _JOINING]
                    own = JoinTimeoutError(
                        f"job {st.job} rank {st.rank}: the switch answered, but the job did not start within "
                        f"{timeout:.0f} s (ranks {waiting} still waiting for the others to join): are all "
                        f"{len(codes)} ranks pointed at the same switch and job?"
                    )
                    raise _Agreed(own, codes)
                raise _Agreed(err if err is not None else _others_error(st.job, st.rank, codes, "joining"), codes)

    def _probe_once(self, group: Any, timeout: float) -> tuple[str, Any, Any]:
        st = self._state
        rank, n = st._resolve(group)
        opts = st._options
        try:
            return _native.probe_switch(
                st.switch, st.job, rank, n, st._secret or "", timeout=timeout,
                dtype=st.dtype, bind=opts.get("bind"), tenant=opts.get("tenant"),
                tenant_key_file=opts.get("tenant_key_file"), job_name=opts.get("job_name"),
            )
        except AggSwitchError:
            return ("silent", None, None)

    def _agree_back(self, hg: Any) -> bool:
        seen = self._seen
        now = time.monotonic()
        fresh = seen is not None and seen[1] and now - seen[0] < 2 * self._state.probe_interval + 2
        ready = fresh and now >= self._not_before
        if not any(self._vote(hg, _OK if ready else _UNREACHABLE)):
            self._seen = None
            return True
        return False

    def _start_prober(self) -> None:
        if self._prober is not None and self._prober.is_alive():
            return
        self._seen = None
        st = self._state

        def probe() -> None:
            while not self._stop.is_set() and self._on_hosts:
                alive = self._probe_once(st._group, timeout=1.0)[0] == "alive"
                self._seen = (time.monotonic(), alive)
                self._stop.wait(st.probe_interval)

        self._prober = threading.Thread(target=probe, name=f"aggswitch-probe-job{st.job}", daemon=True)
        self._prober.start()

    def _drop_worker(self, for_hosts: bool = True) -> None:
        st = self._state
        with st._lock:
            w, st._worker = st._worker, None
        if w is not None:
            # A LEAVE: frees the rank at a switch that still runs, which
            # counts it (members_left_for_hosts).
            _close_quietly(w, for_hosts)

    def _host_group(self, group: Any) -> Any:
        """The host path's own gloo group over ``group``'s ranks (made once,
        by every member, the first time): its collectives never interleave
        with the application's on ``group``."""
        st = self._state
        base = group if group is not None else st._group
        key = id(base) if base is not None else None
        hg = self._groups.get(key)
        if hg is None:
            if not (dist.is_available() and dist.is_initialized()):
                raise AggSwitchError(
                    f"job {st.job}: the host path runs over torch.distributed; call "
                    "torch.distributed.init_process_group first"
                )
            ranks = dist.get_process_group_ranks(base) if base is not None else list(range(dist.get_world_size()))
            hg = dist.new_group(ranks, backend="gloo", use_local_synchronization=True, group_desc=f"aggswitch_job{st.job}_hosts")
            self._groups[key] = hg
        return hg
