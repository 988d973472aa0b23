#!/usr/bin/env bash
# Full-model benchmark on the GPU machine (H200), default settings: 518x378, bf16, window 64,
# 8 scale frames, keyframe interval 1, 4 camera iterations, random recipe-scaled weights.
# Usage (repo root on the GPU machine; carry .whl and .cache):
#   bash benchmarks/gpu_bench.sh              speed (SDPA, FlashInfer), breakdown, GPU tests, profile
#   bash benchmarks/gpu_bench.sh sweep 10000  the memory sweep 64 ... 10000 frames alone (one stream,
#                                          ~9.5 min at 18 FPS: a call of its own)
set -uo pipefail
. benchmarks/gpu_env.sh
MODE=${1:-speed}; SWEEP_MAX=${2:-10000}
B="python3 -m app bench --device cuda --dtype bf16"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ "$MODE" = sweep ]; then
  timeout 580 $B --backend flashinfer --frames 10 --sweep 64,1000,2000,3000,5000,7500,$SWEEP_MAX \
    --csv "$OUT/bench_sweep.csv" --json "$OUT/bench_sweep.json" 2>&1 | tee "$OUT/sweep.txt"; el
  exit 0
fi
timeout 90 $B --backend sdpa --frames 300 --json "$OUT/bench_sdpa.json" 2>&1 | tee "$OUT/bench.txt"; el
timeout 120 $B --backend flashinfer --frames 300 --json "$OUT/bench_flashinfer.json" 2>&1 | tee -a "$OUT/bench.txt"; el
# per-part breakdown (CUDA events around each part; slightly slower than the plain run)
timeout 80 $B --backend sdpa --frames 200 --breakdown --json "$OUT/bench_breakdown.json" 2>&1 | tee -a "$OUT/bench.txt"; el
timeout 200 python3 -m pytest -q -p no:cacheprovider -p no:pytest-qt tests/engine/test_kv_gpu.py \
  tests/engine/test_streaming_gpu.py tests/engine/test_streaming.py 2>&1 | tail -5 | tee "$OUT/gpu_tests.txt"; el
# profiler summary (CPU vs GPU time per frame); --variants also times each SDPA kernel choice
timeout 90 python3 benchmarks/gpu_profile.py --backend sdpa 2>&1 | tail -4 | tee "$OUT/profile.txt"; el
