#!/usr/bin/env bash
# Issue #11 "reconstudio run end to end >= 90 % of reconstudio bench": on the H200, in ONE call,
# the engine benchmark (`reconstudio bench`, synthetic frames already at model resolution) and the
# user's path (`reconstudio run` on a real video: decode, preprocessing, engine, session store,
# TUM export) on the same recipe weights, resolution (640x480 -> 518x392), settings and frame
# count, alternating; optionally with the reader thread off (--prefetch 0), and a py-spy recording
# (every thread, idle included) of the first run to show where the driver's thread spends its time.
# $OUT: run.log (tee it), spy.txt (py-spy summary), e2e_runs.tgz (bench JSONs, the runs' stats CSVs
# with read_ms / push_ms / sinks_ms per frame, raw py-spy stacks), the FlashInfer JIT cache when built.
#
# Here (once): .whl/ (flashinfer 0.6.1, apache-tvm-ffi, nvidia-cudnn-frontend, py-spy),
# .cache/frames/icl_kt3.mp4 (cp ../shared/data/icl_livingroom_kt3/video.mp4), optionally
# .cache/flashinfer_jit.tar.xz.part* from an earlier call.
# Device: carry .whl .cache;  bash benchmarks/h200_end_to_end.sh 2>&1 | tee $OUT/run.log; grep ^RESULT $OUT/run.log
# Knobs: N (frames, 400), VARIANTS ("name=--flag,--flag,value ..." or "name=ENV=1,ENV2=0:--flag,...";
# commas become spaces, an "ENV=V:" prefix sets environment variables for that variant; default
# "default="), REPEATS (1), PREFETCH0=1 (also a run with the reader thread off), GPU_TESTS
# VIDEO / RES (another clip and the model size it runs at, e.g. a 518x378 copy: RES=518x378),
# ("tests/engine/x.py ...", T_TESTS 300 s, TEST_TAIL 25 lines), SPY_FIRST (1), NO_BENCH=1 (runs only: a long soak of the user's path).
set -uo pipefail
. benchmarks/gpu_env.sh
VIDEO=${VIDEO:-.cache/frames/icl_kt3.mp4}; RES=${RES:-518x392}   # RES: the size the video runs at
N=${N:-400}
SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
JIT=$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer
find "$JIT" -name '*.so' 2>/dev/null | sort > /tmp/jit_before.txt
timeout 200 python3 benchmarks/side_by_side.py weights /tmp/recipe.pt 2>&1 | tail -1; el
RS="python3 -m app"; rm -rf /tmp/e2e /tmp/sess_*; mkdir -p /tmp/e2e   # a second call on a warm machine: fresh folders
if [ -n "${GPU_TESTS:-}" ]; then
  timeout "${T_TESTS:-300}" python3 -m pytest -q --tb=short -p no:cacheprovider -p no:pytest-qt $GPU_TESTS 2>&1 | tail -${TEST_TAIL:-25}; el
fi
bench() {   # bench NAME SETTINGS
  echo "== bench $1 ($N frames, synthetic at $RES${2:+, $2})"
  timeout 300 $RS bench --weights /tmp/recipe.pt --resolution "$RES" --frames "$N" --json /tmp/e2e/bench_$1.json $2 2>&1 \
    | grep -v "Warning\|it/s\]" | grep "steady\|latency\|peak\|backend"
  python3 benchmarks/e2e_report.py bench /tmp/e2e/bench_$1.json "$1"; el
}
run() {   # run NAME SETTINGS PREFETCH [spy]
  local name=$1 extra=$2 pf=$3 spy=${4:-}
  local cmd="$RS run $VIDEO --loop --max-frames $N --engine lingbot-map --checkpoint /tmp/recipe.pt --device cuda
             --dtype bf16 --prefetch $pf --trajectory /tmp/e2e/traj_$name.txt --stats-csv /tmp/e2e/stats_$name.csv
             --session-dir /tmp/sess_$name --stats-json /tmp/e2e/final_$name.json --quiet $extra"
  echo "== run $name (prefetch $pf${extra:+, $extra}${spy:+, py-spy})"
  if [ -n "$spy" ] && [ -x "$SPY" ]; then
    timeout 300 "$SPY" record --threads --idle --nonblocking --format raw -r 200 -o /tmp/e2e/spy_$name.txt -- $cmd 2>&1 \
      | grep -v "Warning\|py-spy>" | tail -5
    python3 benchmarks/pyspy_summary.py /tmp/e2e/spy_$name.txt --top 30 > /tmp/e2e/spy_$name.summary.txt 2>&1
    cat /tmp/e2e/spy_$name.summary.txt >> "$OUT/spy.txt"
  else
    timeout 300 $cmd 2>&1 | grep -v "Warning" | tail -3
  fi
  echo "poses exported: $(wc -l < /tmp/e2e/traj_$name.txt)"
  # which attention path and graphs the run's steps took, and any kernel given up
  python3 -c "import json,sys; e=json.load(open(sys.argv[1]))['engine']; print('final stats:', json.dumps({k: e.get(k) for k in ('step_graph', 'kernel_errors', 'resolution')}), json.dumps((e.get('kv') or {}).get('attention_paths')))" /tmp/e2e/final_$name.json 2>&1 | head -3
  python3 benchmarks/e2e_report.py run /tmp/e2e/stats_$name.csv "$name"; el
}
first=${SPY_FIRST:-1}
for v in ${VARIANTS:-default=}; do
  name=${v%%=*}; rest=${v#*=}; envs=""
  case "$rest" in *:*) envs=${rest%%:*}; rest=${rest#*:};; esac
  settings=${rest//,/ }
  (   # an "ENV=V,ENV2=V2:" prefix: environment variables for this variant's bench and runs only
    for e in ${envs//,/ }; do export "$e"; done
    for r in $(seq 1 "${REPEATS:-1}"); do
      [ -z "${NO_BENCH:-}" ] && bench "${name}_$r" "$settings"
      run "${name}_$r" "$settings" 3 $([ "$first" = 1 ] && echo spy); first=0
    done
    if [ -n "${PREFETCH0:-}" ]; then run "${name}_prefetch0" "$settings" 0; fi
  )
  first=0
done
tar -czf "$OUT/e2e_runs.tgz" -C /tmp e2e
find "$JIT" -name '*.so' 2>/dev/null | sort > /tmp/jit_after.txt
if ! cmp -s /tmp/jit_before.txt /tmp/jit_after.txt; then
  XZ_OPT=-T16 tar -cJf /tmp/flashinfer_jit.tar.xz -C "$FLASHINFER_WORKSPACE_BASE" . && \
    split -b 12M -d /tmp/flashinfer_jit.tar.xz "$OUT/flashinfer_jit.tar.xz.part"
fi
el
