"""aggswitch: all-reduce float32, bfloat16 or float16 tensors through an
in-network aggregation switch.

    import aggswitch
    with aggswitch.Worker("198.18.0.1:48879", job=1, rank=0, world_size=4,
                          secret=HEX) as w:
        w.all_reduce(grad)             # in place: the sum over all ranks
        fut = w.all_reduce_async(g2)   # completes in issue order
        w.reduce_scatter(full, shard)  # shard = this rank's part of the sum
        w.all_gather(shard, full)      # full = every rank's shard, in order

A job declared ``stats = true`` also gets, with every all-reduce and
reduce-scatter, what the switch measured while summing (the gradient noise
scale's inputs, at no extra traffic)::

        w.all_reduce(grad)
        s = w.gradient_stats()  # {"sum_of_squares": Σᵢ‖gᵢ‖², "square_of_sum": ‖Σᵢ gᵢ‖², "n": ranks}

A job of half-precision gradients is declared with ``dtype = "bf16"`` (or
``"f16"``) on the switch and joined with ``Worker(..., dtype="bf16")``; its
tensors are CPU ``torch.bfloat16``/``torch.float16`` tensors, numpy
``float16`` arrays, or numpy ``uint16`` arrays holding bf16 bits (numpy has no
bfloat16). The switch sums them in float32 and rounds once.

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
    GradientStatsError,
    JoinTimeoutError,
    ProtocolError,
    QuotaError,
    RefusedError,
    StalledError,
    SwitchRestartedError,
    TransportError,
)

DEFAULT_PORT: int = _native.DEFAULT_PORT
LoopbackSwitch = _native.LoopbackSwitch
reference_stats = _native.reference_stats

_EXPECTED = {
    "f32": "a writable C-contiguous float32 buffer (numpy.float32 array or CPU torch.float32 tensor)",
    "bf16": "a writable C-contiguous buffer of bf16 bits (numpy.uint16 array or CPU torch.bfloat16 tensor)",
    "f16": "a writable C-contiguous float16 buffer (numpy.float16 array or CPU torch.float16 tensor)",
}
# torch dtype a tensor must have, and buffer formats (struct syntax, any
# byte-order prefix of native little-endian) taken, per job dtype.
_TORCH_DTYPE = {"f32": "torch.float32", "bf16": "torch.bfloat16", "f16": "torch.float16"}
_FORMATS = {"f32": ("f",), "bf16": ("H",), "f16": ("e",)}


def _writable_view(
    buf: Any, dtype: str = "f32", call: str = "all_reduce", writable: bool = True
) -> Any:
    """What the native layer reads or writes: ``buf`` itself for float32, a
    uint16 memoryview of the same memory for bf16/f16, or the view of a CPU
    torch tensor's memory. Raises TypeError (wrong element type) or
    ValueError (wrong device, read-only when ``writable``, not contiguous)
    saying what was expected; messages start with ``call``."""
    expected = _EXPECTED[dtype]
    if type(buf).__module__.startswith("torch") and hasattr(buf, "is_contiguous"):
        if buf.device.type != "cpu":
            raise ValueError(
                f"{call}: tensor is on {buf.device}; expected {expected} "
                "(copy it to the CPU first; aggswitch.torch's hook does that for you)"
            )
        if str(buf.dtype) != _TORCH_DTYPE[dtype]:
            raise TypeError(
                f"{call}: tensor has dtype {buf.dtype}, but this worker's job is "
                f"{dtype}; expected {expected}"
            )
        if not buf.is_contiguous():
            raise ValueError(
                f"{call}: tensor is not contiguous; pass tensor.contiguous() "
                "and copy the result back"
            )
        if dtype == "f32":
            return buf.detach().numpy()
        # numpy cannot hold bfloat16: hand over the bits, same memory.
        import torch

        buf = buf.detach().view(torch.int16).numpy()
        return memoryview(buf).cast("B").cast("H")
    try:
        view = memoryview(buf)
    except TypeError:
        raise TypeError(f"{call}: expected {expected}, got {type(buf).__name__}") from None
    fmt, itemsize = view.format, view.itemsize
    readonly, contiguous = view.readonly, view.c_contiguous
    base = fmt.lstrip("<=@")
    ok = base in _FORMATS[dtype] and itemsize == (4 if dtype == "f32" else 2)
    readonly = readonly and writable
    if not ok or readonly or not contiguous or dtype == "f32" or base == "H":
        view.release()
    if not ok:
        raise TypeError(
            f"{call}: buffer holds items of format {fmt!r} ({itemsize} bytes), "
            f"but this worker's job is {dtype}; expected {expected}"
        )
    if readonly:
        raise ValueError(f"{call}: buffer is read-only; the result is written into it")
    if not contiguous:
        raise ValueError(
            f"{call}: buffer is not C-contiguous; pass numpy.ascontiguousarray(x) "
            "and copy the result back"
        )
    if dtype == "f32" or base == "H":
        return buf
    # float16 items: the same memory as uint16 bits.
    return view.cast("B").cast("H")


def _byte_view(buf: Any, role: str, writable: bool) -> Any:
    """The bytes of ``buf`` (a C-contiguous numpy array, CPU torch tensor or
    other buffer) as a ``memoryview`` of format "B", the same memory."""
    if type(buf).__module__.startswith("torch") and hasattr(buf, "is_contiguous"):
        if buf.device.type != "cpu" or not buf.is_contiguous():
            raise ValueError(
                f"all_gather_bytes: the {role} must be a contiguous CPU tensor, got one on "
                f"{buf.device} (contiguous: {buf.is_contiguous()})"
            )
        import torch

        buf = buf.detach().reshape(-1).view(torch.uint8).numpy()
    try:
        view = memoryview(buf)
    except TypeError:
        raise TypeError(
            f"all_gather_bytes: the {role} must support the buffer protocol, got "
            f"{type(buf).__name__}"
        ) from None
    if not view.c_contiguous:
        raise ValueError(f"all_gather_bytes: the {role} is not C-contiguous; pass a contiguous copy")
    if writable and view.readonly:
        raise ValueError(f"all_gather_bytes: the {role} is read-only")
    return view.cast("B")


class Worker(_native.Worker):
    """A member of a job on the switch.

    ``Worker(switch, job, rank, world_size, secret, *, join_timeout=30.0,
    stall_timeout=5.0, congestion_control=True, bind=None, dtype="f32",
    transport="auto", threads="auto")`` joins and returns once every rank has joined (the GIL
    is released while it waits). ``dtype`` is the job's element type:
    ``"f32"``, ``"bf16"`` or ``"f16"``; the switch refuses a worker whose
    dtype is not the job's. ``switch`` is ``"address[:port]"`` (port 48879 by
    default), ``secret`` the job's 64 hex digits. ``transport`` picks the UDP
    data path: ``"udp-gso"`` (DATA coalesced with UDP_SEGMENT, RESULTs
    received with UDP_GRO), ``"mmsg"`` (one datagram per message) or
    ``"auto"`` (udp-gso when the kernel takes it, else mmsg); ``.transport``
    says which one runs. A forced transport the kernel refuses raises
    ``TransportError``. ``threads`` (``"auto"``, the default, or 1..64):
    the threads that carry each collective, each with its own socket,
    window and share of the chunks, with a sum bit-identical to one
    thread's; ``"auto"`` picks them from the tensor's size and the cores
    this process may use. More than one needs a switch with ``seq_lanes``
    of at least that many that grants lane replies; otherwise the worker
    runs one. A context manager: leaving the block closes it.

    A self-provisioned job (a tenant the operator declared on the switch):
    ``Worker(switch, job=0, rank=r, world_size=n, secret="", tenant="T",
    tenant_key_file="F", job_name="NAME")``; the switch creates the job on
    the first rank's request and ``.job`` is the id it gave. A tenant at
    its quota raises ``QuotaError`` (``.quota`` names it).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The native constructor (__new__) has joined already.
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def all_reduce(self, buf: Any) -> Any:
        """Sums ``buf`` over every rank of the job, in place, and returns it.

        ``buf`` is a writable C-contiguous buffer of the job's dtype: for f32
        a numpy float32 array or CPU torch.float32 tensor; for bf16 a numpy
        uint16 array of bf16 bits or a CPU torch.bfloat16 tensor; for f16 a
        numpy float16 array or CPU torch.float16 tensor. Another element type
        raises TypeError. Every rank must call with the same length, in the
        same order. Blocks with the GIL released.
        """
        super().all_reduce(_writable_view(buf, self.dtype))
        return buf

    def reduce_scatter(self, input: Any, output: Any) -> Any:
        """Reduce-scatter: ``input`` holds ``world_size`` shards of m
        elements (shard r for rank r); ``output`` (m elements) gets this
        rank's shard of the element-wise sum over every rank, the same bits
        ``all_reduce`` gives for those elements. Returns ``output``.

        The sum only: for an average (FSDP's default) divide ``output`` by
        ``world_size`` afterwards, so every rank divides the same bits the
        same way. Buffers as for ``all_reduce`` (``input`` may be
        read-only); they must not share memory. A wrong length raises
        ValueError naming both lengths and the world size. A job declared on
        an aggregation tree refuses it (RefusedError, reason
        ``"kind_not_supported"``).
        """
        _native.Worker.reduce_scatter(self, *self._views("reduce_scatter", input, output))
        return output

    def all_gather(self, input: Any, output: Any) -> Any:
        """All-gather: ``output`` (``world_size`` × m elements) gets every
        rank's ``input`` (m elements), rank r's at ``r * m``, bit for bit
        (the switch copies elements, never converting them). This rank's own
        shard is copied locally. Returns ``output``."""
        _native.Worker.all_gather(self, *self._views("all_gather", input, output))
        return output

    def all_gather_bytes(self, input: Any, output: Any) -> Any:
        """``all_gather`` of raw memory: ``output`` (``world_size`` times the
        bytes of ``input``) gets every rank's ``input`` bytes, rank r's at
        ``r * len(input)``. Any element type goes, as long as ``input`` is a
        whole number of the job's elements: e.g. float32 parameters through a
        bf16 job (mixed precision with one job). Returns ``output``."""
        src, dst = _byte_view(input, "input", False), _byte_view(output, "output", True)
        _native.Worker.all_gather_bytes(self, src, dst)
        return output

    def broadcast(self, buf: Any, root: int) -> Any:
        """Every rank's ``buf`` becomes rank ``root``'s, bit for bit (an
        all-gather with one owner). Returns ``buf``."""
        view = _writable_view(buf, self.dtype, "broadcast", writable=root != self.rank)
        _native.Worker.broadcast(self, view, root)
        return buf

    def gradient_stats(self) -> dict[str, Any]:
        """The gradient statistics of the last completed all-reduce or
        reduce-scatter of a ``stats = true`` job: ``{"sum_of_squares":
        Σᵢ‖gᵢ‖², "square_of_sum": ‖Σᵢ gᵢ‖², "n": ranks}`` (floats in float64,
        the same bits on every rank, of the raw sum: divide for an average).
        A reduce-scatter's cover its whole input, every shard. Raises
        ``GradientStatsError`` (``.reason``: ``"not_a_stats_job"``,
        ``"no_collective"``, ``"not_summed"`` or ``"incomplete"``) when
        there are none. For a
        collective started with ``*_async``, use its future's
        ``gradient_stats()``: later ones may have completed since."""
        return super().gradient_stats()

    def all_reduce_async(self, buf: Any) -> concurrent.futures.Future:
        """Starts ``all_reduce(buf)`` on this worker's background thread and
        returns a ``concurrent.futures.Future`` that resolves to ``buf``.
        Its ``gradient_stats()`` gives that all-reduce's statistics once it
        is done (as ``Worker.gradient_stats()``, raising the same errors).

        Collectives run one at a time in the order they were issued (one
        thread per Worker: the protocol has one sequence of chunks per
        rank, so two collectives of one Worker can never run at once), so
        several may be in flight while the caller computes. ``buf`` must not
        be touched until the future is done.
        """
        view = _writable_view(buf, self.dtype)  # refuse bad buffers now, not in the future
        return self._submit(_native.Worker.all_reduce, (view,), buf)

    def reduce_scatter_async(self, input: Any, output: Any) -> concurrent.futures.Future:
        """``reduce_scatter(input, output)`` on the background thread, in
        issue order with the other ``*_async`` calls; the future resolves to
        ``output``. Neither buffer may be touched until it is done."""
        views = self._views("reduce_scatter", input, output)
        return self._submit(_native.Worker.reduce_scatter, views, output)

    def all_gather_async(self, input: Any, output: Any) -> concurrent.futures.Future:
        """``all_gather(input, output)`` on the background thread, in issue
        order with the other ``*_async`` calls; the future resolves to
        ``output``."""
        views = self._views("all_gather", input, output)
        return self._submit(_native.Worker.all_gather, views, output)

    def _views(self, call: str, input: Any, output: Any) -> tuple[Any, Any]:
        return (
            _writable_view(input, self.dtype, call, writable=False),
            _writable_view(output, self.dtype, call),
        )

    def _submit(self, fn: Any, args: tuple[Any, ...], result: Any) -> concurrent.futures.Future:
        # The collective's own statistics, taken on the executor's one thread
        # right after it, before the next queued collective can start.
        taken: dict[str, Any] = {}
        with self._lock:
            if self.closed:
                raise AggSwitchError(f"{self!r} is closed; make a new Worker to rejoin")
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=f"aggswitch-rank{self.rank}"
                )
            fut = self._executor.submit(self._call_returning, fn, args, result, taken)

        def gradient_stats() -> dict[str, Any]:
            fut.result()  # waits; raises the collective's error
            if "error" in taken:
                raise taken["error"]
            return dict(taken["stats"])

        fut.gradient_stats = gradient_stats  # type: ignore[attr-defined]
        return fut

    def _call_returning(
        self, fn: Any, args: tuple[Any, ...], result: Any, taken: dict[str, Any]
    ) -> Any:
        fn(self, *args)
        try:
            taken["stats"] = _native.Worker.gradient_stats(self)
        except GradientStatsError as e:
            taken["error"] = e
        return result

    def close(self, *, for_hosts: bool = False) -> None:
        """Waits for collectives in flight, then leaves the job. Idempotent.
        ``for_hosts``: the job goes on without the switch (the host path);
        the LEAVE says so and a live switch counts it."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        super().close(for_hosts=for_hosts)

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
    "QuotaError",
    "JoinTimeoutError",
    "StalledError",
    "SwitchRestartedError",
    "TransportError",
    "ProtocolError",
    "GradientStatsError",
    "reference_stats",
]
