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

The process group (gloo) stays in charge of everything else DDP does:
parameter broadcast at construction, barriers, ``find_unused_parameters``
bookkeeping.
"""

# No `from __future__ import annotations`: DDP checks that the hook's
# annotations are the real dist.GradBucket and torch.futures.Future objects.

import concurrent.futures
import os
import threading
from typing import Any, Callable

import torch
import torch.distributed as dist

from . import Worker
from .errors import AggSwitchError

__all__ = [
    "AggSwitchState",
    "state_from_env",
    "allreduce_hook",
    "bf16_compress_hook",
    "fp16_compress_hook",
]


class AggSwitchState:
    """What ``allreduce_hook`` needs: where the switch is, which job, and
    (after the first bucket) the joined ``aggswitch.Worker``.

    ``rank`` and ``world_size`` default to ``torch.distributed``'s. Extra
    keyword arguments go to ``aggswitch.Worker`` (``join_timeout``,
    ``stall_timeout``, ``congestion_control``, ``bind``, ``transport``,
    ``dtype``: the job's element type, which picks the hook: ``"f32"`` for
    ``allreduce_hook``, ``"bf16"`` for ``bf16_compress_hook``, ``"f16"`` for
    ``fp16_compress_hook``).
    """

    def __init__(
        self,
        switch: str,
        job: int,
        secret: str,
        rank: int | None = None,
        world_size: int | None = None,
        **worker_options: Any,
    ) -> None:
        if rank is None or world_size is None:
            if not (dist.is_available() and dist.is_initialized()):
                raise ValueError(
                    "AggSwitchState: rank and world_size come from torch.distributed; "
                    "call torch.distributed.init_process_group('gloo') first, or pass them"
                )
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        _check_secret(secret, "secret")
        self.switch = switch
        self.job = int(job)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self._secret = secret
        self.dtype = str(worker_options.get("dtype", "f32"))
        self._options = worker_options
        self._worker: Worker | None = None
        self._failure: BaseException | None = None
        self._lock = threading.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"aggswitch-ddp-rank{self.rank}"
        )

    def __repr__(self) -> str:
        return (
            f"AggSwitchState(switch={self.switch!r}, job={self.job}, rank={self.rank}, "
            f"world_size={self.world_size}, dtype={self.dtype!r}, joined={self._worker is not None})"
        )

    def __getstate__(self) -> dict:
        # DDP pickles the hook state when the model is copied; a live socket
        # and thread cannot travel, and the secret should not either.
        raise TypeError("AggSwitchState cannot be pickled; make one per process")

    def stats(self) -> dict:
        """The worker's counters (empty before the first bucket)."""
        return self._worker.stats() if self._worker is not None else {}

    def close(self) -> None:
        """Waits for buckets in flight, then leaves the job. Idempotent."""
        self._executor.shutdown(wait=True)
        with self._lock:
            w, self._worker = self._worker, None
        if w is not None:
            w.close()

    def _reduce_mean(self, host: torch.Tensor) -> None:
        """On the background thread: join if needed, sum, divide."""
        self._reduce_sum(host)
        host.div_(self.world_size)

    def _reduce_sum(self, host: torch.Tensor) -> None:
        """On the background thread: join if needed, sum in place."""
        if self._failure is not None:
            raise AggSwitchError(
                f"job {self.job} rank {self.rank}: an earlier bucket failed "
                f"({self._failure}); the ranks are out of step, restart the job"
            )
        try:
            if self._worker is None:
                with self._lock:
                    self._worker = Worker(
                        self.switch,
                        job=self.job,
                        rank=self.rank,
                        world_size=self.world_size,
                        secret=self._secret,
                        **self._options,
                    )
            self._worker.all_reduce(host)
        except BaseException as e:
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


def state_from_env(**worker_options: Any) -> AggSwitchState:
    """An ``AggSwitchState`` from the environment (see the module doc).

    Optional: ``AGGSWITCH_STALL_TIMEOUT`` and ``AGGSWITCH_JOIN_TIMEOUT``
    (seconds). Keyword arguments override them and go to ``aggswitch.Worker``.
    Raises ``ValueError`` naming the variable that is missing or malformed.
    """
    switch = _env("AGGSWITCH_SWITCH", "the switch's address[:port], e.g. 198.18.0.1:48879")
    job_text = _env("AGGSWITCH_JOB", "the job id declared on the switch (1..65535)")
    try:
        job = int(job_text)
    except ValueError:
        raise ValueError(f"AGGSWITCH_JOB={job_text!r}: expected a job id (1..65535)") from None
    secret = os.environ.get("AGGSWITCH_SECRET", "").strip()
    if not secret:
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
    for var, key in (("AGGSWITCH_STALL_TIMEOUT", "stall_timeout"), ("AGGSWITCH_JOIN_TIMEOUT", "join_timeout")):
        text = os.environ.get(var, "").strip()
        if text and key not in worker_options:
            try:
                worker_options[key] = float(text)
            except ValueError:
                raise ValueError(f"{var}={text!r}: expected seconds") from None
    return AggSwitchState(switch, job, secret, **worker_options)


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
    # A CUDA bucket is staged through host memory (untested without a GPU).
    host = tensor if tensor.device.type == "cpu" else tensor.to("cpu")

    def work() -> None:
        state._reduce_mean(host)
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
            work()
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
    compressed = tensor.to(device="cpu", dtype=wire).div_(state.world_size)

    def work() -> None:
        state._reduce_sum(compressed)
        tensor.copy_(compressed)

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
