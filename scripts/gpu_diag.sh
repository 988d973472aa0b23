#!/usr/bin/env bash
# Diagnosis call on the H200: profiler tables for the SDPA and FlashInfer sessions.
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
export PYTHONPATH=.:${PYTHONPATH:-}
timeout 200 python3 scripts/gpu_profile.py --backend sdpa --variants 2>&1 | tee "$OUT/profile_sdpa.txt"
timeout 150 python3 scripts/gpu_profile.py --backend flashinfer 2>&1 | tee "$OUT/profile_flashinfer.txt"
