#!/usr/bin/env bash
# Issue #11's fp8 attention in one H200 call (carry .whl, and .cache when it holds a JIT build):
# cuDNN's fp8 kernel at the steady shape (benchmarks/fp8_attention_bench.py), FlashInfer's fp8
# kernels beside its bf16 ones (benchmarks.kv_microbench --kv-dtype fp8 --fp8-kinds kv,fa3), the
# FlashInfer JIT build saved to $OUT for the next call, then whole-model benches (VARIANTS:
# name=ENV:flag,flag ... as in h200_long_stream.sh). Results go to $OUT.
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
python3 -c "import torch, cudnn; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'frontend', cudnn.__version__)"
python3 benchmarks/fp8_attention_bench.py --json "$OUT/fp8_attention.json" 2>&1 | tail -20; el
if [ -z "${NO_FI:-}" ]; then
  timeout "${FI_TIMEOUT:-360}" python3 -m benchmarks.kv_microbench --device cuda --kv-dtype fp8 --fp8-kinds kv,fa3 \
    --iters 30 --json "$OUT/fp8_flashinfer.json" 2>&1 | tail -25; el
fi
if [ -n "${SAVE_JIT:-1}" ] && [ -d "$FLASHINFER_WORKSPACE_BASE" ]; then
  tar -C "$FLASHINFER_WORKSPACE_BASE" -cf - . | xz -T0 -3 | split -b 15M - "$OUT/flashinfer_jit.tar.xz.part"
  ls -la "$OUT"; el
fi
N=${N:-300}; mkdir -p "$OUT/r"
for spec in ${VARIANTS:-}; do
  name=${spec%%=*}; rest=${spec#*=}; envs=""; flags=$rest
  case "$rest" in *:*) envs=${rest%%:*}; flags=${rest#*:};; esac
  echo "== variant $name: env [$envs] flags [$flags]"
  env ${envs//,/ } timeout "${BENCH_TIMEOUT:-200}" python3 -m app bench --device cuda --dtype bf16 --weights random \
    --frames "$N" ${flags//,/ } --json "$OUT/r/bench_$name.json" 2>&1 | tail -6; el
done
cd "$OUT" && tar -czf results.tgz r && rm -rf r; ls -la "$OUT"
