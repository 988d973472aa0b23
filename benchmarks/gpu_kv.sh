#!/usr/bin/env bash
# KV-cache checks on the GPU machine (H200): GPU tests, FlashInfer vs SDPA agreement, and the
# steady-state global-attention micro-benchmark; the FlashInfer JIT cache comes back as a tarball.
# Usage (repo root, on the GPU machine; OUT = folder for results): bash benchmarks/gpu_kv.sh
set -uo pipefail
. benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, flashinfer; print('torch', torch.__version__, 'flashinfer', flashinfer.__version__)" 2>&1 | tail -3
# 1. micro-benchmark first: it triggers (and times) the JIT compile of the paged prefill kernels
python3 -m benchmarks.kv_microbench --device cuda --dtype bf16 --frames 71 --json "$OUT/kv_microbench_72frames.json" --time-budget 250 2>&1 | tee "$OUT/kv_microbench.txt"
echo "elapsed $(( $(date +%s) - t0 )) s"
# steady state after the special cap filled (1024 specials + window): the long-run size
python3 -m benchmarks.kv_microbench --device cuda --dtype bf16 --frames 1100 --flashinfer fa3 --json "$OUT/kv_microbench_1100frames.json" 2>&1 | tee -a "$OUT/kv_microbench.txt"
echo "elapsed $(( $(date +%s) - t0 )) s"
# 2. tests: GPU module + the CPU cache tests
python3 -m pytest -q -p no:cacheprovider tests/engine/test_kv_gpu.py tests/engine/test_kv_cache.py 2>&1 | tail -15 | tee "$OUT/kv_tests.txt"
echo "elapsed $(( $(date +%s) - t0 )) s"
# 3. the JIT cache, for later runs to carry
if [ -d "$FLASHINFER_WORKSPACE_BASE" ]; then
  # the whole workspace (sources, objects, ninja logs, .so) so ninja finds it up to date next time;
  # split in parts small enough to come back from the machine
  XZ_OPT=-T16 tar -cJf /tmp/flashinfer_jit.tar.xz -C "$FLASHINFER_WORKSPACE_BASE" .
  ls -la /tmp/flashinfer_jit.tar.xz && split -b 12M -d /tmp/flashinfer_jit.tar.xz "$OUT/flashinfer_jit.tar.xz.part"
fi
