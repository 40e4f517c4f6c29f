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
