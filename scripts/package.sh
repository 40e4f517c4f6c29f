#!/usr/bin/env bash
#
# package.sh: build the Debian package aggswitch (packaging/) and check it.
#
# Usage:
#   scripts/package.sh [--no-build] [--demo]
#
#   --no-build  take target/release as it is (test.sh's build stage made it);
#               otherwise cargo build --release -p switchd -p agg-worker --bins
#   --demo      also run the single-switch demo (scripts/demo --bin-dir) with
#               the binaries unpacked from the package, switchd confined as
#               the unit confines it (needs root: it makes a testbed)
#
# Builds target/debian/aggswitch_VERSION-1_ARCH.deb with cargo-deb
# (`cargo deb -p switchd --no-build --strip`; scripts/setup.sh installs
# cargo-deb) and checks:
#   * its control fields: Package aggswitch, the workspace's version,
#     Depends naming libc6; /etc/aggswitch/switchd.toml is its one conffile
#   * its contents: /usr/bin/{switchd,switchctl,worker} executable, the unit
#     in /usr/lib/systemd/system, the config at mode 0600, the tmpfiles.d
#     entries of /run/aggswitch and /var/lib/aggswitch
#   * unpacked (dpkg-deb -x) into a temporary root, removed on exit: every
#     library the binaries need resolves and is one Depends covers (libc6,
#     and libgcc-s1 that every Debian system has); the unit's ExecStart
#     names /usr/bin/switchd and /etc/aggswitch/switchd.toml, both in the
#     package; `systemd-analyze verify` finds nothing to say about the unit
#     (ExecStart pointed at the unpacked switchd; skipped with a message
#     where systemd-analyze is missing); systemd-tmpfiles makes both
#     directories in the root (where it exists); the packaged switchd's
#     check-config refuses the config as shipped and accepts it with ports
#     and addresses filled in
#   * with --demo: the demo passes with switchd run through a wrapper that
#     applies the unit's CapabilityBoundingSet (setpriv, nothing else),
#     NoNewPrivileges, UMask, and ProtectSystem=strict / ProtectHome /
#     ProtectKernelTunables / ProtectControlGroups as read-only mounts in a
#     mount namespace of its own (writable: /run/aggswitch and the demo's
#     run folder, which stands for /var/lib/aggswitch and /etc/aggswitch);
#     switchd's own `setpriv --dump` is checked against the unit's set.
# Exits non-zero, naming the failed check, on the first failure.

set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly UNIT=aggswitch-switchd.service
readonly CONFIG=/etc/aggswitch/switchd.toml
readonly BINARIES=(switchd switchctl worker)
# The demo's size: a few seconds of all-reduce.
readonly DEMO_ARGS=(--workers 4 --mib 16 --iterations 3 --timeout 120)

BUILD=1
DEMO=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --no-build) BUILD=0; shift ;;
        --demo) DEMO=1; shift ;;
        -h|--help)
            usage
            exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ "$DEMO" -eq 0 ]] || require_root "$@"

cd "$REPO_ROOT"
ensure_cargo_path
cargo deb --version >/dev/null 2>&1 ||
    die "cargo-deb is not installed: run scripts/setup.sh (or cargo install cargo-deb --locked)"

ROOT=""
cleanup() {
    [[ -z "$ROOT" ]] || rm -rf -- "$ROOT"
}
trap cleanup EXIT

# check WHAT CMD...: run CMD; on failure die naming WHAT.
check() {
    local what="$1"
    shift
    "$@" || die "check failed: $what"
}

# --- build ----------------------------------------------------------------------
if [[ "$BUILD" -eq 1 ]]; then
    log "building (cargo build --release -p switchd -p agg-worker --bins)"
    cargo build --release -p switchd -p agg-worker --bins
fi
for b in "${BINARIES[@]}"; do
    [[ -x "target/release/$b" ]] ||
        die "target/release/$b missing: cargo build --release --workspace --bins (or drop --no-build)"
done
log "building the package (cargo deb -p switchd --no-build --strip)"
out="$(cargo deb -p switchd --no-build --strip 2>&1)" || die "cargo deb -p switchd --no-build --strip failed: $out"
DEB="$(tail -n 1 <<<"$out")"
[[ "$DEB" == *.deb && -f "$DEB" ]] || die "cargo deb did not print the path of a .deb: $out"
log "built $DEB ($(du -k "$DEB" | cut -f1) KiB)"

# --- control fields -------------------------------------------------------------
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
field() { dpkg-deb -f "$DEB" "$1"; }
check "Package is aggswitch (got '$(field Package)')" test "$(field Package)" = aggswitch
check "Version is the workspace's $VERSION-1 (got '$(field Version)')" test "$(field Version)" = "$VERSION-1"
check "Depends names libc6 (got '$(field Depends)')" grep -q '^libc6\b' <<<"$(field Depends)"
CONFFILES="$(dpkg-deb --ctrl-tarfile "$DEB" | tar -xO ./conffiles)"
check "conffiles is exactly $CONFIG (got '$CONFFILES')" test "$CONFFILES" = "$CONFIG"

# --- contents -------------------------------------------------------------------
CONTENTS="$(dpkg-deb -c "$DEB")"
# has MODE PATH: the listing has PATH with permissions MODE (ls -l style).
has() {
    awk -v mode="$1" -v path="./${2#/}" '$1 == mode && $6 == path { found = 1 } END { exit !found }' <<<"$CONTENTS" ||
        die "check failed: the package has no $2 with mode $1; it holds:"$'\n'"$CONTENTS"
}
for b in "${BINARIES[@]}"; do
    has -rwxr-xr-x "/usr/bin/$b"
done
has -rw-r--r-- "/usr/lib/systemd/system/$UNIT"
has -rw------- "$CONFIG"
has -rw-r--r-- /usr/lib/tmpfiles.d/aggswitch-switchd.conf

ROOT="$(mktemp -d "${TMPDIR:-/tmp}/aggswitch-root.XXXXXX")"
dpkg-deb -x "$DEB" "$ROOT"
chmod 755 "$ROOT"
UNIT_FILE="$ROOT/usr/lib/systemd/system/$UNIT"
TMPFILES="$ROOT/usr/lib/tmpfiles.d/aggswitch-switchd.conf"
for d in /run/aggswitch /var/lib/aggswitch; do
    check "the tmpfiles.d entries make $d" grep -Eq "^d $d 0750 root root" "$TMPFILES"
done

# --- the binaries' libraries ----------------------------------------------------
for b in "${BINARIES[@]}"; do
    libs="$(ldd "$ROOT/usr/bin/$b")"
    check "every library of $b resolves: $libs" test -z "$(grep 'not found' <<<"$libs" || true)"
    other="$(grep -Ev '^\s*(linux-vdso\.so|libc\.so|libgcc_s\.so|/lib64/ld-linux|/lib/ld-linux)' <<<"$libs" || true)"
    check "$b needs only libc and libgcc_s (Depends covers nothing else): $other" test -z "$other"
done

# --- the unit -------------------------------------------------------------------
check "the unit runs /usr/bin/switchd run --config $CONFIG" \
    grep -q "^ExecStart=/usr/bin/switchd run --config $CONFIG " "$UNIT_FILE"
check "the unit restarts switchd on failure (the watchdog's status 70)" grep -qx 'Restart=on-failure' "$UNIT_FILE"
for key in RuntimeDirectory StateDirectory ConfigurationDirectory; do
    check "the unit's $key is aggswitch" grep -qx "$key=aggswitch" "$UNIT_FILE"
done
if command -v systemd-analyze >/dev/null 2>&1; then
    # verify wants ExecStart's binary to exist: a copy pointing at the
    # unpacked one. It exits 0 on warnings (an unknown key, a bad value), so
    # any output is a failure.
    mkdir "$ROOT/verify"
    sed "s#^ExecStart=/usr/bin/switchd #ExecStart=$ROOT/usr/bin/switchd #" "$UNIT_FILE" >"$ROOT/verify/$UNIT"
    out="$(systemd-analyze verify "$ROOT/verify/$UNIT" 2>&1)" || die "systemd-analyze verify $UNIT failed: $out"
    [[ -z "$out" ]] || die "systemd-analyze verify $UNIT has something to say: $out"
    log "systemd-analyze verify $UNIT: clean"
else
    log "systemd-analyze not installed: the unit is not verified"
fi
if command -v systemd-tmpfiles >/dev/null 2>&1; then
    systemd-tmpfiles --create --root="$ROOT" "$TMPFILES"
    for d in /run/aggswitch /var/lib/aggswitch; do
        check "systemd-tmpfiles made $d in the root" test -d "$ROOT$d"
    done
else
    log "systemd-tmpfiles not installed: the tmpfiles.d entries are only read, not applied"
fi

# --- the shipped config with the packaged switchd -------------------------------
SWITCHD="$ROOT/usr/bin/switchd"
if out="$("$SWITCHD" check-config --config "$ROOT$CONFIG" 2>&1)"; then
    die "check failed: the config as shipped (no ports) was accepted: $out"
fi
check "the config as shipped is refused with the message to fill in the ports: $out" \
    grep -q 'switch.ports is empty: list the interfaces to attach to' <<<"$out"
sed -e 's/^ports = \[\]$/ports = ["ens1f0", "ens1f1"]/' -e 's/^addresses = \[\]$/addresses = ["198.18.0.1"]/' \
    "$ROOT$CONFIG" >"$ROOT/filled-in.toml"
out="$("$SWITCHD" check-config --config "$ROOT/filled-in.toml" 2>&1)" ||
    die "check failed: the packaged switchd refuses the shipped config with ports filled in: $out"
log "the shipped config, ports filled in: $(head -n 1 <<<"$out")"
log "package checks passed: $DEB"

[[ "$DEMO" -eq 1 ]] || exit 0

# --- the demo from the unpacked root, confined as the unit says ------------------
# The capabilities of CapabilityBoundingSet=, as setpriv names them.
CAPS="$(sed -n 's/^CapabilityBoundingSet=//p' "$UNIT_FILE")"
[[ -n "$CAPS" ]] || die "the unit has no CapabilityBoundingSet="
WANT="$(tr ' ' '\n' <<<"$CAPS" | sed 's/^CAP_//' | tr 'A-Z' 'a-z' | sort | paste -sd, -)"
check "the unit sets NoNewPrivileges=yes" grep -qx 'NoNewPrivileges=yes' "$UNIT_FILE"
for key in ProtectSystem=strict ProtectHome=yes PrivateTmp=yes ProtectKernelTunables=yes ProtectControlGroups=yes \
    UMask=0077; do
    check "the unit sets $key (the demo's confinement assumes it)" grep -qx "$key" "$UNIT_FILE"
done
BIN="$ROOT/confined"
mkdir "$BIN"
ln -s "$ROOT/usr/bin/switchctl" "$ROOT/usr/bin/worker" "$BIN/"
# inner: in a mount namespace of its own, every mount read-only but /dev
# and /proc (/proc/sys too), /home and /root empty and closed, /run/aggswitch
# and the demo's run folders writable, umask 0077; then switchd with the
# unit's capabilities and no new privileges, after recording them.
cat >"$BIN/inner" <<EOF
#!/bin/bash
set -euo pipefail
mkdir -p /run/aggswitch
findmnt -rn -o TARGET | sort -u | while read -r m; do
    case "\$m" in /proc|/proc/*|/dev|/dev/*) continue ;; esac
    mount -o remount,bind,ro "\$m" 2>/dev/null || echo "confined switchd: could not make \$m read-only" >&2
done
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
for w in /run/aggswitch /tmp/agg-demo.* "$BIN"; do
    mount --bind "\$w" "\$w"
    mount -o remount,bind,rw "\$w"
done
for h in /home /root; do
    [[ ! -d "\$h" ]] || mount -t tmpfs -o ro,mode=000 tmpfs "\$h"
done
umask 0077
exec setpriv --no-new-privs --inh-caps=-all --bounding-set=-all$(tr ',' '\n' <<<"$WANT" | sed 's/^/,+/' | tr -d '\n') \\
    /bin/sh -c 'setpriv --dump >"$BIN/dump"; exec "\$0" "\$@"' "$ROOT/usr/bin/switchd" "\$@"
EOF
cat >"$BIN/switchd" <<EOF
#!/bin/bash
exec unshare --mount --propagation private "$BIN/inner" "\$@"
EOF
chmod 755 "$BIN/inner" "$BIN/switchd"
log "the single-switch demo with $BIN (switchd from the package, bounding set $WANT, no new privileges, read-only system)"
start=$SECONDS
check "the demo with the packaged binaries" "$REPO_ROOT/scripts/demo" single --bin-dir "$BIN" "${DEMO_ARGS[@]}" \
    --json "$ROOT/demo.json"
GOT="$(sed -n 's/^Capability bounding set: //p' "$BIN/dump" | tr ',' '\n' | sort | paste -sd, -)"
check "switchd ran with the unit's bounding set $WANT (setpriv --dump: $GOT)" test "$GOT" = "$WANT"
check "switchd ran with no_new_privs (setpriv --dump)" grep -qx 'no_new_privs: 1' "$BIN/dump"
log "demo passed in $((SECONDS - start)) s with switchd confined as $UNIT says"
