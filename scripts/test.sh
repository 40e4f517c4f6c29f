#!/usr/bin/env bash
#
# test.sh: the project's whole test run (what CI runs through .ci/run).
#
# Usage:
#   sudo scripts/test.sh [--quick]
#
# Stages, in order:
#   setup      scripts/setup.sh (installs missing packages)
#   lint       shellcheck --severity=warning on scripts/*.sh and .ci/run
#              (setup installs shellcheck; skipped only if it is missing)
#   fmt        cargo fmt --all --check
#   layout     scripts/module_cycles.py: no import cycle between the files
#              of any crate (docs/ARCHITECTURE.md, layer rules)
#   clippy     cargo clippy --workspace --all-targets -- -D warnings
#   build      cargo build --release --workspace --bins
#   package    scripts/package.sh --no-build [--demo]: the Debian package
#              aggswitch (cargo-deb), its contents, conffile, unit
#              (systemd-analyze verify where it exists) and shipped config;
#              as root (not with --quick) also the single-switch demo with
#              the binaries unpacked from it and switchd confined as the
#              unit says (about 15 s); without root that part is skipped
#              with a message
#   unit       cargo test --workspace --exclude agg-e2e
#   scaling    target/release/engine_scaling for 0.2 s per configuration
#              (1 and 2 threads, both layouts, every built backend; a few
#              seconds): fails on a RESULT that differs from the rank-order
#              reference (scripts/bench scaling is the measurement)
#   loom       model checks of the concurrent slot engine: RUSTFLAGS="--cfg loom"
#              LOOM_MAX_PREEMPTIONS=2 cargo test --release -p agg-proto --lib engine
#              (in target/loom, so that the normal build stays valid)
#   python     build the aggswitch package into the project venv (maturin
#              develop --release) and run its pytest suite (python/tests,
#              on the loopback stand-in switch: no root needed)
#   e2e        cargo test --release -p agg-e2e --no-fail-fast --
#              --include-ignored --test-threads=1
#              (needs root: the tests make veth/netns testbeds with
#              scripts/testbed.sh and run target/release/{switchd,worker};
#              each is #[ignore = "needs root"], so a plain cargo test lists
#              them as ignored and this stage includes them)
#   fuzz       each cargo-fuzz target of fuzz/ for 30 s, when cargo-fuzz is
#              installed and fuzz/ exists
# The e2e stage includes the PyTorch DDP and FSDP runs (tests/tests/
# torch_ddp.rs, torch_fsdp.rs, torch_fallback.rs: switchd killed or stopped
# mid-run, torch_tree_fallback.rs: a tree's spine killed, torch_tenants.rs:
# DDP by a tenant's variables only), which use the
# venv's python and the package the python stage built, and the runs of
# several worker threads per rank (tests/tests/worker_threads.rs: T = 2 and
# 4 under faults and a switchd restart, and the fallback to one thread).
# --quick skips e2e, fuzz and the package demo. Without root, e2e is skipped with a message,
# except under CI=true, where not being root is an error. A failing stage
# does not stop the later ones (but build failing skips e2e and setup failing
# stops everything); the exit status is non-zero if any stage failed. The
# last lines are the summed cargo test and pytest counts (skipped = tests
# cargo test ignored + tests pytest skipped, each also shown on its own) and
# the stages that ran.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly FUZZ_SECONDS=30
# Lines of each failed test's panic message in the closing summary.
readonly PANIC_LINES=60

QUICK=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --quick) QUICK=1; shift ;;
        -h|--help)
            usage
            exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

IS_ROOT=0
[[ "$(id -u)" -eq 0 ]] && IS_ROOT=1
if [[ "${CI:-}" == true && "$IS_ROOT" -ne 1 ]]; then
    die "CI=true but not root: the end-to-end tests need root; run as root: sudo scripts/test.sh"
fi

cd "$REPO_ROOT"

RAN=()
SKIPPED=()
FAILED=()
TEST_LOG="$(mktemp "${TMPDIR:-/tmp}/agg-test.XXXXXX")"
PY_LOG="$(mktemp "${TMPDIR:-/tmp}/agg-pytest.XXXXXX")"

# panic_message NAME: the panic of test NAME in the cargo test log, from its
# "thread 'NAME' (TID) panicked at" line to the end of the message (the
# backtrace, the note about RUST_BACKTRACE, the next test's output or the
# failures list), at most PANIC_LINES lines, then how many more the log has.
panic_message() {
    awk -v name="$1" -v max="$PANIC_LINES" '
        !on && index($0, "thread '"'"'" name "'"'"' ") { on = 1 }
        !on { next }
        /^stack backtrace:/ || /^note: run with `RUST_BACKTRACE/ || /^---- / || /^failures:$/ { exit }
        /^$/ { blank++; next }
        {
            for (; blank > 0; blank--) if (++n <= max) print ""; else more++
            if (++n <= max) print; else more++
        }
        END { if (more) printf "... (%d more lines in the log)\n", more }
    ' "$TEST_LOG"
}

# failures: each failed test's name and its panic message (the torch tests'
# include the failed ranks' stderr), and pytest's FAILED lines, so that the
# end of the log says what failed and why.
failures() {
    local name
    echo "failed tests:"
    while read -r name; do
        echo "  $name"
        panic_message "$name" | sed 's/^/    /' || true
    done < <(sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' "$TEST_LOG" | head -n 20)
    grep -F "process didn't exit successfully" "$TEST_LOG" | head -n 5 | sed 's/^/  /' || true
    grep -E '^(FAILED|ERROR) ' "$PY_LOG" | head -n 20 | sed 's/^/  /' || true
}

summary() {
    local passed=0 failed=0 ignored=0 py_skipped=0 p f i
    # Sum cargo test's "test result: ok. 3 passed; 0 failed; 1 ignored; ..." lines.
    while read -r p f i; do
        passed=$((passed + p)); failed=$((failed + f)); ignored=$((ignored + i))
    done < <(sed -n 's/.*test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed; \([0-9]*\) ignored.*/\1 \2 \3/p' "$TEST_LOG")
    # pytest's last line: "== 3 failed, 34 passed, 1 skipped in 9.1s ==".
    local last word
    last="$(tail -n 1 "$PY_LOG")"
    for word in passed failed skipped; do
        [[ "$last" =~ ([0-9]+)\ $word ]] || continue
        case "$word" in
            passed) passed=$((passed + BASH_REMATCH[1])) ;;
            failed) failed=$((failed + BASH_REMATCH[1])) ;;
            skipped) py_skipped=$((py_skipped + BASH_REMATCH[1])) ;;
        esac
    done
    echo
    if ((failed > 0)); then
        failures
    fi
    echo "of the skipped: $ignored ignored by cargo test, $py_skipped skipped by pytest"
    echo "tests: $passed passed, $failed failed, $((ignored + py_skipped)) skipped"
    local ran="${RAN[*]:-none}" skipped="none" failedst="${FAILED[*]:-none}"
    if ((${#SKIPPED[@]} > 0)); then
        skipped="$(printf '%s, ' "${SKIPPED[@]}")"
        skipped="${skipped%, }"
    fi
    echo "test.sh: stages ran: $ran; failed: $failedst; skipped: $skipped"
}

cleanup() {
    local rc=$?
    summary
    rm -f -- "$TEST_LOG" "$PY_LOG"
    if ((${#FAILED[@]} > 0)) && [[ "$rc" -eq 0 ]]; then
        rc=1
    fi
    exit "$rc"
}
trap cleanup EXIT

# stage NAME CMD...: run CMD as stage NAME, record the outcome; returns its status.
stage() {
    local name="$1" start rc=0
    shift
    printf '\n==> %s: %s\n' "$name" "$*" >&2
    start=$SECONDS
    "$@" || rc=$?
    if [[ "$rc" -eq 0 ]]; then
        RAN+=("$name")
        log "stage $name passed ($((SECONDS - start)) s)"
    else
        RAN+=("$name")
        FAILED+=("$name")
        log "stage $name FAILED with status $rc ($((SECONDS - start)) s)"
    fi
    return "$rc"
}

skip() {
    SKIPPED+=("$1 ($2)")
    printf '\n==> %s: skipped: %s\n' "$1" "$2" >&2
}

# cargo_test ARGS...: cargo test, its output also kept for the counts.
cargo_test() {
    cargo test "$@" 2>&1 | tee -a "$TEST_LOG"
}

# loom_tests: the slot engine's loom model checks (proto/src/switch/engine/).
loom_tests() (
    export RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR="$REPO_ROOT/target/loom"
    # The model checks only: a test elsewhere whose name says "engine" runs
    # real threads, which loom refuses outside a model.
    cargo_test --release -p agg-proto --lib switch::engine::
)

# python_tests: build the package into the venv, then pytest python/tests.
# (A subshell: build_python_package's die must fail the stage, not test.sh.)
python_tests() (
    build_python_package
    "$VENV_PYTHON" -m pytest -q -rfEs "$REPO_ROOT/python/tests" 2>&1 | tee "$PY_LOG"
)

run_fuzz() {
    local -a cargo_fuzz=(cargo fuzz) targets=()
    local t
    if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
        cargo_fuzz=(cargo +nightly fuzz)
    else
        # cargo fuzz needs unstable flags; let the stable toolchain accept them.
        export RUSTC_BOOTSTRAP=1
    fi
    mapfile -t targets < <("${cargo_fuzz[@]}" list)
    ((${#targets[@]} > 0)) || { log "fuzz/: no fuzz targets"; return 0; }
    for t in "${targets[@]}"; do
        [[ -n "$t" ]] || continue
        log "fuzzing $t for $FUZZ_SECONDS s"
        "${cargo_fuzz[@]}" run "$t" -- -max_total_time="$FUZZ_SECONDS" || return 1
    done
}

# --- setup --------------------------------------------------------------------
stage setup bash "$REPO_ROOT/scripts/setup.sh" || exit 1
ensure_cargo_path

# --- lint -----------------------------------------------------------------------
if command -v shellcheck >/dev/null 2>&1; then
    shopt -s nullglob
    sh_files=(scripts/*.sh .ci/run)
    shopt -u nullglob
    stage lint shellcheck -x --severity=warning "${sh_files[@]}" || true
else
    skip lint "shellcheck not installed"
fi
stage fmt cargo fmt --all --check || true
stage layout "$VENV_PYTHON" "$REPO_ROOT/scripts/module_cycles.py" "$REPO_ROOT" || true
stage clippy cargo clippy --workspace --all-targets -- -D warnings || true

# --- build and unit tests ---------------------------------------------------------
BUILD_OK=1
stage build cargo build --release --workspace --bins || BUILD_OK=0
if [[ "$BUILD_OK" -ne 1 ]]; then
    skip package "build failed"
elif [[ "$QUICK" -eq 1 ]]; then
    skip "package demo" "--quick"
    stage package bash "$REPO_ROOT/scripts/package.sh" --no-build || true
elif [[ "$IS_ROOT" -ne 1 ]]; then
    skip "package demo" "needs root: sudo scripts/test.sh"
    stage package bash "$REPO_ROOT/scripts/package.sh" --no-build || true
else
    stage package bash "$REPO_ROOT/scripts/package.sh" --no-build --demo || true
fi
stage unit cargo_test --workspace --exclude agg-e2e || true
if [[ "$BUILD_OK" -eq 1 ]]; then
    stage scaling "$REPO_ROOT/target/release/engine_scaling" --threads 1,2 --seconds 0.2 --repeats 1 || true
else
    skip scaling "build failed"
fi
stage loom loom_tests || true
stage python python_tests || true

# --- end-to-end tests ---------------------------------------------------------------
if [[ "$QUICK" -eq 1 ]]; then
    skip e2e "--quick"
elif [[ "$IS_ROOT" -ne 1 ]]; then
    skip e2e "needs root: sudo scripts/test.sh"
elif [[ "$BUILD_OK" -ne 1 ]]; then
    skip e2e "build failed"
else
    # Where the tests find what they drive (they may also work these out).
    export AGG_TESTBED="$REPO_ROOT/scripts/testbed.sh"
    export AGG_SWITCHD="$REPO_ROOT/target/release/switchd"
    export AGG_WORKER="$REPO_ROOT/target/release/worker"
    export AGG_PYTHON="$VENV_PYTHON"
    # --include-ignored: every e2e test is #[ignore = "needs root"].
    stage e2e cargo_test --release -p agg-e2e --no-fail-fast -- --include-ignored --test-threads=1 || true
fi

# --- fuzzing -----------------------------------------------------------------------
if [[ "$QUICK" -eq 1 ]]; then
    skip fuzz "--quick"
elif [[ ! -d fuzz ]]; then
    skip fuzz "no fuzz/ folder"
elif ! command -v cargo-fuzz >/dev/null 2>&1; then
    skip fuzz "cargo-fuzz not installed: cargo install cargo-fuzz"
else
    stage fuzz run_fuzz || true
fi

((${#FAILED[@]} == 0))
