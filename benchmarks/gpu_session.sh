#!/usr/bin/env bash
# One GPU-machine session, resumable. Installs the carried wheels (.whl/), then per shapes file
# named on the command line (default: benchmarks/shapes/shapes-dev.csv), each on a GPU of its
# own when there are several, in parallel: tunes it with `tune run` defaults into
# .device/NAME.db (NAME: the file's name without .csv; carry .device to resume an earlier
# session's database) for at most TUNE_SECONDS, copies the database and both exports to
# $OUT/NAME/, and with BENCH=1 runs the vs-cuBLAS benchmark on the exported table.
# With TESTS=1 the GPU tests run on the last GPU meanwhile (TESTS_SELECT: pytest arguments).
# JOBS: compile processes per run (a one-GPU machine's core count keeps runs comparable).
# Usage (device machine, repo root):
#   TUNE_SECONDS=420 BENCH=1 TESTS=1 bash benchmarks/gpu_session.sh [shapes.csv ...]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null || exit 1
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
mkdir -p .device
gpus=$(nvidia-smi --list-gpus | wc -l)
files=("$@")
[[ ${#files[@]} -eq 0 ]] && files=(benchmarks/shapes/shapes-dev.csv)

tune_file() {  # shapes file, GPU index
  local name db out
  name=$(basename "$1" .csv) db=sqlite:///.device/$(basename "$1" .csv).db out=$OUT/$name
  mkdir -p "$out"
  export CUDA_VISIBLE_DEVICES=$2
  timeout -s INT "${TUNE_SECONDS:-420}" tune run --shapes "$1" --jobs "${JOBS:-16}" --db "$db" \
    2>&1 | grep -v '━' | tail -30 >"$out/tune.log"
  python3 -c "import sqlite3; sqlite3.connect('.device/$name.db').execute('PRAGMA wal_checkpoint(TRUNCATE)')"
  cp ".device/$name.db" "$out/tune.db"
  tune export table -o "$out/tuned.yaml" --db "$db" 2>>"$out/tune.log"
  tune export expand -o "$out/mm_hopper_expand.yaml" --db "$db" 2>>"$out/tune.log"
  tune show --db "$db" >"$out/show.txt" 2>&1
  if [[ "${BENCH:-0}" == 1 ]]; then
    python3 benchmarks/vs_cublas.py --shapes "$1" --config "$out/tuned.yaml" \
      --inductor-budget-s "${INDUCTOR_BUDGET_S:-240}" 2>"$out/vs_cublas.stderr" >"$out/vs_cublas.md"
  fi
  echo "$name done"
}

for i in "${!files[@]}"; do
  tune_file "${files[$i]}" $((i % gpus)) &
done
if [[ "${TESTS:-0}" == 1 ]]; then
  CUDA_VISIBLE_DEVICES=$((gpus - 1)) timeout "${TESTS_SECONDS:-540}" python3 -m pytest -m gpu -q \
    -p no:cacheprovider ${TESTS_SELECT:-} >"$OUT/pytest-gpu.txt" 2>&1
  tail -5 "$OUT/pytest-gpu.txt"
fi
wait
