"""aggswitch: all-reduce float32 tensors through an in-network aggregation
switch.

    import aggswitch
    with aggswitch.Worker("198.18.0.1:48879", job=1, rank=0, world_size=4,
                          secret=HEX) as w:
        w.all_reduce(grad)             # in place: the sum over all ranks
        fut = w.all_reduce_async(g2)   # completes in issue order

The protocol is the Rust worker library's (``aggswitch._native``); this
module adds torch tensors, futures and the context manager. The DDP hook is
``aggswitch.torch``.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

from . import _native
from .errors import (
    AggSwitchError,
    JoinTimeoutError,
    ProtocolError,
    RefusedError,
    StalledError,
    SwitchRestartedError,
    TransportError,
)

DEFAULT_PORT: int = _native.DEFAULT_PORT
LoopbackSwitch = _native.LoopbackSwitch

_EXPECTED = "a writable C-contiguous float32 buffer (numpy.float32 array or CPU torch.float32 tensor)"


def _writable_view(buf: Any) -> Any:
    """What the native layer writes into: ``buf`` itself, or the numpy view
    of a CPU torch tensor (which shares its memory). Raises TypeError or
    ValueError saying what was expected."""
    if type(buf).__module__.startswith("torch") and hasattr(buf, "is_contiguous"):
        if buf.device.type != "cpu":
            raise ValueError(
                f"all_reduce: tensor is on {buf.device}; expected {_EXPECTED} "
                "(copy it to the CPU first; aggswitch.torch's hook does that for you)"
            )
        if str(buf.dtype) != "torch.float32":
            raise TypeError(f"all_reduce: tensor has dtype {buf.dtype}; expected {_EXPECTED}")
        if not buf.is_contiguous():
            raise ValueError(
                "all_reduce: tensor is not contiguous; pass tensor.contiguous() "
                "and copy the result back"
            )
        return buf.detach().numpy()
    try:
        view = memoryview(buf)
    except TypeError:
        raise TypeError(
            f"all_reduce: expected {_EXPECTED}, got {type(buf).__name__}"
        ) from None
    with view:
        if view.format not in ("f", "<f", "=f") or view.itemsize != 4:
            raise TypeError(
                f"all_reduce: buffer holds items of format {view.format!r} "
                f"({view.itemsize} bytes); expected {_EXPECTED}"
            )
        if view.readonly:
            raise ValueError("all_reduce: buffer is read-only; the sum is written in place")
        if not view.c_contiguous:
            raise ValueError(
                "all_reduce: buffer is not C-contiguous; pass numpy.ascontiguousarray(x) "
                "and copy the result back"
            )
    return buf


class Worker(_native.Worker):
    """A member of a job on the switch.

    ``Worker(switch, job, rank, world_size, secret, *, join_timeout=30.0,
    stall_timeout=5.0, congestion_control=True, bind=None, transport="auto")``
    joins and returns once every rank has joined (the GIL is released while
    it waits). ``switch`` is ``"address[:port]"`` (port 48879 by default),
    ``secret`` the job's 64 hex digits. ``transport`` picks the UDP data
    path: ``"udp-gso"`` (DATA coalesced with UDP_SEGMENT, RESULTs received
    with UDP_GRO), ``"mmsg"`` (one datagram per message) or ``"auto"``
    (udp-gso when the kernel takes it, else mmsg); ``.transport`` says which
    one runs. A forced transport the kernel refuses raises
    ``TransportError``. A context manager: leaving the block closes it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The native constructor (__new__) has joined already.
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def all_reduce(self, buf: Any) -> Any:
        """Sums ``buf`` over every rank of the job, in place, and returns it.

        ``buf`` is a writable C-contiguous float32 buffer: a numpy array or a
        CPU torch tensor. Every rank must call with the same length, in the
        same order. Blocks with the GIL released.
        """
        super().all_reduce(_writable_view(buf))
        return buf

    def all_reduce_async(self, buf: Any) -> concurrent.futures.Future:
        """Starts ``all_reduce(buf)`` on this worker's background thread and
        returns a ``concurrent.futures.Future`` that resolves to ``buf``.

        Collectives run one at a time in the order they were issued, so
        several may be in flight while the caller computes. ``buf`` must not
        be touched until the future is done.
        """
        view = _writable_view(buf)  # refuse bad buffers now, not in the future
        with self._lock:
            if self.closed:
                raise AggSwitchError(f"{self!r} is closed; make a new Worker to rejoin")
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=f"aggswitch-rank{self.rank}"
                )
            return self._executor.submit(self._reduce_returning, view, buf)

    def _reduce_returning(self, view: Any, buf: Any) -> Any:
        _native.Worker.all_reduce(self, view)
        return buf

    def close(self) -> None:
        """Waits for collectives in flight, then leaves the job. Idempotent."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        super().close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "Worker",
    "LoopbackSwitch",
    "DEFAULT_PORT",
    "AggSwitchError",
    "RefusedError",
    "JoinTimeoutError",
    "StalledError",
    "SwitchRestartedError",
    "TransportError",
    "ProtocolError",
]
