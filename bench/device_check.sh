#!/usr/bin/env bash
# Runs bench/device_check.py on the GPU machine: installs the carried wheels (.whl/: zarr, numcodecs, donfig,
# google-crc32c, duckdb; obstore too when a baseline needs it; see the script's docstring) and this package into
# /tmp/site, and a carried baseline (.baseline/: another featstore's source) into /tmp/site-base; writes into $OUT.
# Arguments go to the script (e.g. --sections images,stages,resnet50).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --target /tmp/site .
baseline=()
if [ -d .baseline ]; then
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir \
        --target /tmp/site-base ./.baseline
    baseline=(--baseline-site /tmp/site-base)
fi
export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
out="${OUT:-/tmp/device_check}"
mkdir -p "$out"
cd /tmp  # import featstore from /tmp/site, not from the source tree
python3 "$OLDPWD/bench/device_check.py" --out "$out" "${baseline[@]}" "$@" 2>&1 | tee "$out/log.txt"
