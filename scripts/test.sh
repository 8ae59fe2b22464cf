#!/usr/bin/env bash
# The test command (README "Set up"; also the last step of .ci/run).
# Runs every test of the workspace. GPU tests are opt-in and say why they skip.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-prometheus.sh  # promtool/prometheus for the observability tests; no-op when present

cargo test --workspace "$@"
