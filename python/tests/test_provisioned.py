"""Self-provisioned jobs from Python: ranks name a job by tenant and job
name (Worker(..., tenant=, tenant_key_file=, job_name=)) on a
LoopbackSwitch that has the tenant, and all-reduce bit for bit; the
tenant's quota raises QuotaError naming it; AGGSWITCH_TENANT,
AGGSWITCH_TENANT_KEY_FILE and AGGSWITCH_JOB_NAME configure the torch
state, whose default job name is shared by the ranks of one run and new
for the next."""

import os
import sys
import threading
import time

import numpy as np
import pytest

from conftest import SECRET, launch, require_torch

sys.path.insert(0, os.path.dirname(__file__))

import aggswitch  # noqa: E402
from aggswitch.errors import QuotaError, RefusedError  # noqa: E402

KEY = "3c0e5a1d9b7f24c68e1a5d3f7b9c2e4a6d8f0b2c4e6a8c0e2f4a6b8d0c2e4f6a"
WORLD = 4


@pytest.fixture
def key_file(tmp_path):
    p = tmp_path / "vision.key"
    p.write_text(KEY + "\n")
    p.chmod(0o600)
    return str(p)


@pytest.fixture
def tenant_switch():
    made = []

    def make(max_jobs=4):
        sw = aggswitch.LoopbackSwitch(job=1, world_size=2, secret=SECRET, tenant="vision", tenant_key=KEY,
                                      max_jobs=max_jobs)
        made.append(sw)
        return sw

    yield make
    for sw in made:
        sw.close()


def _worker(sw, rank, world, key_file, job_name, **kw):
    return aggswitch.Worker(sw.address, job=0, rank=rank, world_size=world, secret="", tenant="vision",
                            tenant_key_file=key_file, job_name=job_name, join_timeout=10.0, **kw)


def test_four_ranks_all_reduce_by_tenant_and_job_name_bit_exact(tenant_switch, key_file):
    sw = tenant_switch()
    n = 5000
    inputs = [np.random.default_rng(r).standard_normal(n).astype(np.float32) for r in range(WORLD)]
    want = inputs[0].copy()
    for x in inputs[1:]:
        want = (want + x).astype(np.float32)  # rank order, float32 each step
    got, jobs, errors = {}, {}, []

    def run(rank):
        try:
            with _worker(sw, rank, WORLD, key_file, "run-py-1") as w:
                buf = inputs[rank].copy()
                w.all_reduce(buf)
                got[rank], jobs[rank] = buf, w.job
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for r in range(WORLD):
        assert got[r].view(np.uint32).tolist() == want.view(np.uint32).tolist(), f"rank {r}"
    assert len(set(jobs.values())) == 1 and jobs[0] >= 32768, jobs


def test_a_quota_refusal_raises_quota_error_naming_max_jobs(tenant_switch, key_file):
    sw = tenant_switch(max_jobs=1)
    with _worker(sw, 0, 1, key_file, "first"):
        with pytest.raises(QuotaError) as e:
            _worker(sw, 0, 1, key_file, "second")
    assert e.value.quota == "max_jobs" and e.value.reason == "quota_exceeded"
    assert isinstance(e.value, RefusedError)
    assert "max_jobs" in str(e.value) and "second" in str(e.value), str(e.value)


def test_a_wrong_key_is_refused_and_a_half_given_tenant_is_a_value_error(tenant_switch, tmp_path, key_file):
    sw = tenant_switch()
    bad = tmp_path / "bad.key"
    bad.write_text("11" + KEY[2:])
    bad.chmod(0o600)
    with pytest.raises(RefusedError) as e:
        _worker(sw, 0, 1, str(bad), "j")
    assert e.value.reason == "bad_secret" and "tenant key" in str(e.value)
    with pytest.raises(ValueError, match="tenant="):
        aggswitch.Worker(sw.address, job=0, rank=0, world_size=1, secret="", tenant="vision")
    with pytest.raises(ValueError, match="shape a self-provisioned job"):
        aggswitch.Worker(sw.address, job=1, rank=0, world_size=2, secret=SECRET, stats=True)
    # A stats job, provisioned as such: the switch's statistics come back.
    with _worker(sw, 0, 1, key_file, "with-stats", stats=True) as w:
        assert w.has_gradient_stats
        w.all_reduce(np.ones(8, dtype=np.float32))
        assert w.gradient_stats()["n"] == 1
    with pytest.raises(ValueError, match="priority"):
        _worker(sw, 0, 1, key_file, "j", priority="urgent")
    # The probe of a provisioned job: an ask the switch answers.
    what, gen, _ = aggswitch._native.probe_switch(sw.address, 0, 0, 1, "", timeout=2.0, tenant="vision",
                                                  tenant_key_file=key_file, job_name="j")
    assert what == "alive" and gen is not None


def test_state_from_env_reads_the_tenant_variables(monkeypatch, key_file):
    require_torch()
    import aggswitch.torch as agt

    for var in ("AGGSWITCH_JOB", "AGGSWITCH_SECRET", "AGGSWITCH_SECRET_FILE", "AGGSWITCH_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AGGSWITCH_SWITCH", "127.0.0.1:9")
    monkeypatch.setenv("AGGSWITCH_TENANT", "vision")
    monkeypatch.setenv("AGGSWITCH_TENANT_KEY_FILE", key_file)
    monkeypatch.setenv("AGGSWITCH_JOB_NAME", "nightly-7")
    st = agt.state_from_env()
    assert st.tenant == "vision" and st.job_name == "nightly-7"
    st.close()
    monkeypatch.delenv("AGGSWITCH_TENANT_KEY_FILE")
    monkeypatch.delenv("AGGSWITCH_TENANT_KEY", raising=False)
    with pytest.raises(ValueError, match="AGGSWITCH_TENANT_KEY_FILE"):
        agt.state_from_env()


def test_without_a_process_group_the_default_job_name_asks_for_aggswitch_job_name(key_file):
    require_torch()
    import torch.distributed as dist

    import aggswitch.torch as agt

    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group exists in this process")
    st = agt.AggSwitchState("127.0.0.1:9", job=1, secret=None, rank=0, world_size=1, tenant="vision",
                            tenant_key_file=key_file)
    with pytest.raises(ValueError, match="AGGSWITCH_JOB_NAME"):
        st._resolve()
    st.close()


def test_the_default_job_name_is_shared_by_one_run_and_new_for_the_next(tenant_switch, key_file):
    require_torch()
    import provision_ranks

    sw = tenant_switch()
    runs = [sorted(launch(provision_ranks.ddp_steps, WORLD, sw.address, key_file, None, 3), key=lambda r: r["rank"])
            for _ in range(2)]
    names = []
    for ranks in runs:
        assert len({r["job_name"] for r in ranks}) == 1, ranks
        assert len({r["job"] for r in ranks}) == 1, ranks
        assert ranks[0]["job_name"].startswith("run-") and len(ranks[0]["job_name"]) == 4 + 16
        assert all(r["stats"]["switch_collectives"] > 0 for r in ranks), ranks
        names.append(ranks[0]["job_name"])
    assert names[0] != names[1], names
    # Same seeds, same switch sums: the same weights in both runs, on every rank.
    digests = {r["digest"] for ranks in runs for r in ranks}
    assert len(digests) == 1, digests


def test_a_provisioned_job_falls_back_to_the_hosts_and_provisions_again_to_return(key_file):
    """As test_host_path's switch that dies mid-run, for a self-provisioned
    job: the switch goes away at step 4 (the ranks finish on the host path,
    leaving the job), a new one with the same tenant and no jobs comes up
    at step 12, and the ranks provision the same name again and return.
    The weights equal the host-path-only run's (the switch's bits)."""
    require_torch()
    import hosts_ranks
    from conftest import _CTX

    steps = 24
    kw = dict(tenant="vision", tenant_key_file=key_file, job_name="fallback-run")
    sw = aggswitch.LoopbackSwitch(job=1, world_size=2, secret=SECRET, tenant="vision", tenant_key=KEY)
    address = sw.address
    port = int(address.rsplit(":", 1)[1])
    hosts_only = launch(hosts_ranks.ddp_train, WORLD, address, "hosts", "f32", steps, None, {}, timeout=240)
    want = {r["digest"] for r in hosts_only}
    assert len(want) == 1

    kill, restart, restarted = _CTX.Event(), _CTX.Event(), _CTX.Event()
    revived = []

    def operator():
        kill.wait(120)
        sw.close()
        restart.wait(120)
        revived.append(aggswitch.LoopbackSwitch(job=1, world_size=2, secret=SECRET, port=port, tenant="vision",
                                                tenant_key=KEY))
        # As in test_host_path: the ranks wait at step 12 until every
        # prober (a probe of the dead switch takes its 1 s timeout, then
        # 0.5 s) has seen the new switch, so the return does not race the
        # last steps.
        time.sleep(2 * (1.0 + 0.5) + 0.5)
        restarted.set()

    t = threading.Thread(target=operator, daemon=True)
    t.start()
    gate = [(4, kill, None), (12, restart, restarted)]
    got = launch(hosts_ranks.ddp_train, WORLD, address, "switch", "f32", steps, gate,
                 dict(kw, stall_timeout=1.0, probe_interval=0.5), timeout=240)
    t.join(10)
    for r in revived:
        r.close()
    assert {r["digest"] for r in got} == want, "the weights differ from the host path's"
    for r in got:
        st = r["stats"]
        assert st["fallbacks"] == 1 and st["returns"] == 1, f"rank {r['rank']}: {st}"
        assert r["paths"][-1] == "switch", r["paths"]


def test_a_state_idle_three_times_its_lease_keeps_its_job(key_file):
    """A LoopbackSwitch whose tenant leases jobs for 1 s (it runs the
    lease): two ranks' states all-reduce, idle 3 s, and all-reduce again on
    the same job, with no rejoin: the states' keepalive threads kept it. A
    bare Worker idle as long without keepalive loses the job (the next
    collective makes it again: a rejoin)."""
    require_torch()
    import torch

    import aggswitch.torch as agt

    sw = aggswitch.LoopbackSwitch(job=1, world_size=2, secret=SECRET, tenant="vision", tenant_key=KEY, lease=1.0)
    got, errors = {}, []

    def rank(r, use_state):
        try:
            if use_state:
                st = agt.AggSwitchState(sw.address, job=1, secret=None, rank=r, world_size=2, tenant="vision",
                                        tenant_key_file=key_file, job_name="idle-state", fallback=False,
                                        join_timeout=10.0)

                def reduce(t):
                    st._executor.submit(st._run, lambda: st._reduce_sum(t)).result(30)

                worker = lambda: st._worker  # noqa: E731
            else:
                w = _worker(sw, r, 2, key_file, "idle-bare")
                reduce = w.all_reduce  # noqa: E731
                worker = lambda: w  # noqa: E731
            sums = []
            for step in range(2):
                t = torch.full((3000,), float(r + 1 + step), dtype=torch.float32)
                reduce(t)
                sums.append(float(t[0]))
                if step == 0:
                    job, interval = worker().job, worker().keepalive_interval
                    time.sleep(3.0)
            got[(use_state, r)] = (sums, job, worker().job, interval, worker().stats()["rejoins"])
            if use_state:
                st.close()
            else:
                w.close()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    for use_state in (True, False):
        threads = [threading.Thread(target=rank, args=(r, use_state)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    sw.close()
    assert not errors, errors
    for r in range(2):
        sums, before, after, interval, rejoins = got[(True, r)]
        assert sums == [3.0, 5.0], sums
        assert abs(interval - 1 / 3) < 1e-6, interval
        assert before == after and rejoins == 0, got
        sums, _, _, _, rejoins = got[(False, r)]
        assert sums == [3.0, 5.0], sums
        assert rejoins >= 1, got
