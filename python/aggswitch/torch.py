"""A PyTorch DDP communication hook that sums gradients in the switch.

    import aggswitch.torch as agt
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(agt.state_from_env(), agt.allreduce_hook)

``state_from_env()`` reads ``AGGSWITCH_SWITCH`` (address[:port]),
``AGGSWITCH_JOB`` and ``AGGSWITCH_SECRET`` (64 hex digits) or
``AGGSWITCH_SECRET_FILE``, and takes rank and world size from
``torch.distributed``. The first bucket joins the job; every bucket is then
all-reduced on one background thread, in the order DDP hands them over
(the same on every rank), while backward goes on. The result is the mean
over ranks, as DDP's default hook gives, bit-identical on every rank.

``bf16_compress_hook`` (and ``fp16_compress_hook``) send half the bytes: like
PyTorch's hooks of the same names, each bucket is cast to bfloat16 (float16)
and divided by the world size, summed in the switch (in float32, rounded
once), and cast back into the bucket. The job is declared with
``dtype = "bf16"`` (``"f16"``) on the switch and the state made with
``AggSwitchState(..., dtype="bf16")`` (or ``AGGSWITCH_DTYPE=bf16``).

Surviving the switch: with fallback on (the default; ``AGGSWITCH_FALLBACK=off``
or ``fallback=False`` to fail fast), a collective that fails on the switch
is finished on the hosts over the process group, with the switch's bits,
and the job comes back to the switch once every rank sees it answer
(``aggswitch._path``; docs/PYTORCH.md, "When something goes wrong").
``AGGSWITCH_MODE=hosts`` (``mode="hosts"``) runs on the host path alone.

The process group (gloo) stays in charge of everything else DDP does:
parameter broadcast at construction, barriers, ``find_unused_parameters``
bookkeeping.

Gradient noise scale: a job declared ``stats = true`` has the switch measure,
per collective, every rank's squared gradient norm and the squared norm of
their sum. ``GradientNoiseScale(state, batch_per_rank=b)`` collects them from
the DDP hooks and estimates McCandlish et al.'s B_noise once per step (call
its ``step()`` after each ``backward()``); ``AdaptiveBatch`` grows the global
batch from it (docs/PYTORCH.md, "Gradient noise scale").

FSDP2 (``fully_shard``): ``register_fsdp_comms(model, state)`` sends every
FSDPModule's gradient reduce-scatter and parameter all-gather through the
switch; ``register_hsdp_all_reduce(model, state)`` sends HSDP's replica
all-reduce (docs/PYTORCH.md, "Train with FSDP"). The state takes rank and world size
when it first joins (from its ``group``, the collective's process group, or
torch.distributed's), so it may be made before the process group.
"""

# No `from __future__ import annotations`: DDP checks that the hook's
# annotations are the real dist.GradBucket and torch.futures.Future objects.

import concurrent.futures
import logging
import math
import os
import threading
from typing import Any, Callable

import torch
import torch.distributed as dist

from . import Worker
from ._path import CollectivePath as _Path
from .errors import AggSwitchError

__all__ = [
    "AggSwitchState",
    "state_from_env",
    "allreduce_hook",
    "bf16_compress_hook",
    "fp16_compress_hook",
    "register_fsdp_comms",
    "register_hsdp_all_reduce",
    "SwitchReduceScatter",
    "SwitchAllGather",
    "UnsupportedError",
    "GradientNoiseScale",
    "AdaptiveBatch",
]

_log = logging.getLogger(__name__)


class AggSwitchState:
    """What ``allreduce_hook`` needs: where the switch is, which job, and
    (after the first bucket) the joined ``aggswitch.Worker``.

    ``rank`` and ``world_size`` default to ``torch.distributed``'s. Extra
    keyword arguments go to ``aggswitch.Worker`` (``join_timeout``,
    ``stall_timeout``, ``congestion_control``, ``delay_target`` (seconds of
    queueing delay that count as a congestion mark; None for ECE alone),
    ``bind``, ``transport``,
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
        **worker_options: Any,
    ) -> None:
        # Rank and world size are taken when the state first joins, not here:
        # trainers (Lightning) make the process group after the state.
        if mode not in ("switch", "hosts"):
            raise ValueError(f"AggSwitchState: mode={mode!r}: expected 'switch' or 'hosts'")
        if mode == "switch":
            if not switch:
                raise ValueError("AggSwitchState: no switch address; pass switch='address[:port]' or mode='hosts'")
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
        self._options = worker_options
        self._worker: Worker | None = None
        # The GradientNoiseScale the DDP hooks feed (set by its constructor).
        self._gns: "GradientNoiseScale | None" = None
        self._failure: BaseException | None = None
        self._lock = threading.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"aggswitch-job{self.job}"
        )

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
            return self._rank, self._world_size

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
        its ``bytes``)."""
        w = self._worker
        out = dict(w.stats()) if w is not None else {}
        out.update(self._path.counters())
        return out

    def close(self) -> None:
        """Waits for buckets in flight, then leaves the job. Idempotent."""
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
                secret=self._secret,
                **options,
            )
        return self._worker

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
    UDP data path), ``AGGSWITCH_STALL_TIMEOUT`` and ``AGGSWITCH_JOIN_TIMEOUT``
    (seconds). Keyword arguments override them: ``job`` overrides
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
    if hosts:
        switch = os.environ.get("AGGSWITCH_SWITCH", "").strip() or None
    else:
        switch = _env("AGGSWITCH_SWITCH", "the switch's address[:port], e.g. 198.18.0.1:48879 (or AGGSWITCH_MODE=hosts to run without a switch)")
    if job is None:
        job_text = os.environ.get("AGGSWITCH_JOB", "").strip() or ("1" if hosts else "")
        if not job_text:
            job_text = _env("AGGSWITCH_JOB", "the job id declared on the switch (1..65535)")
        try:
            job = int(job_text)
        except ValueError:
            raise ValueError(f"AGGSWITCH_JOB={job_text!r}: expected a job id (1..65535)") from None
    job += job_offset
    secret = os.environ.get("AGGSWITCH_SECRET", "").strip()
    if not secret and hosts and not os.environ.get("AGGSWITCH_SECRET_FILE", "").strip():
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


def allreduce_hook(state: AggSwitchState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the mean of the bucket over all ranks, summed
    in the switch. Returns at once; the all-reduce runs on the state's
    background thread. A failure (a dead peer, a refusal) fails the future,
    and DDP's ``backward()`` raises a RuntimeError naming the aggswitch
    exception and its message.
    """
    tensor = bucket.buffer()
    if tensor.dtype != torch.float32:
        raise TypeError(
            f"aggswitch allreduce_hook: bucket {bucket.index()} holds {tensor.dtype}; "
            "this hook sums float32 only (cast the model with model.float())"
        )
    _check_state_dtype(state, "f32", "allreduce_hook")
    # A CUDA bucket is staged through host memory: the copy to the host
    # waits for the bucket's kernels, the copy back (pageable memory) is
    # done before the future completes.
    host = tensor if tensor.device.type == "cpu" else tensor.to("cpu")

    def work() -> None:
        state._reduce_sum(host)
        state._feed_gns(1.0)
        host.div_(state.ranks_summed)
        if host is not tensor:
            tensor.copy_(host)

    return _on_state_thread(state, work, tensor)


def _on_state_thread(
    state: AggSwitchState, work: Callable[[], None], tensor: torch.Tensor
) -> torch.futures.Future[torch.Tensor]:
    """Runs ``work`` on the state's background thread; the returned future
    holds ``tensor`` once it is done, or its exception."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def run() -> None:
        try:
            state._run(work)
            fut.set_result(tensor)
        except BaseException as e:  # handed to DDP, which raises it in backward()
            fut.set_exception(e)

    state._executor.submit(run)
    # DDP's reducer reads the future's value in C++, past the Python unwrap
    # that set_exception relies on: a failed bucket surfaced as "RuntimeError:
    # Unable to cast <message> to Tensor". A then() callback that re-raises
    # marks the returned future failed in C++, so backward() raises
    # "RuntimeError: ... StalledError: <the library's message>".
    return fut.then(_value)


def _value(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
    return fut.value()


def _check_state_dtype(state: AggSwitchState, want: str, hook: str) -> None:
    if state.dtype != want:
        raise ValueError(
            f"aggswitch {hook}: the state's job is {state.dtype}; this hook sends {want} "
            f"(make the state with dtype={want!r} and declare the job with dtype = \"{want}\")"
        )


def _compress_hook(
    state: AggSwitchState, bucket: dist.GradBucket, wire: torch.dtype, name: str, hook: str
) -> torch.futures.Future[torch.Tensor]:
    """Casts the bucket to ``wire`` and divides by the world size (before the
    sum, so float16 does not overflow), sums in the switch, casts back."""
    _check_state_dtype(state, name, hook)
    tensor = bucket.buffer()
    if not tensor.dtype.is_floating_point:
        raise TypeError(f"aggswitch {hook}: bucket {bucket.index()} holds {tensor.dtype}, not floats")
    # Cast and divide where the bucket is: on a GPU that is the GPU's work,
    # and the copy to the host carries half the bytes. (A copy between
    # devices that also changes the dtype converts on the CPU, in float32
    # over the bus, both ways: torch's copy_.) Round to nearest even on
    # either device, so the bytes sent are the same.
    compressed = tensor.to(dtype=wire).div_(state.ranks_summed)
    host = compressed if compressed.device.type == "cpu" else compressed.to("cpu")

    def work() -> None:
        state._reduce_sum(host)
        # The switch measured g/n (divided before the sum): n² restores Σ‖gᵢ‖², ‖Σgᵢ‖².
        state._feed_gns(float(state.ranks_summed) ** 2)
        tensor.copy_(host if host is compressed else host.to(tensor.device))

    return _on_state_thread(state, work, tensor)


def bf16_compress_hook(state: AggSwitchState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket cast to bfloat16 and divided by
    the world size, summed in the switch (float32, rounded once to
    bfloat16), then cast back into the bucket. Half the bytes of
    ``allreduce_hook``; the state's job must be ``dtype="bf16"``."""
    return _compress_hook(state, bucket, torch.bfloat16, "bf16", "bf16_compress_hook")


def fp16_compress_hook(state: AggSwitchState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """``bf16_compress_hook`` with IEEE float16; the state's job must be
    ``dtype="f16"``."""
    return _compress_hook(state, bucket, torch.float16, "f16", "fp16_compress_hook")


# --- FSDP2 (fully_shard) ------------------------------------------------------
#
# FSDP2 hands every FSDPModule's gradient reduce-scatter and parameter
# all-gather to a comm object (torch's ReduceScatter/AllGather interface). Ours
# run the switch's collectives on the state's one background thread, so they
# keep the order the ranks issue them in (the same on every rank) and queue
# behind any DDP bucket of the same state. Nothing of the protocol is here: the
# native Worker does the collectives; this layer checks what FSDP asks for,
# lays the buffers out and divides for AVG.

try:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGather
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatter

    _FSDP_MISSING: str | None = None
except ImportError as e:  # torch without FSDP2's custom comms
    FSDPModule = None  # type: ignore[assignment,misc]
    _AllGather = _ReduceScatter = object  # type: ignore[assignment,misc]
    _FSDP_MISSING = f"this torch ({torch.__version__}) lacks FSDP2's custom comm API ({e}); FSDP through the switch needs FSDPModule.set_custom_reduce_scatter (torch 2.15 is tested)"

_JOB_TORCH_DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


class UnsupportedError(AggSwitchError, ValueError):
    """FSDP asked for something the switch does not do (a reduce op other
    than SUM or AVG, a reduce dtype other than the job's, native 2-D HSDP).
    The message says what to change."""


def _reduce_op(op: Any) -> str:
    """"sum" or "avg" for FSDP's reduce op, else UnsupportedError."""
    for name in ("SUM", "AVG"):
        try:
            if op == getattr(dist.ReduceOp, name):
                return name.lower()
        except (TypeError, RuntimeError):  # a PREMUL_SUM op object does not compare
            pass
    raise UnsupportedError(
        f"aggswitch reduce-scatter: reduce op {op!r} is not supported; the switch sums "
        "(ReduceOp.SUM) and averages (ReduceOp.AVG, FSDP's default). A gradient divide "
        "factor (set_gradient_divide_factor) asks for PREMUL_SUM: call "
        "module.set_force_sum_reduction_for_comms(True) as well, and FSDP divides itself"
    )


def _check_group(state: AggSwitchState, group: dist.ProcessGroup, what: str) -> int:
    """The group's size, after checking that the state's job is this group:
    one state (one job) per process group."""
    rank, world_size = state._resolve(group)
    n = group.size()
    if (rank, world_size) != (group.rank(), n):
        raise ValueError(
            f"aggswitch {what}: the state's job {state.job} has this process as rank {rank} of "
            f"{world_size}, but FSDP runs it on a group where it is rank {group.rank()} of {n}; "
            "make one AggSwitchState (and one job on the switch) per FSDP process group"
        )
    return n


class _StateWork(dist.Work):
    """What FSDP waits on for an async collective: the state's future, then
    ``finish`` on the waiting thread (in FSDP's stream context)."""

    def __init__(self, fut: concurrent.futures.Future, finish: Callable[[], None] | None) -> None:
        super().__init__()
        self._fut = fut
        self._finish = finish

    def wait(self, timeout: Any = None) -> bool:
        self._fut.result()  # raises the collective's error, e.g. StalledError
        finish, self._finish = self._finish, None
        if finish is not None:
            finish()
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        return self._fut.done() and self._fut.exception() is None


def _submit(
    state: AggSwitchState,
    work: Callable[[], None],
    async_op: bool,
    finish: Callable[[], None] | None = None,
) -> "dist.Work | None":
    """Runs ``work`` (host tensors only) on the state's thread, then
    ``finish`` (copies back to the device) on the caller's: at once, the
    error raised here, or for ``async_op`` in the returned Work's wait().
    Device copies stay on the caller's thread so that they run on the CUDA
    stream FSDP set for the collective, ordered with its other work."""
    fut = state._executor.submit(state._run, work)
    if async_op:
        return _StateWork(fut, finish)
    fut.result()
    if finish is not None:
        finish()
    return None


def _host(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when it is a contiguous CPU tensor, else a CPU copy (a
    CUDA tensor is staged through host memory)."""
    if t.device.type == "cpu" and t.is_contiguous():
        return t
    return t.detach().to("cpu").contiguous()


def _host_out(t: torch.Tensor) -> torch.Tensor:
    """Where the native layer writes ``t``'s result: ``t`` itself, or host
    memory copied into it by ``_copy_back``."""
    if t.device.type == "cpu" and t.is_contiguous():
        return t
    return torch.empty(t.shape, dtype=t.dtype)


def _copy_back(host: torch.Tensor, t: torch.Tensor) -> "Callable[[], None] | None":
    return None if host is t else (lambda: t.copy_(host))


class _SwitchComm:
    """What FSDP2's comm hooks share: the job's state, and buffers from
    ``torch.empty`` (the native layer needs no special allocation)."""

    def __init__(self, state: AggSwitchState) -> None:
        self._state = state

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class SwitchReduceScatter(_SwitchComm, _ReduceScatter):  # type: ignore[misc,valid-type]
    """FSDP2's gradient reduce-scatter through the switch: input n·m
    elements, output this rank's m, summed in rank order by the switch
    (bit-identical whatever the arrival order). For ``ReduceOp.AVG`` the sum
    is then divided by n. The input's dtype (FSDP's reduce dtype,
    ``MixedPrecisionPolicy.reduce_dtype``) must be the job's."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> "dist.Work | None":
        state = self._state
        kind = _reduce_op(op)
        want = _JOB_TORCH_DTYPE[state.dtype]
        if input_tensor.dtype != want or output_tensor.dtype != want:
            raise UnsupportedError(
                f"aggswitch reduce-scatter: FSDP reduces {input_tensor.dtype} but the job "
                f"{state.job} is {state.dtype}; set MixedPrecisionPolicy(reduce_dtype={want}) "
                f"or declare the job with the reduce dtype"
            )
        n = _check_group(state, group, "reduce-scatter")
        if input_tensor.numel() != n * output_tensor.numel():
            raise ValueError(
                f"aggswitch reduce-scatter: input of {input_tensor.numel()} elements is not "
                f"{n} shards of the output's {output_tensor.numel()}"
            )

        src, out = _host(input_tensor), _host_out(output_tensor)

        def work() -> None:
            state._path.reduce_scatter(src, out, group)
            if kind == "avg":
                out.div_(n)

        return _submit(state, work, async_op, _copy_back(out, output_tensor))


class SwitchAllGather(_SwitchComm, _AllGather):  # type: ignore[misc,valid-type]
    """FSDP2's parameter all-gather through the switch: input this rank's m
    elements, output n·m (shard r from rank r). The switch copies bytes, so
    the parameters' dtype (``MixedPrecisionPolicy.param_dtype``, or uint8 when
    FSDP packs several dtypes) need not be the job's: each shard's bytes are
    sent as whole job elements, padded at the end when they do not divide."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> "dist.Work | None":
        state = self._state
        n = _check_group(state, group, "all-gather")
        if output_tensor.numel() != n * input_tensor.numel() or output_tensor.dtype != input_tensor.dtype:
            raise ValueError(
                f"aggswitch all-gather: output of {output_tensor.numel()} {output_tensor.dtype} is not "
                f"{n} shards of the input's {input_tensor.numel()} {input_tensor.dtype}"
            )
        job_dtype = _JOB_TORCH_DTYPE[state.dtype]
        elem = job_dtype.itemsize
        nbytes = input_tensor.numel() * input_tensor.element_size()
        padded = -(-nbytes // elem) * elem
        # FSDP's input is a view into the output (in place): copy it out,
        # the native layer must not read and write the same memory.
        src = torch.zeros(padded, dtype=torch.uint8)
        src[:nbytes].copy_(input_tensor.detach().reshape(-1).view(torch.uint8))
        direct = padded == nbytes and output_tensor.device.type == "cpu" and output_tensor.is_contiguous()
        if direct:
            out = output_tensor.detach().reshape(-1).view(torch.uint8).view(job_dtype)
        else:
            out = torch.empty(n * padded // elem, dtype=job_dtype)

        def work() -> None:
            state._path.all_gather(src, out, job_dtype, group)

        def finish() -> None:
            shards = out.view(torch.uint8).view(n, padded)[:, :nbytes]
            output_tensor.view(torch.uint8).view(n, nbytes).copy_(shards)

        return _submit(state, work, async_op, None if direct else finish)


def _fsdp_modules(model: torch.nn.Module, what: str) -> list:
    if _FSDP_MISSING is not None:
        raise UnsupportedError(f"aggswitch {what}: {_FSDP_MISSING}")
    mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not mods:
        raise ValueError(
            f"aggswitch {what}: no FSDPModule in {type(model).__name__}; call "
            "torch.distributed.fsdp.fully_shard on its blocks and on the model first"
        )
    return mods


def _is_native_hsdp(module: Any) -> bool:
    # Native HSDP shards over a 2-D mesh and all-reduces across replicas on
    # the process group itself, before any hook: it cannot go through the
    # switch. Its parameters are DTensors replicated over one mesh dimension
    # (public DTensor API; FSDP2's private param-group flags differ between
    # torch versions).
    from torch.distributed.tensor import DTensor, Replicate

    return any(
        isinstance(p, DTensor) and p.device_mesh.ndim >= 2 and any(isinstance(pl, Replicate) for pl in p.placements)
        for p in module.parameters()
    )


def _refuse_native_hsdp(mods: list, what: str) -> None:
    if any(_is_native_hsdp(m) for m in mods):
        raise UnsupportedError(
            f"aggswitch {what}: the model is sharded over a 2-D mesh (native HSDP), whose "
            "replica all-reduce runs on the process group and cannot go through the switch; "
            "shard it with fully_shard(..., mesh=mesh['shard']) and register "
            "aggswitch.torch.register_hsdp_all_reduce(model, state) for the replicas"
        )


def register_fsdp_comms(
    model: torch.nn.Module,
    state: AggSwitchState,
    *,
    reduce_scatter: bool = True,
    all_gather: bool = True,
) -> None:
    """Sends the gradient reduce-scatter and the parameter all-gather of
    every FSDPModule in ``model`` (the root and each ``fully_shard``-ed
    block) through the switch. Call it after ``fully_shard`` and before the
    first forward. The state's job spans FSDP's process group (one rank per
    member); its dtype must be FSDP's reduce dtype. Results are bit-identical
    on every rank and from run to run.

    Raises ``ValueError`` when ``model`` has no FSDPModule and
    ``UnsupportedError`` for native 2-D HSDP (see ``register_hsdp_all_reduce``).
    """
    mods = _fsdp_modules(model, "register_fsdp_comms")
    _refuse_native_hsdp(mods, "register_fsdp_comms")
    rs, ag = SwitchReduceScatter(state), SwitchAllGather(state)
    for m in mods:
        if reduce_scatter:
            m.set_custom_reduce_scatter(rs)
        if all_gather:
            m.set_custom_all_gather(ag)


class _ReplicaAllReduce:
    """FSDP's all-reduce hook for HSDP: the reduce-scatter output (this
    rank's gradient shard, averaged over its shard group) averaged over the
    replicas, summed in the switch."""

    def __init__(self, state: AggSwitchState) -> None:
        self._state = state

    def __call__(self, reduce_output: torch.Tensor) -> None:
        state = self._state
        want = _JOB_TORCH_DTYPE[state.dtype]
        if reduce_output.dtype != want:
            raise UnsupportedError(
                f"aggswitch HSDP all-reduce: FSDP reduces {reduce_output.dtype} but the job "
                f"{state.job} is {state.dtype}; set MixedPrecisionPolicy(reduce_dtype={want}) "
                "or declare the job with the reduce dtype"
            )
        replicas = state.world_size
        host = _host(reduce_output)

        def work() -> None:
            state._reduce_sum(host)
            host.div_(replicas)

        _submit(state, work, False, _copy_back(host, reduce_output))


def register_hsdp_all_reduce(model: torch.nn.Module, state: AggSwitchState) -> None:
    """HSDP through the switch: each gradient shard is averaged across the
    replicas (the nodes) by an all-reduce in the switch, set as every
    FSDPModule's all-reduce hook. Shard the model within a node with
    ``fully_shard(..., mesh=mesh["shard"])`` (a 1-D mesh; start every
    replica from the same weights) and make the state's job the replica
    group of this rank's shard: ``rank``/``world_size`` (or ``group=``) its
    replicate group's, one job per shard index (``job=base + shard_rank``).
    The reduce-scatter within a node stays on the process group unless
    ``register_fsdp_comms`` is called too (with another job).
    """
    mods = _fsdp_modules(model, "register_hsdp_all_reduce")
    _refuse_native_hsdp(mods, "register_hsdp_all_reduce")
    if state._group is None and (state._rank is None or state._world_size is None):
        raise ValueError(
            "aggswitch register_hsdp_all_reduce: the state's job is the replica group, not the "
            "world; make it with group=mesh['replicate'].get_group() (or rank= and world_size=)"
        )
    hook = _ReplicaAllReduce(state)
    for m in mods:
        m.set_all_reduce_hook(hook)


# --- Gradient noise scale (issue 23) --------------------------------------------
#
# The switch of a `stats = true` job measures, per collective, Σᵢ‖gᵢ‖² and
# ‖Σᵢ gᵢ‖² of the raw (not yet averaged) sums, in float64 in one order
# (docs/PROTOCOL.md, "Gradient statistics"). Both are additive over disjoint
# parameter sets, so a step's numbers are the sums over its buckets. The
# estimator turns them into McCandlish et al.'s |G|² and tr Σ; the policy
# turns B_noise into a batch size and a learning rate. Nothing here talks to
# the network: the hooks above hand the numbers over.


class GradientNoiseScale:
    """The gradient noise scale B_noise = tr Σ / |G|² (McCandlish et al.,
    "An Empirical Model of Large-Batch Training", 2018, appendix A), from the
    switch's per-collective statistics: no extra traffic, every rank alike.

    With n ranks each computing its local gradient gᵢ as the mean over
    ``batch_per_rank`` = b samples, B_small = b and B_big = n·b, and the
    switch's S = Σᵢ‖gᵢ‖² and Q = ‖Σᵢ gᵢ‖² give |G_small|² ≈ S/n and
    |G_big|² = Q/n². The two unbiased estimators are then

        |G|²  ≈ (B_big |G_big|² − B_small |G_small|²) / (B_big − B_small)
              = (Q − S) / (n (n − 1))
        tr Σ  ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)
              = b (n S − Q) / (n (n − 1))

    (tr Σ is the per-sample covariance's trace; each step's values are
    unbiased but noisy, |G|² can come out negative). As the paper does, both
    are smoothed separately with an exponential moving average (factor
    ``beta``, bias-corrected as Adam's moments) and B_noise is the ratio of
    the averages.

    Feeding: ``GradientNoiseScale(state, batch_per_rank=b)`` attaches to an
    ``AggSwitchState``; its DDP hooks (``allreduce_hook`` and the compress
    hooks) then add each bucket's statistics. A step ends when the user
    calls ``step()``, after ``backward()`` has returned (DDP waits for every
    bucket before it returns, so all of the step's buckets are in) and
    before the next ``backward()``. An explicit call rather than counting
    buckets, because DDP rebuilds its buckets after the first iteration and
    ``no_sync()`` backwards send none. With gradient accumulation b is the
    samples per rank per synchronised step. The job must be declared
    ``stats = true`` on the switch, else the first bucket fails with an error
    that says so. Without a state (``state=None``) feed ``add()`` directly.

    For the compress hooks the switch sums g/n in bf16/fp16: the statistics
    are multiplied back by n² and carry the half-precision rounding of the
    values (about 2⁻⁹ relative per element for bf16).

    After ``step()``: ``noise_scale``, ``grad_sq`` and ``trace`` (smoothed),
    ``last_grad_sq`` and ``last_trace`` (the step's own), ``last_stats``
    (its S, Q, n and bucket count) and ``world_size`` (n).
    """

    def __init__(
        self,
        state: "AggSwitchState | None" = None,
        *,
        batch_per_rank: int,
        beta: float = 0.95,
    ) -> None:
        if not (0.0 <= beta < 1.0):
            raise ValueError(f"GradientNoiseScale: beta={beta} must be in [0, 1) (0: no smoothing)")
        self.batch_per_rank = batch_per_rank  # checked by the setter
        self.beta = float(beta)
        self._lock = threading.Lock()
        self._pending: list[float] = [0.0, 0.0]  # this step's S and Q so far
        self._pending_n: int | None = None
        self._pending_buckets = 0
        self._ema = [0.0, 0.0]  # EMA of |G|², of tr Σ (not bias-corrected)
        self.steps = 0
        self.world_size: int | None = None
        # The last step's raw numbers: its S, Q, n, and its unsmoothed |G|², tr Σ.
        self.last_stats: dict | None = None
        self.last_grad_sq: float | None = None
        self.last_trace: float | None = None
        if state is not None:
            if state._gns is not None:
                raise ValueError(f"{state!r} already feeds a GradientNoiseScale; make one per state")
            state._gns = self

    @property
    def batch_per_rank(self) -> int:
        """B_small: samples per rank in the step being measured. Set it when
        the batch changes (AdaptiveBatch does), before that step's backward."""
        return self._batch

    @batch_per_rank.setter
    def batch_per_rank(self, b: int) -> None:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"GradientNoiseScale: batch_per_rank={b!r} must be a positive int (samples per rank)")
        self._batch = b

    def _add_bucket(self, sum_of_squares: float, square_of_sum: float, n: int) -> None:
        with self._lock:
            if self._pending_n is not None and n != self._pending_n:
                raise ValueError(
                    f"GradientNoiseScale: a bucket covers {n} ranks, an earlier one of this step "
                    f"{self._pending_n}; the job's ranks changed within a step"
                )
            self._pending_n = n
            self._pending[0] += sum_of_squares
            self._pending[1] += square_of_sum
            self._pending_buckets += 1

    def add(self, sum_of_squares: float, square_of_sum: float, n: int) -> None:
        """Adds one collective's statistics (of disjoint parameters) to the
        current step: Σᵢ‖gᵢ‖², ‖Σᵢ gᵢ‖² of the raw sums, over ``n`` ranks."""
        self._add_bucket(float(sum_of_squares), float(square_of_sum), int(n))

    def step(self) -> float | None:
        """Ends the step: folds its buckets into the moving averages and
        returns B_noise (``noise_scale``), or None when no bucket came since
        the last call (a ``no_sync()`` backward). Raises ValueError when the
        job has fewer than 2 ranks (B_big = B_small: nothing to estimate)."""
        with self._lock:
            s, q = self._pending
            n, buckets = self._pending_n, self._pending_buckets
            self._pending, self._pending_n, self._pending_buckets = [0.0, 0.0], None, 0
        if not buckets:
            return None
        assert n is not None
        if n < 2:
            raise ValueError(
                f"GradientNoiseScale: the statistics cover {n} rank; the estimator compares one "
                "rank's gradient with the sum over several and needs at least 2"
            )
        b = self._batch
        grad_sq = (q - s) / (n * (n - 1))
        trace = b * (n * s - q) / (n * (n - 1))
        self.world_size, self.last_grad_sq, self.last_trace = n, grad_sq, trace
        self.last_stats = {"sum_of_squares": s, "square_of_sum": q, "n": n, "buckets": buckets}
        self.steps += 1
        for i, v in enumerate((grad_sq, trace)):
            self._ema[i] = self.beta * self._ema[i] + (1.0 - self.beta) * v
        return self.noise_scale

    @property
    def grad_sq(self) -> float | None:
        """Smoothed |G|² (bias-corrected EMA), None before the first step."""
        return self._debiased(0)

    @property
    def trace(self) -> float | None:
        """Smoothed tr Σ, per-sample (bias-corrected EMA), None before the first step."""
        return self._debiased(1)

    @property
    def noise_scale(self) -> float | None:
        """B_noise = EMA(tr Σ) / EMA(|G|²), in samples: None before the first
        step; ``math.inf`` while the smoothed |G|² is not positive (the
        noise drowns the signal: the estimate says nothing yet)."""
        if self.steps == 0:
            return None
        g, t = self._ema
        if g <= 0.0:
            return math.inf
        return t / g

    def _debiased(self, i: int) -> float | None:
        if self.steps == 0:
            return None
        return self._ema[i] / (1.0 - self.beta**self.steps)

    def __repr__(self) -> str:
        return (
            f"GradientNoiseScale(batch_per_rank={self._batch}, beta={self.beta}, steps={self.steps}, "
            f"noise_scale={self.noise_scale})"
        )


class AdaptiveBatch:
    """Grows the global batch while the gradient noise scale says a larger
    batch is efficient, in the spirit of KungFu's adaptive batch size: after
    each ``GradientNoiseScale.step()``, call ``step()``; when the global
    batch n·b is below B_noise / ``k``, the per-rank batch b is multiplied by
    ``growth`` (at most ``max_batch_per_rank``) and every param group's
    learning rate rescaled from its value at construction: ``"sqrt"``
    (default) lr₀·√(b/b₀), or ``"linear"`` lr₀·b/b₀ (Goyal et al.; with SGD
    and momentum it usually wants a warm-up, which sqrt does without).

    It waits ``warmup`` steps before the first decision and ``patience``
    steps after each change (default for both: 1/(1 − beta) of the
    estimator, the moving average's time constant) so that B_noise reflects
    the current batch. The batch never shrinks: B_noise grows as training
    goes on (McCandlish et al.), and a noisy dip should not undo a step.

    Every rank gets the same statistics, bit for bit, so every rank's
    estimator and policy reach the same B_noise and the same decision: the
    ranks change batch together without exchanging anything. Read
    ``batch_per_rank`` for the next step's per-rank batch (the estimator's
    is updated too). ``step()`` returns a record of the step
    (``step``, ``b_noise``, ``global_batch``, ``batch_per_rank``, ``lr``,
    ``grew``), also logged at DEBUG on ``aggswitch.torch`` (a change at
    INFO).
    """

    def __init__(
        self,
        gns: GradientNoiseScale,
        optimizer: "torch.optim.Optimizer",
        *,
        max_batch_per_rank: int,
        k: float = 1.0,
        growth: float = 2.0,
        lr_scaling: str = "sqrt",
        warmup: int | None = None,
        patience: int | None = None,
    ) -> None:
        if lr_scaling not in ("sqrt", "linear"):
            raise ValueError(f"AdaptiveBatch: lr_scaling={lr_scaling!r}: expected 'sqrt' or 'linear'")
        if not (k > 0):
            raise ValueError(f"AdaptiveBatch: k={k} must be positive (grow while n·b < B_noise / k)")
        if not (growth > 1):
            raise ValueError(f"AdaptiveBatch: growth={growth} must be above 1")
        b0 = gns.batch_per_rank
        if isinstance(max_batch_per_rank, bool) or not isinstance(max_batch_per_rank, int) or max_batch_per_rank < b0:
            raise ValueError(
                f"AdaptiveBatch: max_batch_per_rank={max_batch_per_rank!r} must be an int at least "
                f"the estimator's batch_per_rank ({b0})"
            )
        settle = max(1, round(1.0 / (1.0 - gns.beta)))
        self.warmup = settle if warmup is None else int(warmup)
        self.patience = settle if patience is None else int(patience)
        self.gns, self.optimizer = gns, optimizer
        self.max_batch_per_rank, self.k, self.growth, self.lr_scaling = max_batch_per_rank, float(k), float(growth), lr_scaling
        self._b0 = b0
        self._base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self.steps = 0
        self._last_change = 0

    @property
    def batch_per_rank(self) -> int:
        """The per-rank batch for the next step."""
        return self.gns.batch_per_rank

    @property
    def lr(self) -> float:
        """The first param group's learning rate (as set for the next step)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def _lr_factor(self, b: int) -> float:
        r = b / self._b0
        return math.sqrt(r) if self.lr_scaling == "sqrt" else r

    def step(self) -> dict:
        """Decides the next step's batch and learning rate from the
        estimator's current B_noise; returns this step's record."""
        self.steps += 1
        gns, b = self.gns, self.gns.batch_per_rank
        n = gns.world_size
        b_noise = gns.noise_scale
        rec = dict(
            step=self.steps - 1,
            b_noise=b_noise,
            global_batch=None if n is None else n * b,
            batch_per_rank=b,
            lr=self.lr,
            grew=False,
        )
        settled = self.steps >= self.warmup and self.steps - self._last_change >= self.patience
        if settled and n is not None and b_noise is not None and b < self.max_batch_per_rank and n * b * self.k < b_noise:
            nb = min(self.max_batch_per_rank, max(b + 1, math.ceil(b * self.growth)))
            gns.batch_per_rank = nb
            for g, lr0 in zip(self.optimizer.param_groups, self._base_lrs):
                g["lr"] = lr0 * self._lr_factor(nb)
            self._last_change = self.steps
            rec["grew"] = True
            _log.info(
                "AdaptiveBatch step %d: B_noise %.1f > %g × global batch %d: batch per rank %d -> %d, lr %.4g",
                rec["step"], b_noise, self.k, n * b, b, nb, self.lr,
            )
        _log.debug("AdaptiveBatch %s", rec)
        return rec
