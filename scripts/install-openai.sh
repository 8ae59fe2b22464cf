#!/usr/bin/env bash
# Makes sure the official `openai` Python client (PyPI) is at hand for the test that
# drives `stagehand serve` with it (tests/serve_openai.rs). Installed once into
# target/openai-venv (git-ignored); prints the venv's python. Quiet and idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/openai-venv
python="$venv/bin/python"

if ! "$python" -c 'import openai' >/dev/null 2>&1; then
    if ! log="$(python3 -m venv "$venv" 2>&1 && "$venv/bin/pip" install -q 'openai>=1.40,<3' 2>&1)"; then
        echo "install-openai: installing the openai package into $venv failed:" >&2
        echo "$log" >&2
        exit 1
    fi
fi
if ! "$python" -c 'import openai' >/dev/null 2>&1; then
    echo "install-openai: the package installed, but $python cannot import openai" >&2
    exit 1
fi
echo "$(pwd)/$python"
