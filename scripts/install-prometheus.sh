#!/usr/bin/env bash
# Makes sure Debian's `prometheus` (which also ships `promtool`) is installed, because the
# observability tests check the exposition, the rules and a live scrape with the real tools.
# Quiet and idempotent: does nothing when both binaries are already on PATH.
set -euo pipefail

if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    exit 0
fi

# Root can install directly; anyone else needs passwordless sudo.
if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo -n)
else
    echo "install-prometheus: prometheus/promtool are missing and this user cannot run apt-get;" >&2
    echo "install them with: apt-get install -y --no-install-recommends prometheus" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
if ! log="$("${SUDO[@]}" apt-get update -qq 2>&1 \
    && "${SUDO[@]}" apt-get install -y -qq --no-install-recommends prometheus 2>&1)"; then
    echo "install-prometheus: installing Debian's prometheus failed:" >&2
    echo "$log" >&2
    exit 1
fi

# The Debian package may start a system service on install; the tests start their own
# prometheus on a free loopback port, so a running service is harmless but unneeded.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    echo "install-prometheus: apt-get succeeded but promtool/prometheus are still not on PATH" >&2
    exit 1
fi
