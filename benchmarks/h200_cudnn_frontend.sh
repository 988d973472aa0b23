#!/usr/bin/env bash
# Issue #11, cuDNN through its frontend (backend "cudnn", CuDNNSeqLenBackend) in ONE call on the
# H200: versions; which frontend form keeps cuDNN's fast path (cudnn_forms_bench.py); one
# global-attention layer per path at the steady shape (attention_bench.py: the sequence-length
# form's variants beside FlashInfer dense, plain cuDNN SDPA and SDPA flash, agreement with SDPA);
# the GPU tests ($TESTS); with SBS=1 then ours vs upstream side by side plus the kernel-time
# profiles (benchmarks/h200_issue11.sh with NO_TESTS=1, VARIANTS as given).
# $OUT: forms.json, attention.json, gpu_tests.txt (+ ours.json, upstream.json, side_by_side.txt,
# profile.txt with SBS=1; + run.log when run as `bash ... 2>&1 | tee $OUT/run.log`).
# Here (once): .whl/ holds flashinfer-python 0.6.1, apache-tvm-ffi and nvidia-cudnn-frontend
# (cp312); device: carry .whl .cache (.upstream with SBS=1);
#   bash benchmarks/h200_cudnn_frontend.sh 2>&1 | tee $OUT/run.log
set -uo pipefail
. benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, flashinfer, cudnn; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'torch cudnn', torch.backends.cudnn.version(), 'flashinfer', flashinfer.__version__, 'cudnn frontend', \
cudnn.__version__, 'cudnn backend', cudnn.backend_version())"
timeout ${T_FORMS:-90} python3 benchmarks/cudnn_forms_bench.py --json "$OUT/forms.json" 2>&1; el
timeout ${T_ATT:-150} python3 benchmarks/attention_bench.py --frames 300 --reps 50 --steps 20 --json "$OUT/attention.json" 2>&1; el
TESTS=${TESTS:-"tests/engine/test_cudnn_seqlen_gpu.py tests/engine/test_cudnn_backend_gpu.py tests/engine/test_scheduler_gpu.py \
tests/engine/test_flashinfer_dense_gpu.py tests/engine/test_streaming_gpu.py tests/engine/test_streaming_deferred.py \
tests/engine/test_compile_blocks.py"}
timeout ${T_TESTS:-300} python3 -m pytest -q -p no:cacheprovider -p no:pytest-qt -rs --durations=12 $TESTS 2>&1 \
  | tee "$OUT/gpu_tests.txt" | tail -40; el
if [ -n "${SBS:-}" ]; then
  NO_TESTS=1 bash benchmarks/h200_issue11.sh; el
fi
