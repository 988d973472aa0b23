#!/usr/bin/env bash
# Issue #11, the cuDNN split (backend "cudnn-split", CuDNNSplitBackend) in
# ONE call on the H200: versions; its GPU tests (+ the CPU ones); one global-attention layer at
# the steady shape (attention_bench.py: the split beside FlashInfer dense, plain cuDNN, SDPA flash
# and the padding-mask form, and where the split's time goes); ours side by side (side_by_side.py
# ours: default kf 1 / 2 + $VARIANTS); the kernel-time profile of the split; with UP=1 last upstream
# (~130 s) and the report. $OUT: gpu_tests.txt, attention.json, ours.json, profile.txt (+ upstream.json,
# side_by_side.txt with UP=1; + run.log when run as `bash ... 2>&1 | tee $OUT/run.log`).
# Here (once): .whl/ (flashinfer-python 0.6.1, apache-tvm-ffi, nvidia-cudnn-frontend), .cache/
# (FlashInfer JIT build, frames), .upstream/; device: carry .whl .cache .upstream;
#   bash benchmarks/h200_cudnn_split.sh 2>&1 | tee $OUT/run.log
set -uo pipefail
. benchmarks/gpu_env.sh
VIDEO=.cache/frames/icl_kt3.mp4
SBS="python3 benchmarks/side_by_side.py"
N=${N:-300}
VARIANTS=${VARIANTS:-cudnn-split,cudnn-split-compiled,compiled,cudnn-split-compiled:2,cudnn-split:2,compiled:2}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -c "import torch, flashinfer, cudnn; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'torch cudnn', torch.backends.cudnn.version(), 'flashinfer', flashinfer.__version__, 'cudnn frontend', \
cudnn.__version__, 'cudnn backend', cudnn.backend_version())"
# recipe weights on the CPU cores while the GPU runs the tests and the layer benchmark
$SBS weights /tmp/recipe.pt > /tmp/weights.log 2>&1 &
WPID=$!
timeout ${T_TESTS:-150} python3 -m pytest -q -p no:cacheprovider -p no:pytest-qt -rs --durations=8 \
  ${TESTS:-tests/engine/test_cudnn_split_gpu.py tests/engine/test_cudnn_split.py} 2>&1 | tee "$OUT/gpu_tests.txt" | tail -25; el
timeout ${T_ATT:-120} python3 benchmarks/attention_bench.py --frames "${NA:-300}" --reps 50 --steps 20 \
  --only "${ONLY:-flashinfer dense,sdpa,split,seq_len (dense)}" --json "$OUT/attention.json" 2>&1; el
wait $WPID; cat /tmp/weights.log; el
timeout ${T_OURS:-280} $SBS ours --no-fidelity --weights /tmp/recipe.pt --video $VIDEO --frames "$N" --variants "$VARIANTS" \
  --json "$OUT/ours.json" 2>&1 | grep -v Warning; el
if [ "${T_PROF:-70}" != 0 ]; then
  timeout ${T_PROF:-70} python3 benchmarks/gpu_profile.py --backend cudnn-split --frames 80 \
    > "$OUT/profile.txt" 2>&1
  grep "^\[\|SDPA alone" "$OUT/profile.txt"; el
fi
# upstream last (UP=1): what runs out of time is its row, not ours
if [ -n "${UP:-}" ]; then
  timeout ${T_UP:-140} $SBS upstream --no-eager --weights /tmp/recipe.pt --video $VIDEO --frames "$N" --fid-frames 40 \
    --upstream .upstream --json "$OUT/upstream.json" 2>&1 | grep -v "Warning\|it/s\]\|pretrained"; el
  $SBS report "$OUT/ours.json" "$OUT/upstream.json" 2>&1 | tee "$OUT/side_by_side.txt"; el
fi
