# shellcheck shell=bash
#
# lib.sh: helpers shared by the scripts in scripts/. Sourced, never run:
#
#   # shellcheck source=scripts/lib.sh
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Defines: REPO_ROOT, log, warn, die, require_root, ensure_cargo_path,
# is_uint, uint_in_range, netns_exists.

# Refuse to be run directly.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    echo "lib.sh is sourced by the other scripts, not run" >&2
    exit 2
fi

# The repository root (the folder holding scripts/).
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export REPO_ROOT

# The calling script's name, for messages ("testbed.sh: ...").
SCRIPT_NAME="$(basename "$0")"

log() {
    printf '%s: %s\n' "$SCRIPT_NAME" "$*" >&2
}

warn() {
    printf '%s: warning: %s\n' "$SCRIPT_NAME" "$*" >&2
}

die() {
    printf '%s: error: %s\n' "$SCRIPT_NAME" "$*" >&2
    exit 1
}

# require_root [ARGS...]: exit with a clear message unless running as root.
# ARGS are the caller's arguments, repeated in the suggested command line.
require_root() {
    if [[ "$(id -u)" -ne 0 ]]; then
        local rel="scripts/$SCRIPT_NAME"
        [[ "$SCRIPT_NAME" == run ]] && rel=".ci/run"
        die "run as root: sudo $rel${*:+ $*}"
    fi
}

# ensure_cargo_path: put ~/.cargo/bin on PATH when cargo is not found.
ensure_cargo_path() {
    if ! command -v cargo >/dev/null 2>&1; then
        if [[ -f "${HOME:-/root}/.cargo/env" ]]; then
            # shellcheck source=/dev/null
            source "${HOME:-/root}/.cargo/env"
        elif [[ -x "${HOME:-/root}/.cargo/bin/cargo" ]]; then
            PATH="${HOME:-/root}/.cargo/bin:$PATH"
            export PATH
        fi
    fi
    command -v cargo >/dev/null 2>&1 ||
        die "cargo not found (looked on PATH and in ~/.cargo); install the Rust toolchain with rustup"
}

# is_uint STRING: true when STRING is a non-negative decimal integer.
is_uint() {
    [[ "$1" =~ ^[0-9]+$ ]]
}

# uint_in_range STRING MIN MAX: true when STRING is an integer in MIN..MAX.
uint_in_range() {
    is_uint "$1" && ((${#1} <= 9 && 10#$1 >= $2 && 10#$1 <= $3))
}

# netns_exists NAME: true when the named network namespace exists.
netns_exists() {
    local name _rest
    while read -r name _rest; do
        [[ "$name" == "$1" ]] && return 0
    done < <(ip netns list 2>/dev/null)
    return 1
}
