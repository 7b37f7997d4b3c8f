#!/usr/bin/env bash
# One GPU-machine session of the issue-2 proof, resumable: installs the carried wheels, runs
# the GPU tests (first session only), tunes benchmarks/shapes/shapes-dev.csv into
# .device/tune.db for at most TUNE_SECONDS, and copies the database to $OUT.
# Usage (device machine, repo root): TUNE_SECONDS=420 bash benchmarks/gpu_session.sh [tests]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
mkdir -p .device
if [ "${1:-}" = tests ]; then
  timeout 240 python3 -m pytest -m gpu -q -x -p no:cacheprovider 2>&1 | tail -15
fi
timeout -s INT "${TUNE_SECONDS:-420}" tune run --shapes benchmarks/shapes/shapes-dev.csv \
  --trials 40 --db sqlite:///.device/tune.db 2>&1 | grep -v '━' | tail -40
python3 -c "import sqlite3; sqlite3.connect('.device/tune.db').execute('PRAGMA wal_checkpoint(TRUNCATE)')"
cp .device/tune.db "$OUT/tune.db"
tune show --db sqlite:///.device/tune.db 2>&1 | tail -40
