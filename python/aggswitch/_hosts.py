"""The host path: the switch's collectives done by the ranks themselves over
a torch.distributed process group (gloo), with the switch's arithmetic, so
every result is the bits the switch would have returned.

Used by ``aggswitch.torch`` when a job runs with ``mode="hosts"`` (no
switch at all) and when it falls back after the switch failed mid-job.

All-reduce is bandwidth-optimal, as a ring is: the tensor is cut into n
shards (at chunk boundaries, so per-chunk statistics come out as the
switch's), an all-to-all gives rank r every rank's shard r, rank r sums it
in the switch's order (``_native.host_sum``: Rust, the switch's own
element functions), and an all-gather hands the summed shards round. Each
rank sends and receives 2(n−1)/n of the tensor. Reduce-scatter is the
all-to-all and the local sum (the owner's kept shard added as the switch's
worker adds it); all-gather is the process group's. Buffers move as bytes,
so bf16 and f16 never go through gloo's arithmetic.

Invariants: every rank calls these in the same order with the same shapes
(they are collectives on ``group``); nothing here talks to the switch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from . import _native


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def shard_bounds(elems: int, n: int, align: int) -> list[tuple[int, int]]:
    """Rank r's shard of an all-reduce of ``elems`` elements: contiguous,
    in rank order, each a whole number of ``align``-element chunks but the
    last (some may be empty)."""
    chunks = -(-elems // align) if elems else 0
    per = -(-chunks // n) if chunks else 0
    out = []
    for r in range(n):
        a = min(elems, r * per * align)
        b = min(elems, (r + 1) * per * align)
        out.append((a, b))
    return out


def all_reduce(
    t: torch.Tensor,
    rank: int,
    n: int,
    dtype: str,
    group: "dist.ProcessGroup | None",
    *,
    leaf_sizes: list[int] | None = None,
    stats_chunk: int | None = None,
) -> tuple[float, float, int] | None:
    """Sums the CPU-contiguous ``t`` over the group's ``n`` ranks in place,
    in the switch's order. With ``stats_chunk`` (the job's elements per
    chunk), returns the collective's (sum_of_squares, square_of_sum, ranks)
    as the switch's trailers folded in seq order would give them."""
    if stats_chunk is None and n > 1:
        _pipelined_all_reduce(t, rank, n, dtype, group, leaf_sizes)
        return None
    elems, size = t.numel(), t.element_size()
    raw = _bytes(t)
    bounds = shard_bounds(elems, n, stats_chunk or 1)
    lens = [(b - a) * size for a, b in bounds]
    mine = lens[rank]
    gathered_in = torch.empty(n * mine, dtype=torch.uint8)
    if n > 1:
        dist.all_to_all_single(gathered_in, raw, [mine] * n, lens, group=group)
    else:
        gathered_in.copy_(raw)
    a, b = bounds[rank]
    summed = torch.empty(mine, dtype=torch.uint8)
    stats = _native.host_sum(
        gathered_in.numpy(), summed.numpy(), n, dtype, leaf_sizes=leaf_sizes, stats_chunk=stats_chunk
    )
    # Every shard but the last is the same length: pad to it for the gather.
    width = max(lens)
    if n > 1 and width:
        padded = torch.zeros(n * width, dtype=torch.uint8)
        mine_padded = torch.zeros(width, dtype=torch.uint8)
        mine_padded[:mine].copy_(summed)
        dist.all_gather(list(padded.view(n, width).unbind(0)), mine_padded, group=group)
        for r, ln in enumerate(lens):
            if ln:
                s = bounds[r][0] * size
                raw[s : s + ln].copy_(padded[r * width : r * width + ln])
    elif n == 1:
        raw[a * size : b * size].copy_(summed)
    if stats_chunk is None:
        return None
    return _fold_stats(stats, rank, n, group)


# Bytes per piece of a pipelined all-reduce: small enough that several are
# in flight (gloo runs a group's queued operations on its worker threads),
# large enough that each is one efficient transfer. At 1 Gbit/s 1 MiB kept
# the host path at gloo's time and larger pieces did not (docs/BENCHMARKS.md,
# "Surviving the switch"); on unlimited links a busy host favours fewer,
# larger ones (each operation's fixed cost).
_PIECE_BYTES = 1 << 20


def _pipelined_all_reduce(
    t: torch.Tensor, rank: int, n: int, dtype: str, group: Any, leaf_sizes: list[int] | None
) -> None:
    """``all_reduce`` without statistics, in pieces: every piece's
    all-to-all is queued at once, and each piece's all-gather as soon as its
    shard is summed, so the network, the sums and the copies overlap (one
    blocking exchange at a time left the links idle while a rank summed and
    the CPU idle while it waited). Each piece is n equal shards of whole
    elements, so the all-gather lands directly in ``t``; a tail that does
    not divide goes through a padded buffer. The same bytes as the
    unpipelined path: 2(n−1)/n of the tensor each way."""
    size = t.element_size()
    raw = _bytes(t)
    elems = t.numel()
    per_piece = max(n, (_PIECE_BYTES // size) // n * n)
    starts = list(range(0, elems, per_piece))
    sent = []
    for a in starts:
        b = min(elems, a + per_piece)
        lens = [(y - x) * size for x, y in shard_bounds(b - a, n, 1)]
        recv = torch.empty(n * lens[rank], dtype=torch.uint8)
        work = dist.all_to_all_single(
            recv, raw[a * size : b * size], [lens[rank]] * n, lens, group=group, async_op=True
        )
        sent.append((a, b, lens, recv, work))
    gathers = []
    for a, b, lens, recv, work in sent:
        work.wait()
        width = max(lens)
        mine = torch.empty(width, dtype=torch.uint8)
        _native.host_sum(recv.numpy(), mine[: lens[rank]].numpy(), n, dtype, leaf_sizes=leaf_sizes)
        if all(ln == width for ln in lens):
            # Straight into the tensor (a list of outputs would make gloo
            # gather into a buffer of its own and copy out).
            out = raw[a * size : b * size]
            gathers.append((None, dist.all_gather_into_tensor(out, mine, group=group, async_op=True)))
        else:
            padded = torch.empty(n * width, dtype=torch.uint8)
            outs = list(padded.view(n, width).unbind(0))
            gathers.append(((a, lens, padded), dist.all_gather(outs, mine, group=group, async_op=True)))
    for tail, work in gathers:
        work.wait()
        if tail is not None:
            a, lens, padded = tail
            off = a * size
            for r, ln in enumerate(lens):
                raw[off : off + ln].copy_(padded[r * max(lens) : r * max(lens) + ln])
                off += ln


def _fold_stats(mine: list, rank: int, n: int, group) -> tuple[float, float, int]:
    """Every rank's per-chunk statistics, folded in seq order (rank 0's
    chunks first, each rank's in order, from 0.0), as a worker folds the
    trailers: the same float64 bits on every rank."""
    k = torch.tensor([len(mine)], dtype=torch.int64)
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
    if n > 1:
        dist.all_gather(counts, k, group=group)
    else:
        counts = [k]
    width = max(int(c.item()) for c in counts)
    buf = torch.zeros(width, 2, dtype=torch.float64)
    for i, (s, q, _) in enumerate(mine):
        buf[i, 0], buf[i, 1] = s, q
    outs = [torch.zeros(width, 2, dtype=torch.float64) for _ in range(n)]
    if n > 1 and width:
        dist.all_gather(outs, buf, group=group)
    else:
        outs = [buf]
    sos = sq = 0.0
    for r in range(n):
        for i in range(int(counts[r].item())):
            sos += float(outs[r][i, 0].item())
            sq += float(outs[r][i, 1].item())
    return sos, sq, n


def reduce_scatter(
    src: torch.Tensor,
    out: torch.Tensor,
    rank: int,
    n: int,
    dtype: str,
    group: "dist.ProcessGroup | None",
    *,
    owner_keeps: bool,
) -> None:
    """``out`` (m elements) gets this rank's shard of the sum of every
    rank's ``src`` (n·m): the others' rank-order sum rounded, then this
    rank's own added (``owner_keeps``, the worker's default), or all n
    summed in rank order (a stats job, whose owners send their values)."""
    m_bytes = out.numel() * out.element_size()
    recv = torch.empty(n * m_bytes, dtype=torch.uint8)
    if n > 1:
        dist.all_to_all_single(recv, _bytes(src), group=group)
    else:
        recv.copy_(_bytes(src))
    dst = _bytes(out)
    staged = dst if dst.is_contiguous() else torch.empty_like(dst)
    _native.host_sum(
        recv.numpy(), staged.numpy(), n, dtype, owner=rank if (owner_keeps and n > 1) else None
    )
    if staged is not dst:
        dst.copy_(staged)


def all_gather(src: torch.Tensor, out: torch.Tensor, n: int, group: "dist.ProcessGroup | None") -> None:
    """``out`` (n × ``src``) gets every rank's ``src`` bytes, rank r's at r."""
    s, o = _bytes(src), _bytes(out)
    if n > 1 and s.numel():
        dist.all_gather(list(o.view(n, s.numel()).unbind(0)), s.contiguous(), group=group)
    else:
        o.copy_(s)
