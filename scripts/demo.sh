#!/usr/bin/env bash
# scripts/demo.sh: the README's first command. It runs scripts/demo (the
# demos' command line, Python on bench/harness) with the same arguments:
#   sudo scripts/demo.sh [single|tree|ddp] [options]    (--help: all of them)
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/demo" "$@"
