#!/usr/bin/env bash
#
# net.sh: the ip, tc and namespace work of the benchmarks (scripts/bench),
# as commands; the definitions are lib.sh's. Only links, qdiscs and
# namespaces here: no program logic.
#
# Usage:
#   scripts/net.sh worker-tx PREFIX WORKERS on|off
#   scripts/net.sh shape-workers PREFIX WORKERS TBF_ARGS...
#   scripts/net.sh unshape-workers PREFIX WORKERS
#   scripts/net.sh ifb NS DEV IFB
#   scripts/net.sh slow-ingress NS MBIT
#   scripts/net.sh unslow-ingress NS
#   scripts/net.sh htb NS DEV RATE_MBIT
#   scripts/net.sh ecn-bottleneck DIR RATE_MBIT MIN_BYTES MAX_BYTES NS:DEV...
#   scripts/net.sh ecn-map-id NS DEV
#   scripts/net.sh mpi-hosts ENV_FILE WORKERS HOSTFILE RSH MPI_TMP
#   scripts/net.sh mpirun PREFIX WORKERS HOSTFILE RSH MPI_TMP PROGRAM ARGS...
#
#   worker-tx       transmit checksum offload of every worker's eth0
#                   (set_worker_tx)
#   shape-workers   tbf on every worker link, both ways (shape_worker_links)
#   unshape-workers remove those tbf qdiscs (unshape_worker_links)
#   ifb             DEV's ingress through the ifb device IFB
#                   (redirect_ingress_to_ifb)
#   slow-ingress    NS's eth0 ingress through a deep tbf of MBIT (on ifb0;
#                   slow_ingress); unslow-ingress removes it
#   htb             DEV's egress limited to RATE_MBIT, FIFO (shape_htb)
#   ecn-bottleneck  shaped, CE-marking FIFOs (setup_ecn_bottleneck); prints
#                   the marker used: bpf or red
#   ecn-map-id      the id of the CE marker's counter map on DEV's egress
#   mpi-hosts       the hostfile and ssh stand-in that let mpirun run one
#                   rank per worker namespace (write_mpi_hosts)
#   mpirun          exec mpirun PROGRAM in PREFIX-w0 over those namespaces,
#                   TCP on eth0 (run_mpirun)

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $# -ge 1 ]] || die "a command is needed (see --help)"
cmd="$1"
shift
case "$cmd" in
    worker-tx) set_worker_tx "$@" ;;
    shape-workers) shape_worker_links "$@" ;;
    unshape-workers) unshape_worker_links "$@" ;;
    ifb) redirect_ingress_to_ifb "$@" ;;
    slow-ingress) slow_ingress "$@" ;;
    unslow-ingress) unslow_ingress "$@" ;;
    htb) shape_htb "$@" ;;
    ecn-bottleneck)
        setup_ecn_bottleneck "$@"
        echo "$ECN_MARKER"
        ;;
    ecn-map-id) ecn_marker_map_id "$@" ;;
    mpi-hosts)
        TESTBED_ENV="$1"
        shift
        write_mpi_hosts "$@"
        ;;
    mpirun) run_mpirun "$@" ;;
    -h | --help) usage ;;
    *) die "unknown command '$cmd' (see --help)" ;;
esac
