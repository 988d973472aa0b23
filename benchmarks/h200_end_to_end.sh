#!/usr/bin/env bash
# Issue #11 "reconstudio run end to end >= 90 % of reconstudio bench": on the H200, in ONE call,
# the engine benchmark (`reconstudio bench`, synthetic frames already at model resolution) and the
# user's path (`reconstudio run` on a real video: decode, preprocessing, engine, session store,
# TUM export) on the same recipe weights, resolution (640x480 -> 518x392) and frame count, with
# the reader thread off (--prefetch 0) and on; py-spy recordings (every thread, idle included) of
# the runs show where the driver's thread spends its time. $OUT: bench.json, spy.txt (py-spy
# summaries), e2e_runs.tgz (the runs' stats CSVs with read_ms / push_ms / sinks_ms per frame, raw
# py-spy stacks), the FlashInfer JIT cache when this call built it.
#
# Here (once): .whl/ (flashinfer 0.6.1, apache-tvm-ffi, nvidia-cudnn-frontend, py-spy),
# .cache/frames/icl_kt3.mp4 (cp ../shared/data/icl_livingroom_kt3/video.mp4), optionally
# .cache/flashinfer_jit.tar.xz.part* from an earlier call.
# Device: carry .whl .cache;  bash benchmarks/h200_end_to_end.sh 2>&1 | tee $OUT/run.log
set -uo pipefail
. benchmarks/gpu_env.sh
VIDEO=.cache/frames/icl_kt3.mp4
N=${N:-400}
RUN_ARGS=${RUN_ARGS:-}                # extra settings for both bench and run (e.g. --backend cudnn-split)
SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
JIT=$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer
find "$JIT" -name '*.so' 2>/dev/null | sort > /tmp/jit_before.txt
timeout 200 python3 benchmarks/side_by_side.py weights /tmp/recipe.pt 2>&1 | tail -1; el
RS="python3 -m app"; mkdir -p /tmp/e2e
echo "== bench (synthetic frames at 518x392, $N frames)"
timeout 240 $RS bench --weights /tmp/recipe.pt --resolution 518x392 --frames "$N" --json "$OUT/bench.json" $RUN_ARGS 2>&1 \
  | grep -v "Warning\|it/s\]"; el
run() {   # run NAME PREFETCH [py-spy]
  local name=$1 pf=$2 spy=${3:-}
  local cmd="$RS run $VIDEO --loop --max-frames $N --engine lingbot-map --checkpoint /tmp/recipe.pt --device cuda
             --dtype bf16 --prefetch $pf --trajectory /tmp/$name.txt --stats-csv /tmp/e2e/stats_$name.csv
             --session-dir /tmp/sess_$name --quiet $RUN_ARGS"
  echo "== run $name (prefetch $pf${spy:+, py-spy})"
  if [ -n "$spy" ] && [ -x "$SPY" ]; then
    timeout 200 "$SPY" record --threads --idle --nonblocking --format raw -r 200 -o /tmp/e2e/spy_$name.txt -- $cmd 2>&1 \
      | grep -v "Warning\|py-spy>" | tail -5
    python3 benchmarks/pyspy_summary.py /tmp/e2e/spy_$name.txt --top 30 > /tmp/e2e/spy_$name.summary.txt 2>&1
    cat /tmp/e2e/spy_$name.summary.txt >> "$OUT/spy.txt"; head -45 /tmp/e2e/spy_$name.summary.txt
  else
    timeout 200 $cmd 2>&1 | grep -v "Warning" | tail -5
  fi
  python3 - /tmp/e2e/stats_$name.csv <<'EOF'
import csv, sys, statistics as st
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["engine_fps"]]
rows = rows[len(rows) // 3:]          # past start-up (model load, graphs, scale phase)
f = lambda k: st.median(float(r[k]) for r in rows if r.get(k))
print(f"steady (last 2/3 of rows): engine_fps {f('engine_fps'):.1f}  read_ms {f('read_ms'):.2f}  "
      f"push_ms {f('push_ms'):.2f}  sinks_ms {f('sinks_ms'):.2f}")
EOF
  el
}
run prefetch0 0 spy
run prefetch3 3 spy
run plain 3
tar -czf "$OUT/e2e_runs.tgz" -C /tmp e2e
find "$JIT" -name '*.so' 2>/dev/null | sort > /tmp/jit_after.txt
if ! cmp -s /tmp/jit_before.txt /tmp/jit_after.txt; then
  XZ_OPT=-T16 tar -cJf /tmp/flashinfer_jit.tar.xz -C "$FLASHINFER_WORKSPACE_BASE" . && \
    split -b 12M -d /tmp/flashinfer_jit.tar.xz "$OUT/flashinfer_jit.tar.xz.part"
fi
el
