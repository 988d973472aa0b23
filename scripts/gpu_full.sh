#!/usr/bin/env bash
# One device call on the H200: GPU tests (FlashInfer vs SDPA cache agreement, GPU session tests),
# then the full-model benchmark at 518x378, bf16, window 64, 8 scale frames, keyframe interval 1,
# 4 camera iterations: SDPA speed, per-part breakdown, FlashInfer speed.
# Usage (repo root on the GPU machine; carry .whl and .cache): bash scripts/gpu_full.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
  find /tmp/site -exec touch -h -d '2000-01-01 00:00:00' {} + 2>/dev/null
fi
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws} PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
if ls .cache/flashinfer_jit.tar.xz.part* >/dev/null 2>&1; then
  mkdir -p "$FLASHINFER_WORKSPACE_BASE" && cat .cache/flashinfer_jit.tar.xz.part* | tar -xJf - -C "$FLASHINFER_WORKSPACE_BASE"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
t0=$(date +%s); el() { echo "== elapsed $(( $(date +%s) - t0 )) s"; }
B="python3 -m app bench --device cuda --dtype bf16"
timeout 100 $B --backend sdpa --frames 300 --json "$OUT/bench_sdpa.json" 2>&1 | tee "$OUT/bench.txt"; el
timeout 80 $B --backend sdpa --frames 200 --breakdown --json "$OUT/bench_breakdown.json" 2>&1 | tee -a "$OUT/bench.txt"; el
timeout 240 python3 -m pytest -q -p no:cacheprovider -p no:pytest-qt tests/engine/test_kv_gpu.py tests/engine/test_streaming.py 2>&1 | tail -8 | tee "$OUT/gpu_tests.txt"; el
timeout 120 $B --backend flashinfer --frames 300 --json "$OUT/bench_flashinfer.json" 2>&1 | tee -a "$OUT/bench.txt"; el
