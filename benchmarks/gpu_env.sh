# Sourced by the benchmarks/*.sh scripts on the GPU machine (repo root; carry .whl and .cache):
# installs the carried wheels into /tmp/site with --no-deps (FlashInfer and its needs; torchao
# 0.18.0, built for torch 2.11, for weight_dtype int8 / fp8), unpacks a carried FlashInfer JIT build,
# and sets OUT (results folder), FLASHINFER_WORKSPACE_BASE and unbuffered Python output.
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
  # freshly installed headers would look newer than a carried JIT build and make ninja rebuild
  # everything (~2 min): date them back so the carried build is reused
  find /tmp/site -exec touch -h -d '2000-01-01 00:00:00' {} + 2>/dev/null
fi
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws} PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
if ls .cache/flashinfer_jit.tar.xz.part* >/dev/null 2>&1; then
  mkdir -p "$FLASHINFER_WORKSPACE_BASE" && cat .cache/flashinfer_jit.tar.xz.part* | tar -xJf - -C "$FLASHINFER_WORKSPACE_BASE"
fi
export PYTHONPATH=.:${PYTHONPATH:-}
t0=$(date +%s); el() { echo "== elapsed $(( $(date +%s) - t0 )) s"; }
