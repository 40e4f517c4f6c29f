"""aggswitch.torch: the DDP hook in one process (world size 1, gloo on
127.0.0.1) against the loopback stand-in, and state_from_env's checks. The
4-rank runs through switchd are tests/tests/torch_ddp.rs."""

import socket
import time

import pytest

from conftest import SECRET, require_torch

torch = require_torch()
import torch.distributed as dist  # noqa: E402

import aggswitch  # noqa: E402
import aggswitch.torch as agt  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def process_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def model_and_batch(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(20, 300), torch.nn.ReLU(), torch.nn.Linear(300, 3))
    return model, torch.randn(16, 20), torch.randint(3, (16,))


def test_hook_gives_the_gradients_ddp_gives(switch, process_group):
    sw = switch(1)
    ref, x, y = model_and_batch(0)
    torch.nn.functional.cross_entropy(ref(x), y).backward()

    model, _, _ = model_and_batch(0)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = agt.AggSwitchState(sw.address, job=1, secret=SECRET)
    ddp.register_comm_hook(state, agt.allreduce_hook)
    for _ in range(2):  # the second backward runs on the rebuilt buckets
        model.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            assert torch.equal(p.grad, q.grad), name  # world 1: the mean is the gradient itself
    assert state.stats()["collectives"] >= 2  # at least one bucket per backward
    state.close()


def test_hook_refuses_non_float32_buckets(switch, process_group):
    sw = switch(1)
    model = torch.nn.Linear(4, 2).double()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = agt.AggSwitchState(sw.address, job=1, secret=SECRET)
    ddp.register_comm_hook(state, agt.allreduce_hook)
    with pytest.raises(Exception, match="float32 only"):
        ddp(torch.zeros(3, 4, dtype=torch.float64)).sum().backward()
    state.close()


def test_a_failed_bucket_fails_the_backward_with_the_library_message(process_group):
    # Nothing listens there: the probe before the join gets no answer in
    # 5 s and backward() raises a JoinTimeoutError saying so.
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = agt.AggSwitchState("127.0.0.1:9", job=1, secret=SECRET, join_timeout=0.3, fallback=False)
    ddp.register_comm_hook(state, agt.allreduce_hook)
    with pytest.raises(Exception, match="did not answer a HELLO within 5 s"):
        ddp(torch.zeros(3, 4)).sum().backward()
    # DDP raises a RuntimeError; the typed error is on the state.
    assert isinstance(state.error, aggswitch.errors.JoinTimeoutError), state.error
    with pytest.raises(Exception, match="earlier collective failed"):
        ddp(torch.zeros(3, 4)).sum().backward()
    state.close()


def test_with_no_switch_and_fallback_on_training_starts_on_the_hosts_within_seconds(process_group, caplog):
    # Nothing listens there: the probe before the join gets no answer in
    # 5 s, and the bucket is summed on the host path instead (world 1: the
    # gradient itself), with one warning that says so.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ref = torch.nn.Linear(4, 2)
    ref.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = agt.AggSwitchState("127.0.0.1:9", job=1, secret=SECRET, probe_interval=60.0)
    ddp.register_comm_hook(state, agt.allreduce_hook)
    x = torch.randn(3, 4)
    t0 = time.monotonic()
    with caplog.at_level("WARNING", logger="aggswitch.torch"):
        for _ in range(2):
            ddp(x).sum().backward()
    assert time.monotonic() - t0 < 10
    ref(x).sum().backward()
    ref(x).sum().backward()
    assert torch.equal(model.weight.grad, ref.weight.grad)
    st = state.stats()
    assert st["path"] == "hosts" and st["fallbacks"] == 1 and st["host_collectives"] == 2, st
    assert "did not answer a HELLO" in st["last_fallback_reason"]
    warned = [r for r in caplog.records if "run on the hosts" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    state.close()


ENV = dict(AGGSWITCH_SWITCH="127.0.0.1:48879", AGGSWITCH_JOB="3", AGGSWITCH_SECRET=SECRET)


@pytest.mark.parametrize("change, words", [
    (dict(AGGSWITCH_SWITCH=None), "AGGSWITCH_SWITCH is not set"),
    (dict(AGGSWITCH_JOB="three"), "AGGSWITCH_JOB='three'"),
    (dict(AGGSWITCH_SECRET="abc"), "AGGSWITCH_SECRET: expected 64 hex digits"),
    (dict(AGGSWITCH_SECRET=None), "AGGSWITCH_SECRET_FILE is not set"),
    (dict(AGGSWITCH_SECRET=None, AGGSWITCH_SECRET_FILE="/nonexistent/secret"), "cannot read it"),
    (dict(AGGSWITCH_STALL_TIMEOUT="soon"), "AGGSWITCH_STALL_TIMEOUT='soon'"),
    (dict(AGGSWITCH_TRANSPORT="gso"), "AGGSWITCH_TRANSPORT='gso': expected auto, mmsg or udp-gso"),
])
def test_state_from_env_names_what_is_wrong(monkeypatch, process_group, change, words):
    for k, v in {**ENV, **change}.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=words):
        agt.state_from_env()


def test_state_from_env_reads_secret_file_and_rank(monkeypatch, process_group, tmp_path):
    f = tmp_path / "secret"
    f.write_text(SECRET + "\n")
    monkeypatch.setenv("AGGSWITCH_SWITCH", "127.0.0.1:48879")
    monkeypatch.setenv("AGGSWITCH_JOB", "3")
    monkeypatch.delenv("AGGSWITCH_SECRET", raising=False)
    monkeypatch.setenv("AGGSWITCH_SECRET_FILE", str(f))
    monkeypatch.setenv("AGGSWITCH_TRANSPORT", "mmsg")
    state = agt.state_from_env()
    assert (state.job, state.rank, state.world_size) == (3, 0, 1)
    assert state._options["transport"] == "mmsg"
    assert SECRET not in repr(state)
    state.close()


def test_state_made_before_the_process_group_takes_rank_and_world_on_first_use(switch):
    # Lightning makes the process group inside fit(), after the strategy and
    # its hook state: nothing is read from torch.distributed until it joins.
    assert not dist.is_initialized()
    state = agt.AggSwitchState("127.0.0.1:48879", job=1, secret=SECRET)
    assert "rank=None" in repr(state)
    with pytest.raises(ValueError, match="init_process_group"):
        state.world_size
    sw = switch(1)
    state = agt.AggSwitchState(sw.address, job=1, secret=SECRET)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model = torch.nn.Linear(4, 2)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp.register_comm_hook(state, agt.allreduce_hook)
        ddp(torch.ones(3, 4)).sum().backward()
        assert (state.rank, state.world_size) == (0, 1)
        assert state.stats()["collectives"] == 1
        state.close()
    finally:
        dist.destroy_process_group()


class _Bucket:
    """What the hooks read of a dist.GradBucket."""

    def __init__(self, tensor):
        self._t = tensor

    def buffer(self):
        return self._t

    def index(self):
        return 0


_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=_CUDA)])
@pytest.mark.parametrize("dtype, wire", [("bf16", "bfloat16"), ("f16", "float16")])
def test_compress_hooks_return_what_the_reference_says(switch, dtype, wire, device):
    """On a GPU the bucket is cast and divided there and staged through host
    memory in the wire dtype: the same bytes as the CPU reference."""
    import threading

    world, n = 3, 2000
    wire = getattr(torch, wire)
    hook = agt.bf16_compress_hook if dtype == "bf16" else agt.fp16_compress_hook
    sw = switch(world, elems_per_chunk=500, dtype=dtype)
    grads = [torch.randn(n, generator=torch.Generator().manual_seed(r)) * 3.0 for r in range(world)]
    # Reference: each rank's bucket cast and divided in the wire dtype, the
    # casts widened to float32 and summed in rank order, rounded once.
    sent = [g.to(wire).div_(world) for g in grads]
    acc = sent[0].float()
    for s in sent[1:]:
        acc = acc + s.float()
    want = acc.to(wire).float()
    assert not torch.equal(want, sum(g for g in grads) / world), "the reference must differ from float32"
    out, errors = {}, []

    def rank(r):
        try:
            state = agt.AggSwitchState(sw.address, job=1, secret=SECRET, rank=r, world_size=world,
                                       dtype=dtype, join_timeout=10.0)
            bucket = _Bucket(grads[r].clone().to(device))
            out[r] = hook(state, bucket).wait()
            state.close()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    for r in range(world):
        assert out[r].dtype == torch.float32 and out[r].device.type == device
        assert torch.equal(out[r].cpu(), want), f"rank {r}"


def test_bf16_hook_runs_under_ddp(switch, process_group):
    sw = switch(1, dtype="bf16")
    ref, x, y = model_and_batch(0)
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    model, _, _ = model_and_batch(0)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = agt.AggSwitchState(sw.address, job=1, secret=SECRET, dtype="bf16")
    ddp.register_comm_hook(state, agt.bf16_compress_hook)
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        # World 1: the gradient rounded to bf16 and back.
        assert torch.equal(p.grad, q.grad.to(torch.bfloat16).float()), name
    assert state.stats()["collectives"] >= 1
    state.close()


def test_a_hook_of_another_dtype_than_the_state_says_so(switch, process_group):
    sw = switch(1)
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = agt.AggSwitchState(sw.address, job=1, secret=SECRET)
    ddp.register_comm_hook(state, agt.bf16_compress_hook)
    with pytest.raises(ValueError, match="state's job is f32; this hook sends bf16"):
        ddp(torch.zeros(3, 4)).sum().backward()
    state.close()


def test_on_a_tree_the_mean_divides_by_every_leafs_ranks():
    # A tree's state joins its leaf as one of the leaf's ranks, but the sum
    # covers every leaf's: the DDP hooks divide by ranks_summed.
    st = agt.AggSwitchState(None, 1, None, rank=1, world_size=2, mode="hosts", leaf_sizes=[2, 3])
    assert (st.world_size, st.ranks_summed) == (2, 5)
    flat = agt.AggSwitchState(None, 1, None, rank=1, world_size=4, mode="hosts")
    assert flat.ranks_summed == 4
    st.close()
    flat.close()
