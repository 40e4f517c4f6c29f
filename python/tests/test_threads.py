"""One collective over several worker threads (``threads=``,
``AGGSWITCH_THREADS``; docs/design/worker-threads.md) through the loopback
stand-in: the sums stay bit-identical to one thread's whatever the count,
against a switch with enough seq lanes and against one without, and a bad
count is refused naming what to give. The switchd runs are
tests/tests/worker_threads.rs."""

import pytest

import aggswitch
from conftest import SECRET, require_torch, run_ranks
from test_worker import pattern, rank_order_sum


def _sums(sw, world, n, iterations, **options):
    """Every rank's outputs of ``iterations`` all-reduces of ``pattern``,
    and the threads that carried the last and whether the switch granted
    lane replies."""

    def body(w):
        outs = []
        for it in range(iterations):
            a = pattern(w.rank, it, n)
            w.all_reduce(a)
            outs.append(a.copy())
        return outs, w.threads, w.lane_replies

    return run_ranks(sw, world, body, **options)


@pytest.mark.parametrize("world, threads", [(2, 2), (3, 2), (4, 2), (4, 4)])
def test_threads_sum_bit_for_bit_as_one_thread_does(switch, world, threads):
    # 4 lanes: every count asked for fits; 20_001 elements are 201 chunks,
    # an odd number, so the threads' shares differ by one and the last
    # chunk is short.
    sw = switch(world, elems_per_chunk=100, seq_lanes=4)
    n = 20_001
    got = _sums(sw, world, n, 2, threads=threads)
    for rank, (outs, ran, lane_replies) in got.items():
        assert (ran, lane_replies) == (threads, True), f"rank {rank}"
        for it in range(2):
            want = rank_order_sum(world, it, n).tobytes()
            assert outs[it].tobytes() == want, f"{threads} threads, rank {rank}, iteration {it}"


def test_threads_under_loss_at_the_switch_stay_bit_exact(switch):
    sw = switch(4, elems_per_chunk=50, seq_lanes=4, drop_every=7)
    n = 8_003

    def body(w):
        a = pattern(w.rank, 0, n)
        w.all_reduce(a)
        return a, w.stats(), w.threads

    results = run_ranks(sw, 4, body, threads=2)
    want = rank_order_sum(4, 0, n).tobytes()
    for rank, (got, _, ran) in results.items():
        assert got.tobytes() == want, f"rank {rank}"
        assert ran == 2, f"rank {rank}"
    assert sum(s["chunks_resent"] for _, s, _ in results.values()) > 0, "drop_every=7 must force resends"


def test_more_threads_than_the_switch_has_lanes_still_sum_bit_for_bit(switch):
    # A switch of one lane grants no lane replies: the worker runs one
    # thread, with the same sum.
    sw = switch(3, elems_per_chunk=100, seq_lanes=1)
    n = 10_001
    got = _sums(sw, 3, n, 1, threads=4)
    want = rank_order_sum(3, 0, n).tobytes()
    for rank, (outs, ran, lane_replies) in got.items():
        assert outs[0].tobytes() == want, f"rank {rank}"
        assert (ran, lane_replies) == (1, False), f"rank {rank}"


def test_threads_are_clamped_to_the_switchs_lanes(switch):
    # 4 asked, 2 lanes: 2 carry each collective.
    sw = switch(2, elems_per_chunk=100, seq_lanes=2)
    n = 10_001
    got = _sums(sw, 2, n, 1, threads=4)
    want = rank_order_sum(2, 0, n).tobytes()
    for rank, (outs, ran, lane_replies) in got.items():
        assert outs[0].tobytes() == want, f"rank {rank}"
        assert (ran, lane_replies) == (2, True), f"rank {rank}"


@pytest.mark.parametrize("threads", ["auto", None, 1, 64])
def test_auto_and_counts_in_range_are_taken(switch, threads):
    sw = switch(1)
    with aggswitch.Worker(sw.address, job=1, rank=0, world_size=1, secret=SECRET, threads=threads) as w:
        assert (w.threads, w.lane_replies) == (1, False), "before the first collective, one lane"
        a = pattern(0, 0, 500)
        w.all_reduce(a)
        assert a.tobytes() == rank_order_sum(1, 0, 500).tobytes()
        assert w.threads == 1


@pytest.mark.parametrize("bad, error", [
    (0, ValueError),
    (65, ValueError),
    (-2, ValueError),
    ("two", ValueError),
    ("4", ValueError),
    (True, TypeError),
    (2.0, TypeError),
])
def test_a_bad_thread_count_is_refused_saying_what_to_give(switch, bad, error):
    sw = switch(1)
    with pytest.raises(error, match='threads.*give "auto" or a thread count from 1 to 64'):
        aggswitch.Worker(sw.address, job=1, rank=0, world_size=1, secret=SECRET, threads=bad)


def test_the_ddp_hook_runs_its_buckets_on_the_threads_of_the_state(switch):
    torch = require_torch()
    import torch.distributed as dist

    import aggswitch.torch as agt
    from conftest import free_port

    sw = switch(1, seq_lanes=2)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(20, 300), torch.nn.ReLU(), torch.nn.Linear(300, 3))
    model = torch.nn.Sequential(torch.nn.Linear(20, 300), torch.nn.ReLU(), torch.nn.Linear(300, 3))
    model.load_state_dict(ref.state_dict())
    x, y = torch.randn(16, 20), torch.randint(3, (16,))
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        state = agt.AggSwitchState(sw.address, job=1, secret=SECRET, threads=2)
        ddp.register_comm_hook(state, agt.allreduce_hook)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            assert torch.equal(p.grad, q.grad), name  # world 1: the mean is the gradient itself
        st = state.stats()
        assert (st["path"], st["threads"], st["lane_replies"]) == ("switch", 2, True), st
        state.close()
    finally:
        dist.destroy_process_group()


ENV = dict(AGGSWITCH_SWITCH="127.0.0.1:48879", AGGSWITCH_JOB="3", AGGSWITCH_SECRET=SECRET)


@pytest.mark.parametrize("text, want", [("auto", "auto"), ("1", 1), (" 8 ", 8), ("64", 64)])
def test_state_from_env_reads_aggswitch_threads(monkeypatch, text, want):
    require_torch()
    import aggswitch.torch as agt

    for k, v in {**ENV, "AGGSWITCH_THREADS": text}.items():
        monkeypatch.setenv(k, v)
    state = agt.state_from_env()
    assert state._options["threads"] == want
    state.close()
    # A keyword argument overrides the variable.
    state = agt.state_from_env(threads=2)
    assert state._options["threads"] == 2
    state.close()


@pytest.mark.parametrize("text", ["0", "65", "-1", "two", "2.5", "4 threads", "AUTO"])
def test_a_bad_aggswitch_threads_is_a_value_error_naming_the_variable(monkeypatch, text):
    require_torch()
    import aggswitch.torch as agt

    for k, v in {**ENV, "AGGSWITCH_THREADS": text}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=r"AGGSWITCH_THREADS=.*give auto or a thread count from 1 to 64"):
        agt.state_from_env()


@pytest.mark.parametrize("bad, error", [(0, ValueError), ("many", ValueError), (True, TypeError), (1.5, TypeError)])
def test_the_state_refuses_a_bad_threads_option_when_made(bad, error):
    # Not at the first bucket's join, where the fallback to the hosts would
    # take the mistake for a switch that does not answer.
    require_torch()
    import aggswitch.torch as agt

    with pytest.raises(error, match="AggSwitchState: threads=.*give auto or a thread count from 1 to 64"):
        agt.AggSwitchState("127.0.0.1:9", job=1, secret=SECRET, threads=bad)
