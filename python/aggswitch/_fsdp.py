"""FSDP2 (``fully_shard``) and HSDP through the switch:
``SwitchReduceScatter``, ``SwitchAllGather``, ``register_fsdp_comms``,
``register_hsdp_all_reduce`` (with ``_ReplicaAllReduce``) and
``UnsupportedError``. Public through ``aggswitch.torch``.

FSDP2 hands every FSDPModule's gradient reduce-scatter and parameter
all-gather to a comm object (torch's ReduceScatter/AllGather interface). Ours
run the switch's collectives on the state's one background thread, so they
keep the order the ranks issue them in (the same on every rank) and queue
behind any DDP bucket of the same state. Nothing of the protocol is here: the
native Worker does the collectives; this layer checks what FSDP asks for,
lays the buffers out and divides for AVG.

Invariants: the background thread touches host tensors only; copies back
to the device (``_copy_back``, the all-gather's ``finish``) run on the
caller's thread, on the CUDA stream FSDP set for the collective (``_submit``,
``_StateWork``). One state (one job) per FSDP process group.

Layering: imports ``_state`` and ``errors``; ``aggswitch.torch``
re-exports the public names.
"""

# No `from __future__ import annotations`, as in the other modules of the
# torch integration (aggswitch._ddp: DDP checks the hooks' annotations).

import concurrent.futures
from typing import Any, Callable

import torch
import torch.distributed as dist

from ._state import AggSwitchState
from .errors import AggSwitchError


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
