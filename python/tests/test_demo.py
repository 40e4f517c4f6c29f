"""Tests of scripts/demo's pure parts (bench/harness/demo_cli.py and
demos/): which mode a command line selects, each mode's options (defaults,
ranges, the names the bash demos took), and the arithmetic and parsing the
verdict rests on (tensor elements, the ping's reply count, exit statuses,
the tree's leaf sizes), and --bin-dir (the binaries of an unpacked
package). Nothing here needs root or a testbed."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "harness"))
import demo_cli  # noqa: E402
from demos import common, tree  # noqa: E402


def test_default_mode_is_single_with_the_bash_demo_defaults():
    mode, a = demo_cli.parse_args([])
    assert mode.name == "single"
    assert (a.workers, a.hosts, a.mib, a.iterations, a.queues, a.mtu, a.timeout, a.prefix) == \
        (4, 2, 64, 5, 1, 1500, 600, "agg")
    assert a.keep_logs is False and a.json is None


def test_single_options_parse_by_their_old_names():
    mode, a = demo_cli.parse_args(["--workers", "8", "--hosts", "0", "--mib", "1", "--iterations", "2",
                                   "--queues", "4", "--mtu", "9000", "--timeout", "30", "--prefix", "x-1",
                                   "--keep-logs", "--json", "out.json"])
    assert mode.name == "single"
    assert (a.workers, a.hosts, a.mib, a.iterations, a.queues, a.mtu, a.timeout, a.prefix, a.keep_logs, a.json) == \
        (8, 0, 1, 2, 4, 9000, 30, "x-1", True, "out.json")


def test_explicit_single_mode_is_the_same_as_the_default():
    assert vars(demo_cli.parse_args(["single", "--mib", "3"])[1]) == vars(demo_cli.parse_args(["--mib", "3"])[1])


def test_tree_mode_defaults():
    mode, a = demo_cli.parse_args(["tree"])
    assert mode.name == "tree"
    assert (a.leaves, a.spines, a.workers, a.mib, a.iterations, a.timeout, a.prefix) == (2, 2, 2, 16, 3, 600, "tree")


@pytest.mark.parametrize("argv", [["--leaves", "3"], ["--spines", "1", "--workers", "2"], ["--leaves=4"]])
def test_leaves_or_spines_without_a_mode_select_tree(argv):
    mode, _ = demo_cli.parse_args(argv)
    assert mode.name == "tree"


@pytest.mark.parametrize("argv", [
    ["--workers", "0"], ["--workers", "65"], ["--hosts", "156"], ["--mib", "4097"], ["--mtu", "575"],
    ["--mtu", "9001"], ["--queues", "0"], ["--timeout", "0"], ["--iterations", "-1"], ["--workers", "1.5"],
    ["--prefix", "-x"], ["--prefix", "a" * 32], ["--bogus"], ["--leaves", "1"], ["tree", "--spines", "9"],
    ["tree", "--workers", "17"], ["tree", "--mib", "1025"], ["tree", "--prefix", "a" * 22],
    ["tree", "--hosts", "2"],
])
def test_bad_options_exit_2_before_anything_runs(argv, capsys):
    with pytest.raises(SystemExit) as e:
        demo_cli.parse_args(argv)
    assert e.value.code == 2


def test_prefix_limits_match_the_namespace_name_lengths():
    assert demo_cli.parse_args(["--prefix", "a" * 31])[1].prefix == "a" * 31
    assert demo_cli.parse_args(["tree", "--prefix", "b" * 21])[1].prefix == "b" * 21


def test_unknown_mode_is_refused_and_help_lists_every_mode(capsys):
    assert demo_cli.main(["bogus"]) == 2
    assert demo_cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("single", "tree", "--leaves", "--keep-logs", "--hosts"):
        assert name in out


def test_bin_dir_is_an_option_of_single_and_tree_and_absent_by_default():
    assert demo_cli.parse_args([])[1].bin_dir is None
    assert demo_cli.parse_args(["--bin-dir", "/r/usr/bin"])[1].bin_dir == "/r/usr/bin"
    assert demo_cli.parse_args(["tree", "--bin-dir", "d"])[1].bin_dir == "d"
    assert demo_cli.parse_args(["tree"])[1].bin_dir is None


def _fake_bin_dir(path, names, mode=0o755):
    path.mkdir(exist_ok=True)
    for n in names:
        (path / n).write_text("#!/bin/sh\n")
        (path / n).chmod(mode)
    return path


def test_binaries_in_a_bin_dir_are_absolute_and_need_all_three(tmp_path, monkeypatch):
    d = _fake_bin_dir(tmp_path / "usr-bin", ("switchd", "worker", "switchctl"))
    monkeypatch.chdir(tmp_path)
    assert common.binaries_in("usr-bin") == (d / "switchd", d / "worker")
    (d / "switchctl").unlink()
    (d / "worker").chmod(0o644)
    with pytest.raises(common.HarnessError) as e:
        common.binaries_in("usr-bin")
    assert "worker, switchctl" in str(e.value) and str(d) in str(e.value)
    with pytest.raises(common.HarnessError, match="switchd, worker, switchctl"):
        common.binaries_in(tmp_path / "nowhere")


def test_prepare_with_a_bin_dir_runs_setup_but_builds_nothing(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(common, "run_setup", lambda: calls.append("setup"))
    monkeypatch.setattr(common, "build_release", lambda: calls.append("build"))
    d = _fake_bin_dir(tmp_path, ("switchd", "worker", "switchctl"))
    assert common.prepare(str(d)) == (d / "switchd", d / "worker")
    assert calls == ["setup"]


def test_elements_are_float32s_in_the_mib():
    assert common.elements(64) == 16777216
    assert common.elements(1) == 262144


def test_json_path_default_and_relative():
    assert common.json_path("/abs/x.json", "demo", "/cwd") == Path("/abs/x.json")
    assert common.json_path("rel/x.json", "demo", "/cwd") == Path("/cwd/rel/x.json")
    default = common.json_path(None, "demo-tree", "/cwd")
    assert default.parent == common.REPO_ROOT / "results"
    assert default.name.startswith("demo-tree-") and default.suffix == ".json"


PING_OK = """PING 198.18.0.101 (198.18.0.101) 56(84) bytes of data.
--- 198.18.0.101 ping statistics ---
5 packets transmitted, 5 received, 0% packet loss, time 812ms
"""
PING_LOSSY = "5 packets transmitted, 2 received, +3 errors, 60% packet loss, time 900ms\n"
PING_NONE = "5 packets transmitted, 0 received, 100% packet loss, time 4000ms\n"


def test_ping_received_reads_the_summary():
    assert common.ping_received(PING_OK) == 5
    assert common.ping_received(PING_LOSSY) == 2
    assert common.ping_received(PING_NONE) == 0
    assert common.ping_received("connect: Network is unreachable\n") == 0


def test_ping_verdict_needs_exit_0_and_a_reply():
    assert common.ping_verdict(0, PING_OK, "h0 -> B", "h0 -> B") == "yes: h0 -> B, 5/5 replies"
    assert common.ping_verdict(1, PING_LOSSY, "ok", "h0 -> B").startswith("NO: h0 -> B, 2/5 replies")
    assert common.ping_verdict(0, PING_NONE, "ok", "bad").startswith("NO: bad, 0/5")
    assert common.ping_verdict("timeout", PING_OK, "ok", "bad").startswith("NO:")


def test_exit_status_as_the_shell_writes_it():
    assert common.exit_status(0) == 0
    assert common.exit_status(3) == 3
    assert common.exit_status(-15) == 143
    assert common.exit_status(-9) == 137
    assert common.exit_status("timeout") == "timeout"


def test_leaf_sizes_give_every_leaf_its_workers():
    assert tree.leaf_sizes(2, 2) == "2,2"
    assert tree.leaf_sizes(3, 1) == "1,1,1"


def test_ddp_mode_defaults_and_training_arguments_after_the_separator():
    mode, a = demo_cli.parse_args(["ddp"])
    assert mode.name == "ddp"
    assert (a.comm, a.workers, a.steps, a.prefix, a.timeout, a.no_build, a.extra) == \
        ("switch", 4, 100, "train", 600, False, [])
    _, a = demo_cli.parse_args(["ddp", "--comm", "gloo", "--workers", "2", "--steps", "7", "--",
                                "--hidden", "64", "--steps", "3"])
    assert (a.comm, a.workers, a.steps) == ("gloo", 2, 7)
    assert a.extra == ["--hidden", "64", "--steps", "3"]


@pytest.mark.parametrize("argv", [["ddp", "--comm", "nccl"], ["ddp", "--workers", "17"], ["ddp", "--steps", "0"],
                                  ["ddp", "--timeout", "86401"], ["ddp", "--prefix", "a b"],
                                  ["--", "--hidden", "64"], ["tree", "--", "x"]])
def test_ddp_bad_options_and_stray_separator_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        demo_cli.parse_args(argv)
    assert e.value.code == 2


def test_ddp_progress_follower_prints_only_complete_matching_lines(tmp_path, capsys):
    from demos import ddp
    log = tmp_path / "rank0.log"
    log.write_text("W0 warning\nstep 0 loss 2.3 ")
    f = ddp.Follower(log, ddp.PROGRESS)
    f.poll()
    assert capsys.readouterr().out == ""
    with open(log, "a") as out:
        out.write("36 ms\nnoise\nrank 0: loss 1.37\n")
    f.poll()
    assert capsys.readouterr().out == "step 0 loss 2.3 36 ms\nrank 0: loss 1.37\n"
