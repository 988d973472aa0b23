set -uo pipefail
OUT=${OUT:-out}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
  find /tmp/site -exec touch -h -d '2000-01-01 00:00:00' {} + 2>/dev/null
fi
export FLASHINFER_WORKSPACE_BASE=/tmp/fiws PYTHONUNBUFFERED=1 MAX_JOBS=16
mkdir -p /tmp/fiws && cat .cache/flashinfer_jit.tar.xz.part* | tar -xJf - -C /tmp/fiws
B="python3 -m app bench --device cuda --dtype bf16"
timeout 90 $B --backend sdpa --frames 300 --json "$OUT/bench_sdpa.json" 2>&1 | tee "$OUT/bench.txt"
timeout 90 $B --backend flashinfer --frames 300 --json "$OUT/bench_flashinfer.json" 2>&1 | tee -a "$OUT/bench.txt"
timeout 80 $B --backend sdpa --frames 200 --breakdown --json "$OUT/bench_breakdown.json" 2>&1 | tee -a "$OUT/bench.txt"
PYTHONPATH=.:$PYTHONPATH timeout 60 python3 scripts/gpu_profile.py --backend sdpa 2>&1 | tail -4 | tee "$OUT/profile.txt"
