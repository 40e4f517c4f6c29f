"""Reduce-scatter, all-gather and broadcast against the loopback stand-in
(4 ranks as threads): bit-exact against a numpy reference for float32, bf16
and f16, also through torch tensors; wrong lengths raise ValueError naming
both lengths and the world size; the async forms complete in issue order."""

import numpy as np
import pytest

import aggswitch
from conftest import require_torch, run_ranks
from test_dtypes import bf16_bits_to_f32, f32_to_bf16_bits, reference

WORLD = 4
NP_TYPE = {"f32": np.float32, "bf16": np.uint16, "f16": np.float16}


def inputs_for(dtype, rank, n, salt=0):
    """Values across several binades, so that 16-bit sums round."""
    rng = np.random.default_rng(1000 * salt + rank)
    x = (rng.standard_normal(n) * np.float32(2.0) ** rng.integers(-6, 6, n)).astype(np.float32)
    if dtype == "bf16":
        return f32_to_bf16_bits(x)
    return x.astype(NP_TYPE[dtype])


def sum_reference(dtype, inputs):
    """The switch's rank-order sum (float32: plain float32 adds in rank order)."""
    if dtype == "f32":
        acc = inputs[0].copy()
        for x in inputs[1:]:
            acc = acc + x
        return acc
    return reference(dtype, inputs)


def kept_reference(dtype, inputs, m):
    """Every rank's reduce-scatter shard, concatenated: the other ranks'
    rank-order sum as the switch rounds it, plus the owner's own shard (which
    never left it), added in float32 and rounded again."""
    shards = []
    for r in range(len(inputs)):
        s = slice(r * m, (r + 1) * m)
        partial = sum_reference(dtype, [x[s] for o, x in enumerate(inputs) if o != r])
        own = inputs[r][s]
        if dtype == "bf16":
            shards.append(f32_to_bf16_bits(bf16_bits_to_f32(partial) + bf16_bits_to_f32(own)))
        elif dtype == "f16":
            shards.append((partial.astype(np.float32) + own.astype(np.float32)).astype(np.float16))
        else:
            shards.append(partial + own)
    return np.concatenate(shards)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_reduce_scatter_and_all_gather_are_bit_exact(switch, dtype):
    m = 1001  # shards end mid-chunk: chunks of 300, 300, 300, 101
    sw = switch(WORLD, elems_per_chunk=300, dtype=dtype, drop_every=11)

    def body(w):
        full = inputs_for(dtype, w.rank, WORLD * m)
        shard = np.full(m, 7, dtype=NP_TYPE[dtype])
        assert w.reduce_scatter(full, shard) is shard
        mine = inputs_for(dtype, w.rank, m, salt=1)
        gathered = np.zeros(WORLD * m, dtype=NP_TYPE[dtype])
        assert w.all_gather(mine, gathered) is gathered
        return shard, gathered, w.stats()

    results = run_ranks(sw, WORLD, body, dtype=dtype)
    ins = [inputs_for(dtype, r, WORLD * m) for r in range(WORLD)]
    total = kept_reference(dtype, ins, m)
    # The reference can fail: keeping the shard changes the bits.
    assert total.tobytes() != sum_reference(dtype, ins).tobytes()
    everyone = np.concatenate([inputs_for(dtype, r, m, salt=1) for r in range(WORLD)])
    for rank, (shard, gathered, stats) in results.items():
        want = total[rank * m:(rank + 1) * m]
        assert shard.tobytes() == want.tobytes(), f"{dtype} RS rank {rank}"
        assert gathered.tobytes() == everyone.tobytes(), f"{dtype} AG rank {rank}"
        assert stats["collectives"] == 2
        # Values only for the other ranks' shards (the own one stays home)
        # and, in the all-gather, for the own shard alone: 2 of 4 shards'
        # chunks, resends included.
        assert stats["values_sent"] < stats["chunks_sent"]
        assert stats["chunks_resent"] > 0, "the stand-in dropped datagrams: resends ran"
        assert stats["mismatched_results"] == 0


def test_all_gather_copies_any_bits_and_broadcast_takes_the_roots(switch):
    # NaN payloads and signed zeros of an f16 job come back as sent: the
    # switch copies elements, it never converts them.
    sw = switch(WORLD, dtype="f16")
    odd = np.array([0x7E01, 0xFC00, 0x8000, 0x7C01, 0x0001], dtype=np.uint16)

    def body(w):
        mine = (odd + w.rank).astype(np.uint16).view(np.float16)
        out = np.zeros(WORLD * len(odd), dtype=np.float16)
        w.all_gather(mine, out)
        b = np.full(5, w.rank, dtype=np.float16)
        w.broadcast(b, 2)
        return out.view(np.uint16), b

    for rank, (out, b) in run_ranks(sw, WORLD, body, dtype="f16").items():
        want = np.concatenate([(odd + r).astype(np.uint16) for r in range(WORLD)])
        assert out.tobytes() == want.tobytes(), f"rank {rank}"
        assert b.tolist() == [2.0] * 5


def test_torch_tensors_reduce_scatter_and_all_gather(switch):
    torch = require_torch()
    m = 500
    sw = switch(WORLD, dtype="bf16")

    def body(w):
        g = torch.Generator().manual_seed(w.rank)
        full = torch.randn(WORLD * m, generator=g).to(torch.bfloat16)
        shard = torch.empty(m, dtype=torch.bfloat16)
        w.reduce_scatter(full, shard)
        gathered = torch.empty(WORLD * m, dtype=torch.bfloat16)
        w.all_gather(shard, gathered)
        return full, shard, gathered

    results = run_ranks(sw, WORLD, body, dtype="bf16")
    bits = lambda t: t.view(torch.int16).numpy().view(np.uint16)  # noqa: E731
    total = kept_reference("bf16", [bits(results[r][0]) for r in range(WORLD)], m)
    for rank, (_, shard, gathered) in results.items():
        assert bits(shard).tobytes() == total[rank * m:(rank + 1) * m].tobytes()
        # Gathering the reduce-scattered shards gives every rank the same.
        assert bits(gathered).tobytes() == total.tobytes()


def test_wrong_lengths_name_both_lengths_and_the_world_size(switch):
    sw = switch(2)

    def body(w):
        with pytest.raises(ValueError, match=r"input of 6 and an output of 2 elements.*n = 2 ranks.*output of 3 elements"):
            w.reduce_scatter(np.zeros(6, np.float32), np.zeros(2, np.float32))
        with pytest.raises(ValueError, match=r"5 is not a multiple of 2"):
            w.reduce_scatter(np.zeros(5, np.float32), np.zeros(2, np.float32))
        with pytest.raises(ValueError, match=r"all_gather with an input of 3 and an output of 3 elements.*output of 6 elements"):
            w.all_gather(np.zeros(3, np.float32), np.zeros(3, np.float32))
        with pytest.raises(TypeError, match="all_gather.*job is f32"):
            w.all_gather(np.zeros(3, np.float16), np.zeros(6, np.float32))
        with pytest.raises(ValueError, match="all_gather: buffer is read-only"):
            ro = np.zeros(6, np.float32)
            ro.flags.writeable = False
            w.all_gather(np.zeros(3, np.float32), ro)
        with pytest.raises(ValueError, match="share memory"):
            buf = np.zeros(8, np.float32)
            w.reduce_scatter(buf, buf[4:])
        with pytest.raises(ValueError, match="root 5, but the job's ranks are 0..2"):
            w.broadcast(np.zeros(3, np.float32), 5)
        assert w.stats()["chunks_sent"] == 0, "nothing went on the wire"
        # A read-only input is fine: only the output is written.
        src = np.arange(4, dtype=np.float32)
        src.flags.writeable = False
        out = np.zeros(2, np.float32)
        w.reduce_scatter(src, out)
        return out

    out = run_ranks(sw, 2, body)
    assert out[0].tolist() == [0.0, 2.0] and out[1].tolist() == [4.0, 6.0]


def test_async_forms_complete_in_issue_order(switch):
    m = 300
    sw = switch(WORLD, elems_per_chunk=128)

    def body(w):
        full = inputs_for("f32", w.rank, WORLD * m)
        ar = full.copy()
        shard = np.zeros(m, np.float32)
        gathered = np.zeros(WORLD * m, np.float32)
        # Issued back to back; each runs after the one before it, so the
        # all-gather sends the reduce-scatter's finished shard.
        f1 = w.reduce_scatter_async(full, shard)
        f2 = w.all_reduce_async(ar)
        f1.result(timeout=30)
        f3 = w.all_gather_async(shard, gathered)
        assert f2.result(timeout=30) is ar
        assert f3.result(timeout=30) is gathered
        return ar, gathered

    ins = [inputs_for("f32", r, WORLD * m) for r in range(WORLD)]
    for rank, (ar, gathered) in run_ranks(sw, WORLD, body).items():
        assert ar.tobytes() == sum_reference("f32", ins).tobytes(), f"rank {rank}"
        assert gathered.tobytes() == kept_reference("f32", ins, m).tobytes(), f"rank {rank}"


def test_async_forms_refuse_bad_buffers_at_once(switch):
    sw = switch(1)

    def body(w):
        with pytest.raises(TypeError, match="reduce_scatter"):
            w.reduce_scatter_async(np.zeros(4, np.int32), np.zeros(4, np.float32))
        fut = w.all_gather_async(np.ones(4, np.float32), np.zeros(3, np.float32))
        with pytest.raises(ValueError, match="pass an output of 4 elements"):
            fut.result(timeout=10)
        w.close()
        with pytest.raises(aggswitch.AggSwitchError, match="closed"):
            w.all_gather_async(np.ones(4, np.float32), np.zeros(4, np.float32))

    run_ranks(sw, 1, body)


def test_all_gather_bytes_moves_float32_parameters_through_a_bf16_job(switch):
    # Mixed precision with one job: gradients reduced in bf16, float32
    # parameters gathered as pairs of bf16 elements, bit for bit.
    m = 333
    sw = switch(WORLD, dtype="bf16")

    def body(w):
        mine = np.random.default_rng(w.rank).standard_normal(m).astype(np.float32)
        mine[0] = np.float32("nan") if w.rank == 1 else mine[0]
        out = np.zeros(WORLD * m, np.float32)
        assert w.all_gather_bytes(mine, out) is out
        with pytest.raises(ValueError, match="3 bytes, which is not a whole number of the job's bf16 elements"):
            w.all_gather_bytes(np.zeros(3, np.uint8), np.zeros(3 * WORLD, np.uint8))
        with pytest.raises(ValueError, match=r"output of 8 bytes.*pass an output of 16 bytes"):
            w.all_gather_bytes(np.zeros(1, np.float32), np.zeros(2, np.float32))
        return out

    want = np.concatenate([np.random.default_rng(r).standard_normal(m).astype(np.float32) for r in range(WORLD)])
    want[m] = np.float32("nan")
    for rank, out in run_ranks(sw, WORLD, body, dtype="bf16").items():
        assert out.tobytes() == want.tobytes(), f"rank {rank}"
