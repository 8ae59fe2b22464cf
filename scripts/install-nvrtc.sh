#!/usr/bin/env bash
# Makes sure NVIDIA's NVRTC (CUDA 13) is at hand for the test that compiles every CUDA
# kernel source: the PyPI wheel `nvidia-cuda-nvrtc` ships libnvrtc, which compiles
# without a GPU or a driver. Installed once into target/nvrtc-venv (git-ignored);
# prints the directory holding libnvrtc.so.13. Quiet and idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/nvrtc-venv
lib_dir() {
    find "$venv" -name 'libnvrtc.so.13' -printf '%h\n' 2>/dev/null | head -n 1
}

if [ -z "$(lib_dir)" ]; then
    if ! log="$(python3 -m venv "$venv" 2>&1 && "$venv/bin/pip" install -q 'nvidia-cuda-nvrtc>=13,<14' 2>&1)"; then
        echo "install-nvrtc: installing the nvidia-cuda-nvrtc wheel into $venv failed:" >&2
        echo "$log" >&2
        exit 1
    fi
fi
found="$(lib_dir)"
if [ -z "$found" ]; then
    echo "install-nvrtc: the wheel installed, but no libnvrtc.so.13 is under $venv" >&2
    exit 1
fi
echo "$(pwd)/$found"
