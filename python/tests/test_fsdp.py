"""aggswitch.torch for FSDP2: 4 ranks as processes (gloo process group on
127.0.0.1), reduce-scatter and all-gather through the loopback stand-in
switch. The rank side is fsdp_ranks.py."""

import time

import pytest

from conftest import SECRET, free_port, launch, require_torch

torch = require_torch()
import torch.distributed as dist  # noqa: E402

import aggswitch  # noqa: E402
import aggswitch.torch as agt  # noqa: E402
import fsdp_ranks  # noqa: E402

WORLD, STEPS = 4, 100


@pytest.fixture(scope="module")
def runs():
    """One launch, five 100-step trainings of the same model and seed: gloo's
    reduce-scatter/all-gather, the switch's, the switch's again with every
    50th packet dropped, and two MixedPrecisionPolicy runs."""
    made = []

    def sw(**kw):
        s = aggswitch.LoopbackSwitch(job=1, world_size=WORLD, secret=SECRET, **kw)
        made.append(s)
        return s.address

    plan = [
        ("gloo", None, "f32", None),
        ("switch", sw(elems_per_chunk=64), "f32", None),
        ("switch_lossy", sw(elems_per_chunk=64, drop_every=50), "f32", None),
        # bf16 gradients summed as bf16 (job bf16), bf16 parameters gathered
        ("bf16", sw(elems_per_chunk=64, dtype="bf16"), "bf16", dict(param_dtype="bfloat16", reduce_dtype="bfloat16")),
        # bf16 parameters gathered as raw bytes through a float32 job
        # (odd shard sizes: padded to whole float32 elements)
        ("bf16_params_f32_job", sw(elems_per_chunk=64), "f32", dict(param_dtype="bfloat16", reduce_dtype="float32")),
        # The host path (mode="hosts", no switch): the switch's bits
        ("hosts", "hosts", "f32", None),
        ("bf16_hosts", "hosts", "bf16", dict(param_dtype="bfloat16", reduce_dtype="bfloat16")),
    ]
    t0 = time.monotonic()
    got = launch(fsdp_ranks.fsdp_runs, WORLD, plan, STEPS, timeout=300.0)
    print(f"fsdp runs: {time.monotonic() - t0:.1f} s:", {n: got[0][n]["loss"] for n, *_ in plan},
          ", ".join(f"{name} {got[0][name]['seconds']:.1f} s" for name, *_ in plan))
    for s in made:
        s.close()
    return {r["rank"]: r for r in got}


@pytest.mark.parametrize("name", ["switch", "switch_lossy", "bf16", "bf16_params_f32_job"])
def test_every_rank_gathers_the_same_full_parameters(runs, name):
    full = {runs[r][name]["full"] for r in range(WORLD)}
    assert len(full) == 1, f"{name}: ranks hold different parameters"
    # ... and the switch's all-gather returns what gloo's gathers
    assert runs[0][name]["full"] == runs[0][name]["gloo_full"]
    stats = runs[0][name]["stats"]
    # 3 blocks: 2 all-gathers (forward, backward) and 1 reduce-scatter each per step
    assert stats["collectives"] >= STEPS * 9


def test_a_run_with_loss_ends_bit_identical_to_one_without(runs):
    assert runs[0]["switch_lossy"]["full"] == runs[0]["switch"]["full"]
    assert runs[0]["switch_lossy"]["stats"]["chunks_resent"] > 0, "the lossy run lost nothing"


def test_loss_matches_gloo(runs):
    # Both average the same float32 gradients; they differ only in the
    # order of the 4-term sums (gloo's against the switch's rank order): a
    # few ulps (~1e-7 relative) per gradient, which 100 steps of SGD with
    # momentum carry into the weights. Measured: 0.20119959 (gloo) against
    # 0.20119944 (switch), 7.4e-7 relative; 1e-5 leaves a margin of 13,
    # while a missing or doubled average (a factor of 4 in every step)
    # moves the loss by percents.
    g, s = runs[0]["gloo"]["loss"], runs[0]["switch"]["loss"]
    assert abs(g - s) <= 1e-5 * abs(g), (g, s)
    for r in range(WORLD):
        assert runs[r]["switch"]["loss"] == s  # every rank evaluates the same model


def test_mixed_precision_trains(runs):
    # bf16 parameters (and gradients) round to 8 bits of mantissa, which
    # changes the trajectory (gloo's own bf16 run lands about as far from the
    # float32 loss); the bits of the bf16 collectives are checked exactly by
    # the in-process tests below. Here: it learns as the float32 run does
    # (from ln 5 = 1.6 at the start).
    f32 = runs[0]["switch"]["loss"]
    for name in ("bf16", "bf16_params_f32_job"):
        assert runs[0][name]["loss"] < 1.5 * f32, (name, runs[0][name]["loss"], f32)


def test_a_killed_rank_makes_the_others_raise_within_seconds(switch):
    sw = switch(WORLD, elems_per_chunk=64)
    got = launch(fsdp_ranks.killed_rank, WORLD, sw.address, 5, timeout=60.0)
    died = [g["died_at"] for g in got if "died_at" in g]
    assert len(died) == 1
    others = [g for g in got if "died_at" not in g]
    assert len(others) == WORLD - 1
    print("killed rank: the others raised after", sorted(round(g["at"] - died[0], 2) for g in others), "s")
    for g in others:
        assert g["error"] == "StalledError", g
        assert f"waiting for ranks [{WORLD - 1}]" in g["message"], g["message"]
        # stall_timeout is 2 s
        assert g["at"] - died[0] < 6.0, f"rank {g['rank']} took {g['at'] - died[0]:.1f} s"


@pytest.fixture(scope="module")
def hsdp_switch():
    switches = [aggswitch.LoopbackSwitch(job=1, world_size=2, secret=SECRET, elems_per_chunk=64) for _ in range(2)]
    try:
        got = launch(fsdp_ranks.hsdp, WORLD, [s.address for s in switches], STEPS, timeout=180.0)
    finally:
        for s in switches:
            s.close()
    return got


def test_hsdp_on_the_host_path_ends_with_the_switchs_parameters(hsdp_switch):
    # Each replica group's state makes its own host group (2 of the 4
    # ranks): the replicas' all-reduce on gloo with the switch's bits.
    got = launch(fsdp_ranks.hsdp, WORLD, ["hosts", "hosts"], STEPS, timeout=180.0)
    want = {g["rank"]: g["full"] for g in hsdp_switch}
    for g in got:
        assert g["full"] == want[g["rank"]], f"rank {g['rank']}: other parameters on the host path"
        assert g["collectives"] >= STEPS * 3


def test_hsdp_replicas_end_bit_identical(hsdp_switch):
    got = hsdp_switch
    by = {g["rank"]: g for g in got}
    # mesh (replicate, shard): ranks 0,1 are node 0; ranks 0 and 2 hold shard 0
    assert by[0]["shard"] == by[2]["shard"] == 0 and by[1]["shard"] == by[3]["shard"] == 1
    assert by[0]["local"] == by[2]["local"] and by[1]["local"] == by[3]["local"]
    assert by[0]["local"] != by[1]["local"]
    assert len({g["full"] for g in got}) == 1
    assert len({g["loss"] for g in got}) == 1
    for g in got:
        assert g["collectives"] >= STEPS * 3  # one all-reduce per block and step


# --- in one process: what register_fsdp_comms refuses -------------------------


@pytest.fixture
def process_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_model_without_fsdp_is_refused(process_group):
    state = agt.AggSwitchState("127.0.0.1:9", job=1, secret=SECRET)
    with pytest.raises(ValueError, match="no FSDPModule in Linear; call torch.distributed.fsdp.fully_shard"):
        agt.register_fsdp_comms(torch.nn.Linear(2, 2), state)
    state.close()


def test_native_hsdp_is_refused_with_what_to_do_instead(process_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
    model = fully_shard(torch.nn.Linear(2, 2), mesh=mesh)
    state = agt.AggSwitchState("127.0.0.1:9", job=1, secret=SECRET)
    with pytest.raises(agt.UnsupportedError, match=r"2-D mesh \(native HSDP\).*register_hsdp_all_reduce"):
        agt.register_fsdp_comms(model, state)
    with pytest.raises(ValueError, match="group=mesh\\['replicate'\\]"):
        agt.register_hsdp_all_reduce(fully_shard(torch.nn.Linear(2, 2)), state)
    state.close()


class _Group:
    """What the comms read of a process group."""

    def __init__(self, rank, size):
        self._r, self._n = rank, size

    def rank(self):
        return self._r

    def size(self):
        return self._n


def test_reduce_scatter_refuses_what_the_switch_does_not_do():
    state = agt.AggSwitchState("127.0.0.1:9", job=1, secret=SECRET, rank=0, world_size=2)
    rs = agt.SwitchReduceScatter(state)
    inp, out = torch.zeros(8), torch.zeros(4)
    with pytest.raises(agt.UnsupportedError, match="reduce op .*MAX.*set_force_sum_reduction_for_comms"):
        rs(out, inp, _Group(0, 2), dist.ReduceOp.MAX)
    with pytest.raises(agt.UnsupportedError, match=r"reduces torch.bfloat16 but the job 1 is f32.*reduce_dtype=torch.float32"):
        rs(out.bfloat16(), inp.bfloat16(), _Group(0, 2), dist.ReduceOp.AVG)
    with pytest.raises(ValueError, match="rank 0 of 2, but FSDP runs it on a group where it is rank 1 of 4"):
        rs(out, inp, _Group(1, 4), dist.ReduceOp.AVG)
    with pytest.raises(ValueError, match="input of 8 elements is not 2 shards of the output's 3"):
        rs(torch.zeros(3), inp, _Group(0, 2), dist.ReduceOp.AVG)
    state.close()


# --- in process, 4 ranks as threads: the comms' bits against a reference -----


def _on_threads(world, body):
    out, errors = {}, []

    def run(r):
        try:
            out[r] = body(r)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    import threading

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return out


def _states(sw, world, dtype):
    return [agt.AggSwitchState(sw.address, job=1, secret=SECRET, rank=r, world_size=world,
                               dtype=dtype, join_timeout=10.0) for r in range(world)]


@pytest.mark.parametrize("dtype, wire", [("f32", torch.float32), ("bf16", torch.bfloat16), ("f16", torch.float16)])
@pytest.mark.parametrize("op", ["AVG", "SUM"])
def test_reduce_scatter_is_the_others_sum_plus_the_own_shard_then_the_division(switch, dtype, wire, op):
    world, m = 4, 150  # shards of 150: three chunks of 64 each, the last short
    sw = switch(world, elems_per_chunk=64, dtype=dtype)
    states = _states(sw, world, dtype)
    grads = [(torch.randn(world * m, generator=torch.Generator().manual_seed(r)) * 3).to(wire) for r in range(world)]
    want = []
    for r in range(world):
        # The switch sums the other ranks in float32, rank order, rounded
        # once; the owner adds its own shard, which never left it.
        shard = slice(r * m, (r + 1) * m)
        others = [g[shard].float() for o, g in enumerate(grads) if o != r]
        acc = others[0]
        for g in others[1:]:
            acc = acc + g
        want.append((acc.to(wire).float() + grads[r][shard].float()).to(wire))
    want = torch.cat(want)
    if op == "AVG":
        want = want / world  # in the job's dtype, as FSDP's own AVG would leave it

    def body(r):
        out = torch.empty(m, dtype=wire)
        agt.SwitchReduceScatter(states[r])(out, grads[r].clone(), _Group(r, world), getattr(dist.ReduceOp, op))
        states[r].close()
        return out

    got = _on_threads(world, body)
    for r in range(world):
        assert torch.equal(got[r], want[r * m:(r + 1) * m]), f"rank {r}"


@pytest.mark.parametrize("job_dtype", ["f32", "bf16"])
@pytest.mark.parametrize("dtype, m", [(torch.bfloat16, 75), (torch.uint8, 201), (torch.float32, 70)])
def test_all_gather_moves_the_bytes_of_any_dtype(switch, job_dtype, dtype, m):
    # odd byte counts need padding to whole job elements; NaN and -0.0 bit
    # patterns must arrive as they left
    world = 4
    sw = switch(world, elems_per_chunk=64, dtype=job_dtype)
    states = _states(sw, world, job_dtype)
    shards = [torch.randint(0, 256, (m * torch.empty(0, dtype=dtype).element_size(),),
                            generator=torch.Generator().manual_seed(r), dtype=torch.uint8).view(dtype)
              for r in range(world)]
    want = torch.cat(shards).view(torch.uint8)

    def body(r):
        out = torch.empty(world * m, dtype=dtype)
        inp = out.narrow(0, r * m, m)  # FSDP gathers in place, as here
        inp.copy_(shards[r])
        work = agt.SwitchAllGather(states[r])(out, inp, _Group(r, world), async_op=(r % 2 == 0))
        if work is not None:
            assert work.wait()
        states[r].close()
        return out

    got = _on_threads(world, body)
    for r in range(world):
        assert torch.equal(got[r].view(torch.uint8), want), f"rank {r}"


@pytest.mark.parametrize("hosts, switch", [("hosts", "switch"), ("bf16_hosts", "bf16")])
def test_the_host_path_ends_with_the_switchs_parameters(runs, hosts, switch):
    assert runs[0][hosts]["full"] == runs[0][switch]["full"], f"{hosts}: other parameters than {switch}"
    assert runs[0][hosts]["stats"]["host_collectives"] >= STEPS * 9
    assert runs[0][hosts]["stats"]["switch_collectives"] == 0
