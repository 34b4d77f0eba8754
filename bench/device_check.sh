#!/usr/bin/env bash
# Runs bench/device_check.py on the GPU machine: installs the carried wheels (.whl/: zarr, numcodecs, donfig,
# google-crc32c, duckdb; see the script's docstring) and this package into /tmp/site, writes into $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --target /tmp/site .
export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
cd /tmp  # import featstore from /tmp/site, not from the source tree
python3 "$OLDPWD/bench/device_check.py" --out "${OUT:-/tmp/device_check}" "$@" 2>&1 | tee "${OUT:-/tmp/device_check}/log.txt"
