#!/usr/bin/env bash
# Issue #11 in ONE call on the H200: GPU tests of the new paths, one global-attention layer per
# path, ours vs upstream LingBot-Map side by side (same recipe weights, same 300 real frames,
# bf16, window 64, 8 scale frames, 4 camera iterations; ours: default + variants, bf16 vs fp32
# fidelity; upstream: torch.compile, its fastest, + its bf16 fidelity), then a kernel-time profile
# of our default and of the cuDNN fixed-capacity backend (backend=cudnn). $OUT gets at most 8 files (the device tool's limit): ours.json, upstream.json,
# attention.json, side_by_side.txt, profile.txt and, when this run built a FlashInfer module, the
# JIT cache; everything else is printed (run it as `bash ... 2>&1 | tee $OUT/run.log`).
#
# Here (once; see benchmarks/side_by_side.sh): .upstream/ (exported upstream lingbot_map/),
# .cache/frames/icl_kt3.mp4, .whl/ (flashinfer 0.6.1 + apache-tvm-ffi), .cache/flashinfer_jit.*
# Device: carry .whl .cache .upstream;  bash benchmarks/h200_issue11.sh 2>&1 | tee $OUT/run.log
set -uo pipefail
. benchmarks/gpu_env.sh
VIDEO=.cache/frames/icl_kt3.mp4
SBS="python3 benchmarks/side_by_side.py"
N=${N:-300}; FID=${FID:-40}
T_OURS=${T_OURS:-300}; T_UP=${T_UP:-140}
VARIANTS=${VARIANTS:-fi,sync,all-graphs,compiled,cudnn,cudnn-compiled}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -c "import torch, flashinfer; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'flashinfer', flashinfer.__version__)"
JIT=$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer
find "$JIT" -name '*.so' 2>/dev/null | sort > /tmp/jit_before.txt
# recipe weights on the CPU cores while the GPU runs the tests and the attention benchmark
$SBS weights /tmp/recipe.pt > /tmp/weights.log 2>&1 &
WPID=$!
# NO_TESTS=1: skip the attention benchmark and the GPU tests (run before in the same call, e.g. by
# benchmarks/h200_cudnn_frontend.sh)
if [ -z "${NO_TESTS:-}" ]; then
timeout 200 python3 benchmarks/attention_bench.py --frames "$N" --json "$OUT/attention.json" 2>&1; el
timeout 160 python3 -m pytest -q -p no:cacheprovider -p no:pytest-qt \
  tests/engine/test_flashinfer_dense_gpu.py tests/engine/test_host_copy.py tests/engine/test_streaming_gpu.py \
  tests/engine/test_streaming_deferred.py tests/engine/test_compile_blocks.py tests/engine/test_cudnn_backend_gpu.py \
  tests/engine/test_cudnn_seqlen_gpu.py 2>&1 | tail -12; el
fi
wait $WPID; cat /tmp/weights.log; el
timeout "$T_UP" $SBS upstream --no-eager --weights /tmp/recipe.pt --video $VIDEO --frames "$N" --fid-frames "$FID" \
  --upstream .upstream --json "$OUT/upstream.json" --npz /tmp/upstream_fp32.npz 2>&1 \
  | grep -v "Warning\|it/s\]\|pretrained"; el
timeout "$T_OURS" $SBS ours --weights /tmp/recipe.pt --video $VIDEO --frames "$N" --fid-frames "$FID" --variants "$VARIANTS" \
  --json "$OUT/ours.json" --npz /tmp/ours_fp32.npz 2>&1 | grep -v Warning; el
$SBS report "$OUT/ours.json" "$OUT/upstream.json" --npz-ours /tmp/ours_fp32.npz --npz-upstream /tmp/upstream_fp32.npz \
  2>&1 | tee "$OUT/side_by_side.txt"; el
timeout 60 python3 benchmarks/gpu_profile.py --backend flashinfer --frames 80 > "$OUT/profile.txt" 2>&1
# the cuDNN fixed-capacity backend's kernel time (appended: $OUT holds at most 8 files)
timeout 60 python3 benchmarks/gpu_profile.py --backend cudnn --frames 80 >> "$OUT/profile.txt" 2>&1
grep "^\[\|SDPA alone" "$OUT/profile.txt"; el
# the FlashInfer JIT cache comes back only when this run built something new
find "$JIT" -name '*.so' 2>/dev/null | sort > /tmp/jit_after.txt
if ! cmp -s /tmp/jit_before.txt /tmp/jit_after.txt; then
  comm -13 /tmp/jit_before.txt /tmp/jit_after.txt
  XZ_OPT=-T16 tar -cJf /tmp/flashinfer_jit.tar.xz -C "$FLASHINFER_WORKSPACE_BASE" . && \
    split -b 12M -d /tmp/flashinfer_jit.tar.xz "$OUT/flashinfer_jit.tar.xz.part"
fi
el
