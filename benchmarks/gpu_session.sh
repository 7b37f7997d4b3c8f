#!/usr/bin/env bash
# One GPU-machine session, resumable: installs the carried wheels (.whl/), optionally runs the
# GPU tests, tunes benchmarks/shapes/shapes-dev.csv into .device/tune.db for at most
# TUNE_SECONDS (carry .device to resume an earlier session's database), copies the database
# and both exports to $OUT, and optionally runs the vs-cuBLAS benchmark on the exported table.
# Usage (device machine, repo root): TUNE_SECONDS=420 bash benchmarks/gpu_session.sh [tests] [bench]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
mkdir -p .device
DB=sqlite:///.device/tune.db
if [[ " $* " == *" tests "* ]]; then
  timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -25
fi
timeout -s INT "${TUNE_SECONDS:-420}" tune run --shapes benchmarks/shapes/shapes-dev.csv \
  --trials 40 --db "$DB" 2>&1 | grep -v '━' | tail -40
python3 -c "import sqlite3; sqlite3.connect('.device/tune.db').execute('PRAGMA wal_checkpoint(TRUNCATE)')"
cp .device/tune.db "$OUT/tune.db"
tune export --format table -o "$OUT/tuned.yaml" --db "$DB"
tune export --format expand -o "$OUT/mm_hopper_expand.yaml" --db "$DB"
tune show --db "$DB" 2>&1 | tail -60
if [[ " $* " == *" bench "* ]]; then
  python3 benchmarks/vs_cublas.py --shapes benchmarks/shapes/shapes-dev.csv \
    --config "$OUT/tuned.yaml" 2>"$OUT/vs_cublas.stderr" | tee "$OUT/vs_cublas.md"
fi
