"""The hook state: ``AggSwitchState``, ``state_from_env`` and what they
check. Public through ``aggswitch.torch``.

``state_from_env()`` reads ``AGGSWITCH_SWITCH`` (address[:port]),
``AGGSWITCH_JOB`` and ``AGGSWITCH_SECRET`` (64 hex digits) or
``AGGSWITCH_SECRET_FILE``; or, for a self-provisioned job,
``AGGSWITCH_TENANT``, ``AGGSWITCH_TENANT_KEY_FILE`` and optionally
``AGGSWITCH_JOB_NAME``. Without a job name, rank 0 of the default process
group makes one (``run-`` and 16 random hex digits) and puts it in the
group's store, where every other rank reads it: shared by the ranks of
one run, new for the next. An ``AggSwitchState`` owns, for one job: the
joined ``aggswitch.Worker`` (joined on the first collective), the
``CollectivePath`` (``aggswitch._path``) that runs each collective on the
switch or on the host path, and the one background thread every
collective of the state runs on, in the order the ranks submit them (the
same on every rank), so that DDP buckets and FSDP collectives of one state
never overlap or reorder. A self-provisioned job ends after its lease
without traffic; so that a pause between steps (evaluation,
checkpointing) longer than that does not end it, a keepalive thread wakes
every half ``Worker.keepalive_interval`` while the state is joined and
queues ``Worker.keepalive`` on that same background thread (it sends a
HEARTBEAT only when one is due, so none while collectives run).

Invariants: rank and world size are fixed when the state first joins
(from its ``group``, the collective's process group, or
torch.distributed's), so the state may be made before the process group,
and never change after. The first failed collective is kept
(``state.error``) and fails every later one at once: after it the ranks
are out of step. A state is never pickled (a live socket and thread
cannot travel, nor should the secret).

Layering: imports ``aggswitch`` (``Worker``), ``_path`` and ``errors``; a
``GradientNoiseScale`` (``_gns``, below it) is seen only through the
``_BucketSink`` protocol; the DDP hooks (``_ddp``) and FSDP comms
(``_fsdp``) import it, ``aggswitch.torch`` re-exports it.
"""

# No `from __future__ import annotations`, as in the other modules of the
# torch integration (aggswitch._ddp: DDP checks the hooks' annotations).

import concurrent.futures
import datetime
import os
import secrets
import threading
from typing import Any, Callable, Protocol

import torch
import torch.distributed as dist

from . import Worker
from ._path import CollectivePath as _Path
from .errors import AggSwitchError


class _BucketSink(Protocol):
    """What the state feeds a bucket's gradient statistics to: a
    ``GradientNoiseScale`` (``aggswitch._gns``, which sits below this module
    and attaches itself to a state, so this module does not import it)."""

    def _add_bucket(self, sum_of_squares: float, square_of_sum: float, n: int) -> None: ...


class AggSwitchState:
    """What ``allreduce_hook`` needs: where the switch is, which job, and
    (after the first bucket) the joined ``aggswitch.Worker``.

    ``rank`` and ``world_size`` default to ``torch.distributed``'s. Extra
    keyword arguments go to ``aggswitch.Worker`` (``join_timeout``,
    ``stall_timeout``, ``congestion_control``, ``delay_target`` (seconds of
    queueing delay that count as a congestion mark; None for ECE alone),
    ``bind``, ``transport``, ``threads`` (``"auto"`` or 1..64: the threads
    that carry each collective, each with its own socket and share of the
    chunks; more than one needs a switch with ``seq_lanes`` of at least that
    many, else the worker runs one),
    ``dtype``: the job's element type, which picks the hook: ``"f32"`` for
    ``allreduce_hook``, ``"bf16"`` for ``bf16_compress_hook``, ``"f16"`` for
    ``fp16_compress_hook``).

    ``mode``: ``"switch"`` (default) or ``"hosts"`` (no switch: every
    collective on the host path, with the switch's bits; ``switch`` and
    ``secret`` may be None). ``fallback`` (default True): finish a
    collective that fails on the switch on the host path, and come back
    once the switch answers again, probing it every ``probe_interval``
    seconds. ``leaf_sizes``: the workers per leaf when the job runs on an
    aggregation tree, so the host path sums in the tree's order.
    ``elems_per_chunk``: the job's chunk length for the host path's
    gradient statistics (per-chunk sums, as the switch's trailers) before it
    has joined the switch; once joined it uses the switch's. Default: a
    ``stats = true`` job's at MTU 1500.

    ``tenant``, ``tenant_key_file`` and ``job_name``: a self-provisioned
    job (``job`` and ``secret`` are not used then). Without ``job_name``
    the ranks share one made for this run (see the module doc); that needs
    ``torch.distributed`` initialised before the first collective.
    """

    def __init__(
        self,
        switch: str | None,
        job: int,
        secret: str | None,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        group: "dist.ProcessGroup | None" = None,
        mode: str = "switch",
        fallback: bool = True,
        probe_interval: float = 5.0,
        leaf_sizes: "list[int] | None" = None,
        elems_per_chunk: int | None = None,
        tenant: str | None = None,
        tenant_key_file: str | None = None,
        job_name: str | None = None,
        **worker_options: Any,
    ) -> None:
        # Rank and world size are taken when the state first joins, not here:
        # trainers (Lightning) make the process group after the state.
        if mode not in ("switch", "hosts"):
            raise ValueError(f"AggSwitchState: mode={mode!r}: expected 'switch' or 'hosts'")
        if mode == "switch":
            if not switch:
                raise ValueError("AggSwitchState: no switch address; pass switch='address[:port]' or mode='hosts'")
            if tenant:
                if not tenant_key_file and not os.environ.get("AGGSWITCH_TENANT_KEY", "").strip():
                    raise ValueError(
                        f"AggSwitchState: tenant={tenant!r} needs its key: pass tenant_key_file= "
                        "(or set AGGSWITCH_TENANT_KEY_FILE / AGGSWITCH_TENANT_KEY)"
                    )
            else:
                _check_secret(secret or "", "secret")
        if not (probe_interval > 0):
            raise ValueError(f"AggSwitchState: probe_interval={probe_interval!r} must be positive seconds")
        self.mode = mode
        self.fallback = bool(fallback)
        self.probe_interval = float(probe_interval)
        self.leaf_sizes = None if leaf_sizes is None else [int(x) for x in leaf_sizes]
        self.elems_per_chunk = None if elems_per_chunk is None else int(elems_per_chunk)
        self._path = _Path(self)
        self.switch = switch
        self.job = int(job)
        self._rank = None if rank is None else int(rank)
        self._world_size = None if world_size is None else int(world_size)
        self._group = group
        self._secret = secret
        self.dtype = str(worker_options.get("dtype", "f32"))
        if "threads" in worker_options:
            # Checked here, not at the first bucket's join, where the
            # fallback would take a typo for an unreachable switch.
            worker_options["threads"] = _threads_option(worker_options["threads"], "AggSwitchState: threads")
        self.tenant = tenant or None
        if self.tenant:
            worker_options["tenant"] = self.tenant
            worker_options["tenant_key_file"] = tenant_key_file
            if job_name:
                worker_options["job_name"] = str(job_name)
        self._options = worker_options
        self._worker: Worker | None = None
        # The GradientNoiseScale the DDP hooks feed (set by its constructor).
        self._gns: "_BucketSink | None" = None
        self._failure: BaseException | None = None
        self._lock = threading.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"aggswitch-job{self.job}"
        )
        # Keeps a self-provisioned job's lease while idle (see the module doc).
        self._keepalive_stop = threading.Event()
        self._keepalive_thread: threading.Thread | None = None

    @property
    def rank(self) -> int:
        """This process's rank in the job (resolved on first use)."""
        return self._resolve()[0]

    @property
    def world_size(self) -> int:
        """The job's number of ranks (resolved on first use)."""
        return self._resolve()[1]

    @property
    def ranks_summed(self) -> int:
        """How many ranks' gradients a sum covers: the job's world size, or
        on an aggregation tree (``leaf_sizes``) every leaf's workers, while
        ``world_size`` is this rank's leaf's. A mean divides by this."""
        if self.leaf_sizes is not None:
            return sum(self.leaf_sizes)
        return self.world_size

    def _resolve(self, group: "dist.ProcessGroup | None" = None) -> tuple[int, int]:
        """Fixes rank and world size: the ones passed to the constructor,
        else those of ``group`` (the constructor's, else the one a collective
        runs on), else torch.distributed's. Once fixed they never change."""
        with self._lock:
            if self._rank is None or self._world_size is None:
                g = self._group if self._group is not None else group
                if g is None and not (dist.is_available() and dist.is_initialized()):
                    raise ValueError(
                        f"AggSwitchState(job={self.job}): rank and world_size come from "
                        "torch.distributed when the state first joins; call "
                        "torch.distributed.init_process_group('gloo') before the first "
                        "backward, or pass rank= and world_size="
                    )
                if self._rank is None:
                    self._rank = dist.get_rank(g) if g is not None else dist.get_rank()
                if self._world_size is None:
                    self._world_size = dist.get_world_size(g) if g is not None else dist.get_world_size()
            if self.tenant and self.mode == "switch" and not self._options.get("job_name"):
                self._options["job_name"] = self._default_job_name()
            return self._rank, self._world_size

    @property
    def job_name(self) -> str | None:
        """A self-provisioned job's name (None before it is known, and for a
        declared job)."""
        return self._options.get("job_name")

    def _default_job_name(self) -> str:
        """The name every rank of this run shares: rank 0 of the default
        process group makes ``run-<16 hex>`` and puts it in the group's
        store; the others wait for it (up to the join timeout). A state
        whose job number is not 1 (HSDP's ``job_offset``) adds ``-<job>``."""
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                f"AggSwitchState(tenant={self.tenant!r}): no job name: set AGGSWITCH_JOB_NAME (or job_name=) "
                "to a name every rank of this run shares and the next run does not, or call "
                "torch.distributed.init_process_group() first so that rank 0 can make one"
            )
        from torch.distributed import distributed_c10d

        store = distributed_c10d._get_default_store()
        key = "aggswitch/run_id"
        if dist.get_rank() == 0:
            if not store.check([key]):
                store.set(key, f"run-{secrets.token_hex(8)}")
        else:
            wait = float(self._options.get("join_timeout", 30.0))
            try:
                store.wait([key], datetime.timedelta(seconds=wait))
            except Exception as e:  # noqa: BLE001 - the store's timeout type varies
                raise ValueError(
                    f"AggSwitchState(tenant={self.tenant!r}): rank 0 did not put the run's job name in the "
                    f"process group's store within {wait:.0f} s ({e}); set AGGSWITCH_JOB_NAME on every rank"
                ) from None
        run_id = store.get(key).decode()
        return run_id if self.job == 1 else f"{run_id}-{self.job}"

    def __repr__(self) -> str:
        return (
            f"AggSwitchState(switch={self.switch!r}, job={self.job}, rank={self._rank}, "
            f"world_size={self._world_size}, dtype={self.dtype!r}, joined={self._worker is not None})"
        )

    def __getstate__(self) -> dict:
        # DDP pickles the hook state when the model is copied; a live socket
        # and thread cannot travel, and the secret should not either.
        raise TypeError("AggSwitchState cannot be pickled; make one per process")

    @property
    def error(self) -> BaseException | None:
        """The typed exception (``aggswitch.errors``) that failed this
        state's first failed collective, or None. DDP hands a hook's error to
        ``backward()`` as a plain ``RuntimeError`` whose message names the
        type; this is the exception itself, to catch by type::

            try:
                loss.backward()
            except RuntimeError:
                if isinstance(state.error, aggswitch.errors.StalledError):
                    print("waiting for ranks", state.error.missing_ranks)
                raise
        """
        return self._failure

    def stats(self) -> dict:
        """The switch worker's counters (while joined) and the state's own:
        ``path`` (``"switch"`` or ``"hosts"``: where the next collective
        goes), ``fallbacks`` (times the job left the switch for the host
        path), ``returns`` (times it came back), ``failed_returns``,
        ``switch_collectives``, ``host_collectives``,
        ``last_fallback_reason`` and ``last_fallback_timing`` (None before
        any fallback; else the collective that fell back: ``on_switch_s``,
        its time on the switch until this rank's attempt ended,
        ``agreement_s``, until every rank had agreed to fall back,
        ``host_collective_s``, the collective redone on the host path, and
        its ``bytes``). While joined also ``threads`` (the threads that
        carried the last collective) and ``lane_replies`` (whether the
        switch granted them; ``aggswitch.Worker``'s properties)."""
        w = self._worker
        out = dict(w.stats(), threads=w.threads, lane_replies=w.lane_replies) if w is not None else {}
        out.update(self._path.counters())
        return out

    def close(self) -> None:
        """Waits for buckets in flight, then leaves the job. Idempotent."""
        self._keepalive_stop.set()
        self._executor.shutdown(wait=True)
        self._path.stop()
        with self._lock:
            w, self._worker = self._worker, None
        if w is not None:
            w.close()

    def _reduce_sum(self, host: torch.Tensor, group: "dist.ProcessGroup | None" = None) -> None:
        """On the background thread: sum ``host`` in place over every rank,
        on the switch (joining if needed) or on the host path."""
        self._path.all_reduce(host, group)

    def _feed_gns(self, scale: float) -> None:
        """On the background thread, after a DDP bucket's all-reduce: hands
        the collective's gradient statistics (times ``scale``) to the
        attached GradientNoiseScale, if any."""
        gns = self._gns
        if gns is None:
            return
        try:
            got = self._path.gradient_stats()
        except AggSwitchError as e:
            raise AggSwitchError(
                f"job {self.job} rank {self._rank}: GradientNoiseScale needs the switch's gradient "
                f"statistics, but there are none for this bucket ({e}); declare the job with "
                "stats = true on the switch (LoopbackSwitch(..., stats=True)), or train without a GradientNoiseScale"
            ) from e
        gns._add_bucket(got["sum_of_squares"] * scale, got["square_of_sum"] * scale, int(got["n"]))

    def _joined(self, group: "dist.ProcessGroup | None" = None, join_timeout: float | None = None) -> Worker:
        """The joined worker (joining on first use), or the error that ended
        this state: after one failed collective the ranks are out of step."""
        if self._failure is not None:
            raise AggSwitchError(
                f"job {self.job} rank {self._rank}: an earlier collective failed "
                f"({self._failure}); the ranks are out of step, restart the job"
            )
        if self._worker is None:
            rank, world_size = self._resolve(group)
            if self.mode == "hosts":
                raise AggSwitchError(f"job {self.job} rank {rank}: the state runs with mode='hosts', without a switch")
            options = dict(self._options)
            if join_timeout is not None:
                options["join_timeout"] = join_timeout
            self._worker = Worker(
                self.switch,
                job=self.job,
                rank=rank,
                world_size=world_size,
                secret=self._secret or "",
                **options,
            )
            self._start_keepalive(self._worker.keepalive_interval)
        return self._worker

    def _start_keepalive(self, interval: float | None) -> None:
        """Starts the keepalive thread once, for a job with a lease."""
        if interval is None or self._keepalive_thread is not None:
            return
        t = threading.Thread(
            target=self._keepalive_loop,
            args=(interval / 2,),
            name=f"aggswitch-keepalive-job{self.job}",
            daemon=True,
        )
        self._keepalive_thread = t
        t.start()

    def _keepalive_loop(self, every: float) -> None:
        """Queues a keepalive on the background thread every ``every``
        seconds until the state closes."""
        while not self._keepalive_stop.wait(every):
            try:
                self._executor.submit(self._keepalive)
            except RuntimeError:  # the executor shut down: the state closed
                return

    def _keepalive(self) -> None:
        """On the background thread: the joined worker's keepalive. A
        failure is left to the next collective, which reports it (the
        worker keeps a session's final failure)."""
        w = self._worker
        if w is None or self._failure is not None:
            return
        try:
            w.keepalive()
        except AggSwitchError:
            pass

    def _run(self, work: Callable[[], None]) -> None:
        """Runs ``work`` (on the background thread); a failure is kept so
        that every later collective of this state fails at once."""
        try:
            work()
        except BaseException as e:
            if self._failure is None:
                self._failure = e
            raise


def _check_secret(secret: str, what: str) -> None:
    s = secret.strip()
    if len(s) != 64 or any(c not in "0123456789abcdefABCDEF" for c in s):
        raise ValueError(f"{what}: expected 64 hex digits (the job's 32-byte secret), got {len(s)} characters")


# The most threads one collective takes (the worker's `--threads` bound).
_MAX_THREADS = 64


def _threads_option(value: Any, what: str) -> "int | str":
    """``threads`` as ``aggswitch.Worker`` takes it: ``"auto"`` or an int in
    1..64 (a string of digits is read as one). Anything else raises
    ``ValueError`` (``TypeError`` for a bool or another type) naming
    ``what`` and what to give."""
    expected = f"give auto or a thread count from 1 to {_MAX_THREADS}"
    if isinstance(value, str):
        text = value.strip()
        if text == "auto":
            return "auto"
        if not text.isdigit():
            raise ValueError(f"{what}={value!r}: {expected}")
        value = int(text)
    elif isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what}={value!r}: {expected}")
    if not 1 <= value <= _MAX_THREADS:
        raise ValueError(f"{what}={value!r}: {expected}")
    return value


def _env(name: str, what: str) -> str:
    v = os.environ.get(name, "").strip()
    if not v:
        raise ValueError(f"{name} is not set: {what}")
    return v


def state_from_env(*, job: int | None = None, job_offset: int = 0, **worker_options: Any) -> AggSwitchState:
    """An ``AggSwitchState`` from the environment (see the module doc).

    Optional: ``AGGSWITCH_MODE`` (``switch`` or ``hosts``; with ``hosts``
    the switch, job and secret are not needed), ``AGGSWITCH_FALLBACK``
    (``on``, the default, or ``off``), ``AGGSWITCH_PROBE_INTERVAL``
    (seconds), ``AGGSWITCH_TREE`` (workers per leaf, e.g. ``2,2``),
    ``AGGSWITCH_DTYPE`` (``f32``, ``bf16``, ``f16``: the job's),
    ``AGGSWITCH_TRANSPORT`` (``auto``, ``mmsg``, ``udp-gso``: the worker's
    UDP data path), ``AGGSWITCH_THREADS`` (``auto`` or 1..64: the threads
    that carry each collective), ``AGGSWITCH_STALL_TIMEOUT`` and ``AGGSWITCH_JOIN_TIMEOUT``
    (seconds), ``AGGSWITCH_TENANT`` with ``AGGSWITCH_TENANT_KEY_FILE`` (or
    ``AGGSWITCH_TENANT_KEY``) and ``AGGSWITCH_JOB_NAME`` (a self-provisioned
    job: ``AGGSWITCH_JOB`` and the secret are not needed then; the job name
    defaults to one rank 0 makes for this run). Keyword arguments override
    them: ``job`` overrides
    ``AGGSWITCH_JOB``, ``job_offset`` is added to it (HSDP: the replica
    group of shard g is job ``AGGSWITCH_JOB + g``), ``rank``,
    ``world_size`` and ``group`` go to ``AggSwitchState``, the rest to
    ``aggswitch.Worker``. Raises ``ValueError`` naming the variable that is
    missing or malformed. Rank and world size are not read here but when the
    state first joins, so the process group may be made later.
    """
    mode = os.environ.get("AGGSWITCH_MODE", "").strip() or worker_options.pop("mode", "switch")
    if mode not in ("switch", "hosts"):
        raise ValueError(f"AGGSWITCH_MODE={mode!r}: expected switch or hosts")
    hosts = mode == "hosts"
    fallback_text = os.environ.get("AGGSWITCH_FALLBACK", "").strip().lower()
    if fallback_text and "fallback" not in worker_options:
        if fallback_text not in ("on", "off"):
            raise ValueError(f"AGGSWITCH_FALLBACK={fallback_text!r}: expected on or off")
        worker_options["fallback"] = fallback_text == "on"
    tree = os.environ.get("AGGSWITCH_TREE", "").strip()
    if tree and "leaf_sizes" not in worker_options:
        try:
            worker_options["leaf_sizes"] = [int(x) for x in tree.split(",")]
        except ValueError:
            raise ValueError(f"AGGSWITCH_TREE={tree!r}: expected the workers per leaf, e.g. 2,2") from None
    tenant = os.environ.get("AGGSWITCH_TENANT", "").strip() or worker_options.pop("tenant", None)
    if tenant:
        worker_options["tenant"] = tenant
        key_file = os.environ.get("AGGSWITCH_TENANT_KEY_FILE", "").strip()
        if key_file and "tenant_key_file" not in worker_options:
            worker_options["tenant_key_file"] = key_file
        job_name = os.environ.get("AGGSWITCH_JOB_NAME", "").strip()
        if job_name and "job_name" not in worker_options:
            worker_options["job_name"] = job_name
        if not worker_options.get("tenant_key_file") and not os.environ.get("AGGSWITCH_TENANT_KEY", "").strip():
            raise ValueError(
                "AGGSWITCH_TENANT is set but no tenant key: set AGGSWITCH_TENANT_KEY_FILE "
                "(a file holding the tenant's 64 hex digits, mode 0600)"
            )
    if hosts:
        switch = os.environ.get("AGGSWITCH_SWITCH", "").strip() or None
    else:
        switch = _env("AGGSWITCH_SWITCH", "the switch's address[:port], e.g. 198.18.0.1:48879 (or AGGSWITCH_MODE=hosts to run without a switch)")
    if job is None:
        job_text = os.environ.get("AGGSWITCH_JOB", "").strip() or ("1" if hosts or tenant else "")
        if not job_text:
            job_text = _env("AGGSWITCH_JOB", "the job id declared on the switch (1..65535)")
        try:
            job = int(job_text)
        except ValueError:
            raise ValueError(f"AGGSWITCH_JOB={job_text!r}: expected a job id (1..65535)") from None
    job += job_offset
    secret = os.environ.get("AGGSWITCH_SECRET", "").strip()
    if not secret and (hosts or tenant) and not os.environ.get("AGGSWITCH_SECRET_FILE", "").strip():
        pass
    elif not secret:
        path = _env(
            "AGGSWITCH_SECRET_FILE",
            "set AGGSWITCH_SECRET (64 hex digits) or AGGSWITCH_SECRET_FILE (a file holding them)",
        )
        try:
            with open(path, encoding="ascii") as f:
                secret = f.read().strip()
        except OSError as e:
            raise ValueError(f"AGGSWITCH_SECRET_FILE={path!r}: cannot read it: {e}") from None
        _check_secret(secret, f"AGGSWITCH_SECRET_FILE={path!r}")
    else:
        _check_secret(secret, "AGGSWITCH_SECRET")
    dtype = os.environ.get("AGGSWITCH_DTYPE", "").strip()
    if dtype and "dtype" not in worker_options:
        if dtype not in ("f32", "bf16", "f16"):
            raise ValueError(f"AGGSWITCH_DTYPE={dtype!r}: expected f32, bf16 or f16")
        worker_options["dtype"] = dtype
    transport = os.environ.get("AGGSWITCH_TRANSPORT", "").strip()
    if transport and "transport" not in worker_options:
        if transport not in ("auto", "mmsg", "udp-gso"):
            raise ValueError(f"AGGSWITCH_TRANSPORT={transport!r}: expected auto, mmsg or udp-gso")
        worker_options["transport"] = transport
    threads = os.environ.get("AGGSWITCH_THREADS", "").strip()
    if threads and "threads" not in worker_options:
        worker_options["threads"] = _threads_option(threads, "AGGSWITCH_THREADS")
    for var, key in (
        ("AGGSWITCH_STALL_TIMEOUT", "stall_timeout"),
        ("AGGSWITCH_JOIN_TIMEOUT", "join_timeout"),
        ("AGGSWITCH_PROBE_INTERVAL", "probe_interval"),
    ):
        text = os.environ.get(var, "").strip()
        if text and key not in worker_options:
            try:
                worker_options[key] = float(text)
            except ValueError:
                raise ValueError(f"{var}={text!r}: expected seconds") from None
    return AggSwitchState(switch, job, secret or None, mode=mode, **worker_options)
