"""bench/harness (scripts/bench): the scenarios' command lines, the typed
option values and the harness's pure helpers, so that a typo in a
scenario's parser fails here and not an hour into a benchmark."""

import argparse
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "harness"))
import bench_transports_report  # noqa: E402
import cli  # noqa: E402
import lifecycle  # noqa: E402
import machine  # noqa: E402
import options  # noqa: E402
from scenario import parse, parser  # noqa: E402
from scenarios import SCENARIOS, builds, scaling  # noqa: E402


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_scenario_parses_its_defaults_and_help(name, capsys):
    s = SCENARIOS[name]
    a = parse(s, [])
    for o in s.options:
        assert getattr(a, o.dest) == (False if o.type is None else o.default), o.flag
    with pytest.raises(SystemExit) as e:
        parse(s, ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for o in s.options:
        assert o.flag in out


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_scenario_refuses_an_unknown_option(name):
    with pytest.raises(SystemExit) as e:
        parse(SCENARIOS[name], ["--no-such-option"])
    assert e.value.code == 2


def test_scenario_names_are_the_documented_ones():
    assert set(SCENARIOS) <= {"allreduce", "efficiency", "forward", "fsdp", "per-packet", "priority",
                              "scaling", "train", "transports", "tree", "fairness", "soak", "builds"}
    for s in SCENARIOS.values():
        flags = [o.flag for o in s.options]
        assert len(flags) == len(set(flags)), s.name
        parser(s)  # argparse refuses conflicting flags here


def test_cli_lists_scenarios_and_refuses_unknown(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in SCENARIOS:
        assert f"  {name} " in out
    assert cli.main(["no-such-scenario"]) == 2
    assert cli.main([]) == 2


def test_uint_range():
    f = options.uint_range(1, 600)
    assert f("1") == 1 and f("600") == 600
    for bad in ("0", "601", "-1", "1.5", "", "x", "9999999999"):
        with pytest.raises(argparse.ArgumentTypeError):
            f(bad)


def test_positive_seconds():
    assert options.positive_seconds("0.5") == 0.5
    assert options.positive_seconds("3") == 3.0
    for bad in ("0", "0.0", "-1", "nan", "inf", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            options.positive_seconds(bad)


def test_lists():
    assert options.uint_list(1, 9999)("1,2,16") == [1, 2, 16]
    for bad in ("", "1,,2", "0", "1,x"):
        with pytest.raises(argparse.ArgumentTypeError):
            options.uint_list(1, 9999)(bad)
    words = options.word_list(["mmsg", "udp-gso"])
    assert words("mmsg udp-gso") == ["mmsg", "udp-gso"]
    assert words("udp-gso,mmsg,udp-gso") == ["udp-gso", "mmsg"]
    with pytest.raises(argparse.ArgumentTypeError):
        words("mmsg tcp")
    with pytest.raises(argparse.ArgumentTypeError):
        words(" ")
    assert options.on_off("on") == "on"
    with pytest.raises(argparse.ArgumentTypeError):
        options.on_off("yes")


def test_scaling_threads_and_quick():
    assert scaling.default_threads(1) == [1]
    assert scaling.default_threads(2) == [1, 2]
    assert scaling.default_threads(6) == [1, 2, 4, 6]
    assert scaling.default_threads(16) == [1, 2, 4, 8, 16]
    s = SCENARIOS["scaling"]
    assert scaling.settings(parse(s, []), 4) == (3.0, 3, [1, 2, 4])
    assert scaling.settings(parse(s, ["--quick"]), 4) == (0.5, 1, [1, 2, 4])
    assert scaling.settings(parse(s, ["--quick", "--repeats", "2", "--threads", "2"]), 4) == (0.5, 2, [2])


def test_parse_env():
    env = lifecycle.parse_env("switch_addr=198.18.0.1\n# comment\nworker_0_ns=gs-w0\nodd\nx=a=b\n")
    assert env == {"switch_addr": "198.18.0.1", "worker_0_ns": "gs-w0", "x": "a=b"}


def test_busy_machine_is_above_half_the_cores():
    assert not machine.is_busy(1.0, 2)
    assert machine.is_busy(1.01, 2)
    assert machine.is_busy(8.5, 16)


def test_children_times_line_reads_as_bash_times():
    # bench_transports_report reads the workers' CPU from this line.
    assert bench_transports_report.times_seconds(machine.children_times_line()) >= 0
    assert bench_transports_report.times_seconds("1m2.500s 0m0.250s") == pytest.approx(62.75)


def test_tree_run_lengths():
    from scenarios import tree
    # 30 Mbit/s, 4 MiB tensors, 20 s probe: each job's fair share of the
    # payload rate (14.2 Mbit/s) must outlast the probe by 3 s.
    n = tree.fair_iterations(20, 4, 30)
    per_iter_s = 4 * 1024 * 1024 * 8 / (30e6 * tree.CHUNK_PAYLOAD / tree.CHUNK_WIRE / 2)
    assert n == 11 and (n - 2) * per_iter_s <= 23 < (n - 1) * per_iter_s
    assert tree.tree_timeout(2, 16, 30) == 2 * 16 * 8388608 * 2 // 30000000 + 300


def test_tree_options():
    s = SCENARIOS["tree"]
    a = parse(s, ["--parts", "fairness", "--rate", "100", "--no-docs"])
    assert a.parts == ["fairness"] and a.rate == 100 and a.no_docs and not a.no_build
    for bad in (["--parts", "trees,forest"], ["--prefix", "a b"], ["--seconds", "1"], ["--rate", "0"]):
        with pytest.raises(SystemExit):
            parse(s, bad)


def test_train_options_and_arithmetic():
    from scenarios import train
    s = SCENARIOS["train"]
    a = parse(s, ["--links", "unlimited,500mbit", "--comms", "hosts,switch-killed", "--stall-timeout", "0.5"])
    assert a.links == ["unlimited", "500mbit"] and a.comms == ["hosts", "switch-killed"]
    assert a.stall_timeout == 0.5 and train.stall_json(a.stall_timeout) == 0.5
    assert train.stall_json(parse(s, []).stall_timeout) == 2
    for bad in (["--links", "fast"], ["--links", "0gbit"], ["--comms", "gloo,gloo"], ["--comms", "nccl"],
                ["--stall-timeout", "0.05"], ["--stall-timeout", "1.2345"], ["--dtype", "f64"]):
        with pytest.raises(SystemExit):
            parse(s, bad)
    assert train.tbf_args("1gbit") == ["rate", "1gbit", "burst", "256kb", "latency", "50ms"]
    assert train.tbf_args("10gbit")[3] == "2560kb"
    assert train.tbf_args("500mbit")[3] == "256kb"
    # A third of the steps, to the multiple of 10 train_ddp.py prints, >= 10.
    assert train.kill_step(3, 30) == 10
    assert train.kill_step(5, 100) == 40
    assert train.kill_step(0, 1) == 10


def test_efficiency_quick_and_fairness_iterations():
    from scenarios import efficiency, fairness
    s = SCENARIOS["efficiency"]
    assert efficiency.settings(parse(s, [])) == (64, 5, [1500, 9000], True)
    assert efficiency.settings(parse(s, ["--quick"])) == (8, 2, [1500], False)
    assert efficiency.settings(parse(s, ["--quick", "--mib", "4", "--mtus", "9000"])) == (4, 2, [9000], False)
    assert efficiency.settings(parse(s, ["--no-docs"]))[3] is False
    with pytest.raises(SystemExit):
        parse(s, ["--mtus", "1000"])
    with pytest.raises(SystemExit):
        parse(s, ["--dtypes", "f32,f64"])
    # 100 Mbit/s of 1496-byte frames carrying 1432 bytes; 16 MiB tensors, 20 s.
    n = fairness.iterations(20, 4194304, 100)
    assert n == 23 * (100000000 * 1432 // 1496) // (4194304 * 32) + 2 == 18
    assert parse(SCENARIOS["fairness"], ["--mps", "max"]).mps == "max"
    with pytest.raises(SystemExit):
        parse(SCENARIOS["fairness"], ["--probe", "xx"])


def test_allreduce_settings():
    from scenarios import allreduce
    s = SCENARIOS["allreduce"]
    d = allreduce.settings(parse(s, []))
    assert (d.mib, d.repeats, d.rate_seconds, d.rate_repeats, d.docs) == (64, 5, 5, 3, True)
    assert d.elements == 64 * 1024 * 1024 // 4 and d.per_packet and d.forward and d.efficiency and d.rates
    q = allreduce.settings(parse(s, ["--quick", "--repeats", "7"]))
    assert (q.mib, q.repeats, q.rate_seconds, q.rate_repeats, q.docs) == (8, 7, 2, 1, False)
    c = allreduce.settings(parse(s, ["--cores-only", "--threads", "1,2,4,8"]))
    assert not (c.docs or c.per_packet or c.forward or c.efficiency) and c.rates
    r = allreduce.settings(parse(s, ["--rates-only"]))
    assert r.rates and not (r.per_packet or r.forward)
    with pytest.raises(lifecycle.HarnessError):
        allreduce.settings(parse(s, ["--rates-only", "--no-rates"]))
    with pytest.raises(lifecycle.HarnessError):
        allreduce.settings(parse(s, ["--rates-only", "--cores-only"]))
    assert parse(s, ["--threads", "1,2,4"]).threads == [1, 2, 4]
    for bad in ("2,4", "1,1", "1,4,2", "1,65", ""):
        with pytest.raises(SystemExit):
            parse(s, ["--threads", bad])
    assert allreduce.rate_queues([1, 2]) == 2 and allreduce.rate_queues([1, 2, 4, 8]) == 8


def test_switchctl_reads_active_jobs_and_survives_a_silent_switch(tmp_path):
    from switchctl import Switchctl
    fake = tmp_path / "switchctl"
    fake.write_text("#!/bin/sh\n[ -e \"$2\" ] || exit 1\ncat \"$2\"\n")
    fake.chmod(0o755)
    sock = tmp_path / "stats"
    ctl = Switchctl(fake, sock)
    assert ctl.stats_text() == "{}\n" and ctl.active_jobs() == set()
    sock.write_text('{"jobs": [{"id": 1, "state": "active"}, {"id": 2, "state": "joining"}]}')
    assert ctl.active_jobs() == {1}
    ctl.wait_active({1}, 1, "test")
    with pytest.raises(lifecycle.HarnessError, match="not active"):
        ctl.wait_active({1, 2}, 0.2, "test")


def test_builds_takes_dirs_of_the_three_binaries_and_alternates_their_order(tmp_path):
    with pytest.raises(argparse.ArgumentTypeError, match="switchd is not an executable"):
        builds.build_dir(str(tmp_path))
    for b in ("switchd", "switchctl"):
        (tmp_path / b).write_text("#!/bin/sh\n")
        (tmp_path / b).chmod(0o755)
    with pytest.raises(argparse.ArgumentTypeError, match="worker is not an executable"):
        builds.build_dir(str(tmp_path))
    (tmp_path / "worker").write_text("#!/bin/sh\n")
    (tmp_path / "worker").chmod(0o755)
    assert builds.build_dir(str(tmp_path)) == tmp_path
    assert [builds.order(i, ["A", "B"]) for i in range(3)] == [["A", "B"], ["B", "A"], ["A", "B"]]


def test_builds_link_and_delay_options():
    s = SCENARIOS["builds"]
    assert parse(s, []).link == "unlimited"
    assert parse(s, ["--link", "1gbit"]).link == "1gbit"
    with pytest.raises(SystemExit):
        parse(s, ["--link", "10gbit"])
    a = parse(s, ["--slow-results", "200", "--slow-after", "0.5"])
    assert (a.slow_results, a.slow_after) == (200, 0.5)
    assert (parse(s, []).slow_results, parse(s, []).slow_after) == (0, 1.0)
    with pytest.raises(SystemExit):
        parse(s, ["--slow-after", "0"])


@pytest.mark.parametrize("name", ["builds", "soak"])
def test_worker_threads_option_sets_the_workers_threads_and_the_switchs_lanes(name):
    s = SCENARIOS[name]
    assert parse(s, []).worker_threads == 1
    assert parse(s, ["--worker-threads", "2"]).worker_threads == 2
    for bad in ("0", "65", "two"):
        with pytest.raises(SystemExit):
            parse(s, ["--worker-threads", bad])
    assert lifecycle.thread_args(1) == ([], [])
    assert lifecycle.thread_args(2) == (["--threads", 2], ["switch.seq_lanes=2"])
    assert lifecycle.thread_args(3) == (["--threads", 3], ["switch.seq_lanes=4"])


def test_builds_takes_worker_options_for_the_second_build_but_not_the_ones_it_sets(capsys):
    s = SCENARIOS["builds"]
    assert parse(s, []).b_worker_args == ()
    assert parse(s, ["--b-worker-args=--no-congestion-control"]).b_worker_args == ("--no-congestion-control",)
    assert parse(s, ["--b-worker-args", "--delay-target 0 --transport mmsg"]).b_worker_args == (
        "--delay-target", "0", "--transport", "mmsg")
    for bad, says in (("--threads 2", "--threads is set by the scenario"),
                      ("--elements=10", "--elements is set by the scenario"),
                      ("--delay-target '0", "No closing quotation")):
        with pytest.raises(SystemExit):
            parse(s, ["--b-worker-args=" + bad])
        assert says in capsys.readouterr().err


def test_builds_sets_switch_keys_of_the_second_build_only_and_reserves_huge_pages():
    s = SCENARIOS["builds"]
    assert (parse(s, []).b_switch_config, parse(s, []).huge_pages) == ((), 0)
    a = parse(s, ["--b-switch-config", 'switch.umem_huge_pages="on", switch.queues=2', "--huge-pages", "40"])
    assert a.b_switch_config == ('switch.umem_huge_pages="on"', "switch.queues=2")
    assert a.huge_pages == 40
    for bad in ["switch.queues", "=2", "switch.queues="]:
        with pytest.raises(SystemExit):
            parse(s, ["--b-switch-config", bad])


def test_huge_pages_grows_the_pool_for_the_block_and_restores_it_also_on_error(tmp_path):
    pool = tmp_path / "nr_hugepages"
    pool.write_text("4\n")
    with lifecycle.HugePages(32, pool):
        assert pool.read_text().strip() == "36"
    assert pool.read_text().strip() == "4"
    with pytest.raises(RuntimeError):
        with lifecycle.HugePages(8, pool):
            assert pool.read_text().strip() == "12"
            raise RuntimeError("a run failed")
    assert pool.read_text().strip() == "4"
    with lifecycle.HugePages(0, tmp_path / "absent"):
        pass  # 0 pages: the pool is not touched


def test_publish_copies_the_run_to_the_published_name_only_with_docs(tmp_path, monkeypatch):
    monkeypatch.setattr(lifecycle, "RESULTS_DIR", tmp_path / "results")
    run_json, run_png = tmp_path / "x-STAMP.json", tmp_path / "x-STAMP.png"
    run_json.write_text('{"a": 1}\n')
    lifecycle.publish(run_json, run_png, "bench-x", docs=False)
    assert not (tmp_path / "results").exists()
    lifecycle.publish(run_json, run_png, "bench-x")
    assert (tmp_path / "results" / "bench-x.json").read_text() == '{"a": 1}\n'
    assert not (tmp_path / "results" / "bench-x.png").exists(), "no plot was drawn: none is published"
    run_png.write_bytes(b"\x89PNG")
    lifecycle.publish(run_json, run_png, "bench-x")
    assert (tmp_path / "results" / "bench-x.png").read_bytes() == b"\x89PNG"


@pytest.mark.parametrize("status,error", [(0, None), (3, "sanity check failed"), (1, r"failed \(status 1\)")])
def test_checked_report_prints_the_table_and_refuses_a_failed_sanity_check(tmp_path, monkeypatch, capsys,
                                                                           status, error):
    monkeypatch.setattr(lifecycle, "HARNESS_DIR", tmp_path)
    out_json, table = tmp_path / "run.json", tmp_path / "table.md"
    (tmp_path / "fake_report.py").write_text(
        "import sys\n"
        f"open({str(out_json)!r}, 'w').write('{{}}')\n"
        f"open({str(table)!r}, 'w').write('| the table |')\n"
        f"sys.exit({status})\n")
    run = lambda: lifecycle.run_checked_report("fake_report.py", [], out_json, table, "=== title ===", "bench-x")
    if error is None:
        run()
    else:
        with pytest.raises(lifecycle.HarnessError, match=error):
            run()
    out = capsys.readouterr().out
    assert "=== title ===" in out and "| the table |" in out
    out_json.unlink()
    (tmp_path / "fake_report.py").write_text("import sys\nsys.exit(2)\n")
    with pytest.raises(lifecycle.HarnessError, match="wrote no JSON"):
        run()
