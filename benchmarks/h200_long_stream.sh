#!/usr/bin/env bash
# Issue #11 "≥ 30 FPS over 3,000 frames": `reconstudio bench` streams of a few thousand frames at
# 518x378 with a sweep row every few hundred frames, so the FPS before and after the special
# stream's cap (frame ~1,030) can be read apart. One device call; carry .whl .cache.
# $OUT: run.log (tee it), bench_<name>.json, sweep_<name>.csv, the FlashInfer JIT cache when built.
# Knobs: VARIANTS ("name=--flag,--flag,value ..." or "name=ENV=1:--flag,..."; commas become
#   spaces, an "ENV=V:" prefix sets environment variables for that bench only), N (3000),
#   SWEEP ("300,600,...,N"), GPU_TESTS ("tests/engine/x.py ..."), PROFILE ("--flag ..." for
#   benchmarks/gpu_profile.py; empty = none), T_BENCH (timeout per bench, 240 s), ATT_FRAMES
#   ("700 1100": one-layer attention_bench.py at those stream lengths, ATT_ONLY paths, before the
#   benches), T_TESTS (420 s).
set -uo pipefail
. benchmarks/gpu_env.sh
N=${N:-3000}
SWEEP=${SWEEP:-$(seq -s, 300 300 "$N")}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
JIT=$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer
find "$JIT" -name '*.so' 2>/dev/null | sort > /tmp/jit_before.txt
timeout 200 python3 benchmarks/side_by_side.py weights /tmp/recipe.pt 2>&1 | tail -1; el
if [ -n "${GPU_TESTS:-}" ]; then
  timeout "${T_TESTS:-420}" python3 -m pytest -q --tb=short -p no:cacheprovider -p no:pytest-qt $GPU_TESTS 2>&1 | tail -${TEST_TAIL:-40}; el
fi
for f in ${ATT_FRAMES:-}; do
  echo "== attention_bench --frames $f"
  timeout 120 python3 benchmarks/attention_bench.py --frames "$f" --reps 50 --steps 10 \
      --only "${ATT_ONLY:-flashinfer dense,sdpa flash,cudnn split (torch cuDNN A + flash B)}" \
      --json "$OUT/attention_$f.json" 2>&1 | grep -v Warning | tail -12; el
done
for v in ${VARIANTS:-split-compiled=--backend,cudnn-split,--compile-blocks}; do
  name=${v%%=*}; rest=${v#*=}; envs=""
  case "$rest" in *:*) envs=${rest%%:*}; rest=${rest#*:};; esac
  settings=${rest//,/ }
  echo "== bench $name ($N frames, 518x378, ${envs:+$envs }$settings)"
  env ${envs//,/ } timeout "${T_BENCH:-240}" python3 -m app bench --weights /tmp/recipe.pt --frames "$N" \
      --sweep "$SWEEP" --csv "$OUT/sweep_$name.csv" --json "$OUT/bench_$name.json" $settings 2>&1 \
    | grep -v "Warning\|it/s\]" | grep -i "steady\|latency\|peak\|backend\|sweep\|error\|fps" | head -20
  [ -f "$OUT/sweep_$name.csv" ] && cat "$OUT/sweep_$name.csv"
  el
done
if [ -n "${PROFILE:-}" ]; then
  echo "== gpu_profile $PROFILE"
  timeout 240 python3 benchmarks/gpu_profile.py $PROFILE 2>&1 | grep -v Warning | tail -40; el
fi
find "$JIT" -name '*.so' 2>/dev/null | sort > /tmp/jit_after.txt
if ! cmp -s /tmp/jit_before.txt /tmp/jit_after.txt; then
  XZ_OPT=-T16 tar -cJf /tmp/flashinfer_jit.tar.xz -C "$FLASHINFER_WORKSPACE_BASE" . && \
    split -b 12M -d /tmp/flashinfer_jit.tar.xz "$OUT/flashinfer_jit.tar.xz.part"
fi
el
