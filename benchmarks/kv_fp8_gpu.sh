#!/usr/bin/env bash
# fp8 KV on the H200 (issue 10), one call. Every step is cut to what is left of DEADLINE seconds.
#   bash benchmarks/kv_fp8_gpu.sh [DEADLINE=165]        JIT-builds FlashInfer's FA2 fp8-KV kernel (bf16 q,
#       e4m3 K/V), the full model's peak with fp8 weights + fp8 KV (SDPA while building, then
#       FlashInfer), the one-layer fp8 micro-benchmark, the GPU tests.
# It brings the refreshed JIT cache back. GPU machine, repo root; carry .whl and .cache.
set -uo pipefail
DEADLINE=${1:-165}
. benchmarks/gpu_env.sh
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 .cache/h7whl/*.whl \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, flashinfer, torchao; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'flashinfer', flashinfer.__version__, 'torchao', torchao.__version__)" 2>&1 | tail -1
el
# 1. the JIT build (its exit status into a file)
(python3 benchmarks/kv_fp8_bench.py build > /tmp/build_kv.txt 2>&1; echo $? > /tmp/built_kv) &
# 2. full model, fp8 weights + fp8 KV: SDPA while the kernel builds, FlashInfer once FA2 is built
timeout $(( $(left) - 55 )) python3 benchmarks/kv_fp8_bench.py memory --out "$OUT/kv_fp8_memory.json" --frames 76 \
  --wait-for /tmp/built_kv --deadline-s $(( $(left) - 80 )) 2>&1 | grep -v "Warning\|warn(" | tail -8
el; tail -3 /tmp/build_kv.txt
# 3. one global layer at the steady-state size: fp8 store vs the same keys in bf16
[ "$(left)" -gt 20 ] && timeout $(( $(left) - 12 )) python3 -m benchmarks.kv_microbench --device cuda --kv-dtype fp8 \
  --iters 30 --json "$OUT/kv_fp8_microbench.json" 2>&1 | tail -10
el
# 4. GPU tests of the KV cache (FlashInfer fp8 included)
[ "$(left)" -gt 12 ] && timeout $(( $(left) - 6 )) python3 -m pytest -q -s -p no:cacheprovider -p no:pytest-qt \
  tests/engine/test_kv_gpu.py 2>&1 | grep -v "Warning\|warn(" | tail -25 | tee "$OUT/kv_fp8_tests.txt"
el
# 5. the JIT cache (whole workspace, so ninja finds it up to date next time)
XZ_OPT="-T16 -1" tar -cJf /tmp/flashinfer_jit.tar.xz -C "$FLASHINFER_WORKSPACE_BASE" . 2>/dev/null
ls -la /tmp/flashinfer_jit.tar.xz && split -b 12M -d /tmp/flashinfer_jit.tar.xz "$OUT/flashinfer_jit.tar.xz.part"
el
