"""Half-precision jobs (bf16, f16) against the loopback stand-in: results are
bit-exact against a numpy reference of widen -> sum in rank order in float32
-> round once; wrong buffers raise TypeError; the bf16 DDP hook returns what
the same reference says."""

import numpy as np
import pytest

import aggswitch
from conftest import SECRET, require_torch, run_ranks


def bf16_bits_to_f32(bits):
    """bf16 bits (uint16) widened to float32: exact."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """float32 rounded to bf16, nearest even (NaN kept a NaN)."""
    u = x.astype(np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16
    nan = np.isnan(x)
    return np.where(nan, (u >> 16) | np.uint32(0x40), rounded).astype(np.uint16)


def reference(dtype, inputs):
    """What the switch computes: widen, sum in rank order in float32, round once."""
    widen = bf16_bits_to_f32 if dtype == "bf16" else (lambda a: a.astype(np.float32))
    acc = widen(inputs[0])
    for x in inputs[1:]:
        acc = acc + widen(x)  # float32 adds, rank 0 first
    return f32_to_bf16_bits(acc) if dtype == "bf16" else acc.astype(np.float16)


def inputs_for(dtype, rank, n):
    """Values across several binades, so that sums round in 16 bits."""
    rng = np.random.default_rng(100 + rank)
    x = (rng.standard_normal(n) * np.float32(2.0) ** rng.integers(-6, 6, n)).astype(np.float32)
    return f32_to_bf16_bits(x) if dtype == "bf16" else x.astype(np.float16)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_half_sums_are_the_reference_bit_for_bit(switch, dtype):
    world, n = 4, 3001
    sw = switch(world, elems_per_chunk=400, dtype=dtype, drop_every=11)
    results = run_ranks(sw, world, lambda w: (w.all_reduce(a := inputs_for(dtype, w.rank, n)), a)[1], dtype=dtype)
    ins = [inputs_for(dtype, r, n) for r in range(world)]
    want = reference(dtype, ins)
    # Rounding after every addition would give other bits: the test can fail.
    each = ins[0]
    for x in ins[1:]:
        each = reference(dtype, [each, x])
    assert each.tobytes() != want.tobytes()
    for rank in range(world):
        assert results[rank].tobytes() == want.tobytes(), f"{dtype} rank {rank}"


@pytest.mark.parametrize("dtype, good, bad", [
    ("bf16", np.uint16, np.float32),
    ("bf16", np.uint16, np.float16),
    ("f16", np.float16, np.uint8),
    ("f32", np.float32, np.float16),
])
def test_a_buffer_of_another_dtype_is_a_type_error(switch, dtype, good, bad):
    sw = switch(1, dtype=dtype)

    def body(w):
        assert w.dtype == dtype
        with pytest.raises(TypeError, match=f"job is {dtype}"):
            w.all_reduce(np.zeros(8, dtype=bad))
        assert w.stats()["chunks_sent"] == 0
        a = np.ones(8, dtype=good)
        w.all_reduce(a)  # the right one still works
        return a

    out = run_ranks(sw, 1, body, dtype=dtype)[0]
    assert out.tobytes() == np.ones(8, dtype=good).tobytes()


def test_the_native_layer_checks_the_buffer_too(switch):
    sw = switch(1, dtype="bf16")

    def body(w):
        with pytest.raises(TypeError, match="bf16 bits"):
            aggswitch._native.Worker.all_reduce(w, np.zeros(4, dtype=np.float32))

    run_ranks(sw, 1, body, dtype="bf16")


def test_a_worker_of_another_dtype_is_refused_naming_its_dtype(switch):
    sw = switch(1, dtype="bf16")
    with pytest.raises(aggswitch.RefusedError, match="dtype f32") as e:
        aggswitch.Worker(sw.address, job=1, rank=0, world_size=1, secret=SECRET, join_timeout=5.0)
    assert e.value.reason == "parameters_differ"


def test_unknown_dtype_is_a_value_error(switch):
    with pytest.raises(ValueError, match="f32, bf16 or f16"):
        switch(1, dtype="fp8")


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_torch_half_tensors_reduce_in_place(switch, dtype):
    torch = require_torch()
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    world, n = 3, 1000
    sw = switch(world, elems_per_chunk=300, dtype=dtype)

    def make(rank):
        g = torch.Generator().manual_seed(rank)
        return (torch.randn(n, generator=g) * 37.0).to(tdtype)

    def body(w):
        t = make(w.rank)
        assert w.all_reduce(t) is t
        return t

    results = run_ranks(sw, world, body, dtype=dtype)
    ins = [make(r).view(torch.int16).numpy().view(np.uint16) for r in range(world)]
    if dtype == "f16":
        ins = [x.view(np.float16) for x in ins]
    want = reference(dtype, ins)
    for rank in range(world):
        got = results[rank].view(torch.int16).numpy().tobytes()
        assert got == want.tobytes(), f"{dtype} rank {rank}"
