"""bench/harness/benchkit.py: the one CPU definition and the quantiles every
benchmark report uses (issue 24: a published figure must not depend on
which script made it)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "harness"))
import benchkit  # noqa: E402

#            user nice system idle iowait irq softirq steal guest guest_nice
BEFORE = "cpu  100 10 50 1000 20 5 15 0 40 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"
AFTER = "cpu  200 10 90 1100 40 5 35 10 90 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"


def test_busy_counts_guest_time_once_and_iowait_as_idle():
    # busy: user +100, system +40, softirq +20, steal +10 = 170; guest's
    # +50 is already inside user's +100. idle: idle +100, iowait +20.
    assert benchkit.busy_jiffies(benchkit.cpu_fields(AFTER)) - benchkit.busy_jiffies(
        benchkit.cpu_fields(BEFORE)) == 170
    assert benchkit.busy_fraction(BEFORE, AFTER) == pytest.approx(170 / 290)
    assert benchkit.busy_seconds(BEFORE, AFTER) == pytest.approx(170 / benchkit.CLK_TCK)
    assert benchkit.busy_fraction(BEFORE, BEFORE) is None


def test_a_text_without_the_cpu_line_is_an_error_that_says_so():
    with pytest.raises(ValueError, match='no "cpu" line'):
        benchkit.cpu_fields("cpu0 1 2 3 4 5 6 7 8\n")


def test_process_time_survives_a_command_with_spaces_and_parentheses():
    stat = "4242 (worker (rank 1)) S 1 2 3 4 5 6 7 8 9 10 300 45 0 0 20 0 1 0 5 6 7"
    assert benchkit.proc_jiffies(stat) == 345


def test_quantiles_interpolate_like_numpy_and_skip_missing_values():
    xs = [4.0, None, 1.0, 3.0, 2.0]
    assert benchkit.median(xs) == 2.5
    assert benchkit.quantile(xs, 0.0) == 1.0
    assert benchkit.quantile(xs, 1.0) == 4.0
    assert benchkit.quantile(xs, 0.99) == pytest.approx(3.97)
    assert benchkit.quantile([None], 0.5) is None


def test_tables_mark_missing_cells_and_right_align_numbers():
    t = benchkit.markdown_table(["config", " s"], [["gloo", 1.23456], ["switch", None]])
    assert t.splitlines() == ["| config | s |", "|---|---:|", "| gloo | 1.235 |", "| switch | – |"]
