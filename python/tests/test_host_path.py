"""The host path (aggswitch._hosts via AggSwitchState): DDP with
mode="hosts" ends with the weights a run through the (loopback) switch
gives, bit for bit, in every dtype; with fallback on, a switch that dies
mid-run is left for the hosts and, once back, rejoined, and the weights are
still those bits. The 4-rank runs through switchd are
tests/tests/torch_fallback.rs."""

import threading
import time

import numpy as np
import pytest

from conftest import SECRET, launch, require_torch

torch = require_torch()

import aggswitch  # noqa: E402
from aggswitch import _native  # noqa: E402

import hosts_ranks  # noqa: E402

WORLD = 4


def _run(address, mode, dtype, steps, gate=None, **kw):
    got = launch(hosts_ranks.ddp_train, WORLD, address, mode, dtype, steps, gate, kw, timeout=240)
    digests = {r["digest"] for r in got}
    assert len(digests) == 1, f"{mode}: ranks ended with different weights: {got}"
    return digests.pop(), sorted(got, key=lambda r: r["rank"])


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_hosts_mode_gives_the_switchs_bits(switch, dtype):
    sw = switch(WORLD, dtype=dtype)
    through_switch, ranks = _run(sw.address, "switch", dtype, 8)
    assert ranks[0]["stats"]["switch_collectives"] >= 8 and ranks[0]["stats"]["host_collectives"] == 0
    on_hosts, ranks = _run(None, "hosts", dtype, 8)
    assert on_hosts == through_switch, f"{dtype}: hosts mode ended with other weights than the switch"
    st = ranks[0]["stats"]
    assert st["path"] == "hosts" and st["host_collectives"] >= 8 and st["switch_collectives"] == 0


def test_host_sum_matches_the_reference_on_ieee_corners():
    # Rank-order sum with -0, subnormals, inf and NaN against numpy's float32
    # rank-order addition (the switch's arithmetic for f32).
    rng = np.random.default_rng(1)
    corners = np.array([-0.0, 0.0, 1e-40, -3e-41, np.inf, -np.inf, np.nan, 1e38, -1e38], dtype=np.float32)
    for n in range(1, 9):
        x = rng.standard_normal((n, 4000)).astype(np.float32)
        x[:, ::7] = rng.choice(corners, size=x[:, ::7].shape)
        want = x[0].copy()
        with np.errstate(invalid="ignore", over="ignore"):
            for r in range(1, n):
                want = want + x[r]
        out = np.empty(4000, dtype=np.float32)
        _native.host_sum(x.view(np.uint8).reshape(-1), out.view(np.uint8), n, "f32")
        same = (out.view(np.uint32) == want.view(np.uint32)) | (np.isnan(out) & np.isnan(want))
        assert same.all(), f"n={n}: {np.flatnonzero(~same)[:5]}"


def test_host_all_reduce_gives_the_switchs_sum_and_statistics():
    # 1000 elements in chunks of 64 over 4 ranks: shards of whole chunks
    # (the last one short), folded in seq order as a worker folds trailers.
    elems, chunk = 1000, 64
    got = sorted(launch(hosts_ranks.host_stats, WORLD, elems, chunk), key=lambda r: r["rank"])
    inputs = [torch.randn(elems, generator=torch.Generator().manual_seed(r)).numpy() for r in range(WORLD)]
    want = inputs[0].copy()
    for x in inputs[1:]:
        want = want + x
    ref = aggswitch.reference_stats(inputs, chunk)
    for r in got:
        assert r["sum"] == want.tobytes(), f"rank {r['rank']}: the sum differs from the rank-order sum"
        s, q, n = r["stats"]
        assert (s, q, n) == (ref["sum_of_squares"], ref["square_of_sum"], ref["n"]), (r["stats"], ref)


def test_default_stats_chunk_is_the_switchs():
    # proto's max_elems_for at the default MTU: 362 float32 in the frame,
    # less the RESULT's 16-byte token and 24-byte statistics trailer.
    assert _native.default_stats_chunk("f32") == 352
    assert _native.default_stats_chunk("bf16") == 704
    assert _native.default_stats_chunk("f16", mtu=9000) == 2 * ((9000 - 50) // 4) - 20
    with pytest.raises(ValueError, match="mtu 60"):
        _native.default_stats_chunk("f32", mtu=60)
    with pytest.raises(ValueError):
        _native.default_stats_chunk("f64")


def test_host_sum_names_a_bad_shape():
    with pytest.raises(ValueError, match="not 3 ranks"):
        _native.host_sum(np.zeros(10, np.uint8), np.zeros(4, np.uint8), 3, "f32")
    with pytest.raises(ValueError, match="owner 5 is not one of the 2 ranks"):
        _native.host_sum(np.zeros(8, np.uint8), np.zeros(4, np.uint8), 2, "f32", owner=5)


def test_probe_says_alive_and_silent(switch):
    sw = switch(2)
    what, gen, _ = _native.probe_switch(sw.address, 1, 0, 2, SECRET, timeout=2.0)
    assert what == "alive" and gen is not None
    assert _native.probe_switch(sw.address, 9, 0, 2, SECRET, timeout=2.0)[0] == "refused"
    assert _native.probe_switch("127.0.0.1:9", 1, 0, 2, SECRET, timeout=0.3) == ("silent", None, None)


def test_a_switch_that_dies_mid_run_is_left_for_the_hosts_and_rejoined(switch):
    """Rank 0 tells the test at step 4; the test closes the switch while the
    ranks go on (a collective fails mid-way: stall or socket error), and at
    step 12 starts a new one on the same port (a restarted switchd: new
    generation, empty job). Every rank finishes, with the uninterrupted
    run's weights, having left the switch once and come back once."""
    from conftest import _CTX

    dtype, steps = "f32", 24
    sw = switch(WORLD, dtype=dtype)
    address = sw.address
    port = int(address.rsplit(":", 1)[1])
    uninterrupted, _ = _run(address, "switch", dtype, steps)

    kill, restart, restarted = _CTX.Event(), _CTX.Event(), _CTX.Event()
    revived = []

    probe_interval = 0.5

    def operator():
        kill.wait(120)
        sw.close()
        restart.wait(120)
        revived.append(aggswitch.LoopbackSwitch(job=1, world_size=WORLD, secret=SECRET, port=port, dtype=dtype))
        # Every rank waits at step 12 while its prober thread goes on: let
        # each see the new switch answer (a probe against the dead one takes
        # up to its 1 s timeout, then probe_interval) before the ranks go
        # on. Without this, the 12 remaining steps on the hosts could end
        # before any prober looked, and no rank would come back.
        time.sleep(2 * (1.0 + probe_interval) + 0.5)
        restarted.set()

    t = threading.Thread(target=operator, daemon=True)
    t.start()
    gate = [(4, kill, None), (12, restart, restarted)]
    got, ranks = _run(address, "switch", dtype, steps, gate, stall_timeout=1.0, probe_interval=probe_interval)
    t.join(10)
    for r in revived:
        r.close()
    assert got == uninterrupted, "the weights after a fallback and a return differ from the uninterrupted run's"
    for r in ranks:
        st = r["stats"]
        assert st["fallbacks"] == 1 and st["returns"] == 1, f"rank {r['rank']}: {st}"
        assert st["host_collectives"] > 0 and st["path"] == "switch", f"rank {r['rank']}: {st}"
        assert "hosts" in r["paths"] and r["paths"][-1] == "switch", r["paths"]
        # The fallback's own timing: the stall it waited out on the switch
        # (stall_timeout 1 s), then the agreement and the collective redone
        # on the hosts, of one of the model's buckets.
        tm = st["last_fallback_timing"]
        assert tm is not None and set(tm) == {"on_switch_s", "agreement_s", "host_collective_s", "bytes"}, tm
        assert 0 < tm["bytes"] and 0 <= tm["agreement_s"] and 0 < tm["host_collective_s"] < 10, tm
        assert tm["on_switch_s"] < 10, tm


def test_a_rank_with_a_wrong_secret_is_named_to_every_rank_within_seconds(switch):
    # Fail-fast: rank 2 is refused at once (bad_secret); the others, which
    # would wait in the join for the whole 30 s join timeout, learn from the
    # vote after the first join slice which rank failed and why.
    sw = switch(WORLD)
    got = sorted(launch(hosts_ranks.join_outcome, WORLD, sw.address, 2, False), key=lambda r: r["rank"])
    for r in got:
        assert r["error"] == "RefusedError" and r["reason"] == "bad_secret", r
        assert r["seconds"] < 10, r
        if r["rank"] != 2:
            assert "rank 2: refused by the switch: bad_secret" in r["message"], r


def test_with_fallback_a_refused_rank_takes_every_rank_to_the_hosts(switch):
    sw = switch(WORLD)
    got = sorted(launch(hosts_ranks.join_outcome, WORLD, sw.address, 1, True), key=lambda r: r["rank"])
    for r in got:
        assert r["error"] is None, r
        st = r["stats"]
        assert st["path"] == "hosts" and st["fallbacks"] == 1 and st["host_collectives"] == 1, st
        reason = st["last_fallback_reason"]
        assert "bad_secret" in reason or "bad secret" in reason, st
        assert r["seconds"] < 10, r
