"""The PyTorch DDP communication hooks: ``allreduce_hook``,
``bf16_compress_hook`` and ``fp16_compress_hook``. Public through
``aggswitch.torch``.

``allreduce_hook``: every bucket is all-reduced on the state's one
background thread, in the order DDP hands them over (the same on every
rank), while backward goes on. The result is the mean over ranks, as DDP's
default hook gives, bit-identical on every rank.

``bf16_compress_hook`` (and ``fp16_compress_hook``) send half the bytes:
like PyTorch's hooks of the same names, each bucket is cast to bfloat16
(float16) and divided by the world size, summed in the switch (in float32,
rounded once), and cast back into the bucket. The state's dtype must be
the hook's (``"f32"``, ``"bf16"``, ``"f16"``).

Invariants: a hook returns at once; its future completes (or fails, with
the aggswitch exception, which DDP's ``backward()`` raises as a
RuntimeError naming it) on the state's thread. After each bucket the hooks
feed the state's ``GradientNoiseScale``, if one is attached.

Layering: imports ``_state``; ``aggswitch.torch`` re-exports the hooks.
"""

# No `from __future__ import annotations`: DDP checks that the hook's
# annotations are the real dist.GradBucket and torch.futures.Future objects.

from typing import Callable

import torch
import torch.distributed as dist

from ._state import AggSwitchState


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
