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
from scenarios import SCENARIOS, scaling  # noqa: E402


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
                              "scaling", "train", "transports", "tree", "fairness", "soak"}
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
