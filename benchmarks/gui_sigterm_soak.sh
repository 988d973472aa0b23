#!/usr/bin/env bash
# A GUI soak ended by a signal (issue #24): `reconstudio gui` loops the sample clip for MINUTES
# (real-time pacing, --stats-csv), then gets SIGTERM (or SIGINT) and must exit 143 (130) with the
# session closed and marked interrupted, its running.lock gone and the settings file written.
# Also reports the stats CSV's rows against the seconds run (one row a second, from its own thread).
#
# Usage (repo root; X: $DISPLAY if set, else an Xvfb of its own):
#   bash benchmarks/gui_sigterm_soak.sh [MINUTES=20] [TERM|INT] [ENGINE=geometric]
# Env: PYTHON (default .venv/bin/python, else python3), KEEP=1 keeps the work folder.
# Prints one summary line per check and "PASS" / "FAIL"; exit status 0 only when every check passes.
set -uo pipefail
MINUTES=${1:-20}; SIG=${2:-TERM}; ENGINE=${3:-geometric}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
CLIP=resources/sample/icl_livingroom_kt3.mp4
W=$(mktemp -d /tmp/gui_sigterm_soak.XXXXXX)
case $SIG in TERM) WANT=143 ;; INT) WANT=130 ;; *) echo "signal must be TERM or INT"; exit 2 ;; esac

XVFB_PID=
if [ -z "${DISPLAY:-}" ]; then
  for n in $(seq 90 140); do [ -e /tmp/.X11-unix/X$n ] || [ -e /tmp/.X$n-lock ] || { D=:$n; break; }; done
  Xvfb "$D" -screen 0 1600x1000x24 -nolisten tcp >"$W/xvfb.log" 2>&1 &
  XVFB_PID=$!
  export DISPLAY=$D
  sleep 2
fi
export QT_QPA_PLATFORM=xcb

echo "soak: $MINUTES min, engine $ENGINE, then SIG$SIG; work folder $W; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
T0=$(date +%s)
"$PY" -m app gui --input "$CLIP" --loop --speed 1 --engine "$ENGINE" --autostart \
  --settings "$W/settings.ini" --session-dir "$W/sessions" --stats-csv "$W/stats.csv" >"$W/gui.log" 2>&1 &
PID=$!
sleep "$(awk "BEGIN { print $MINUTES * 60 }")"
T_KILL=$(date +%s)
kill -s "$SIG" "$PID"
wait "$PID"; RC=$?
T_END=$(date +%s)
[ -n "$XVFB_PID" ] && kill "$XVFB_PID" 2>/dev/null

"$PY" - "$W" "$RC" "$WANT" "$T0" "$T_KILL" "$T_END" "$SIG" <<'EOF'
import csv, json, os, sys
from pathlib import Path
w, rc, want, t0, t_kill, t_end, sig = Path(sys.argv[1]), *map(int, sys.argv[2:7]), sys.argv[7]
name = {"TERM": "SIGTERM", "INT": "Ctrl-C"}[sig]
ok = True
def check(cond, text):
    global ok
    ok &= bool(cond)
    print(f"{'ok  ' if cond else 'FAIL'} {text}")
check(rc == want, f"exit status {rc} (want {want}); shutdown took {t_end - t_kill} s")
folders = [p for p in (w / "sessions").iterdir() if p.is_dir()] if (w / "sessions").is_dir() else []
check(len(folders) == 1, f"{len(folders)} session folder(s)")
if folders:
    f = folders[0]
    info = json.loads((f / "config.json").read_text())
    stored = len(list((f / "frames").glob("*.npz")))
    check(info.get("finished"), f"session closed: finished = {info.get('finished')}")
    check(str(info.get("cut_short", "")).startswith(f"interrupted ({name})"), f"marked: {info.get('cut_short')!r}")
    check(info.get("frames") == stored and stored > 0, f"frames recorded {info.get('frames')}, stored {stored}")
    check(not (f / "running.lock").exists(), "no running.lock left")
    tmp = list(f.rglob("*.tmp"))
    check(not tmp, f"{len(tmp)} temporary file(s) left")
s = w / "settings.ini"
check(s.exists() and s.stat().st_mtime >= t_kill - 1, "settings file written at exit")
log = (w / "gui.log").read_text(errors="replace")
check("Traceback" not in log and "KeyboardInterrupt" not in log, "no traceback in the log")
rows = list(csv.DictReader(open(w / "stats.csv"))) if (w / "stats.csv").exists() else []
secs = t_kill - t0
print(f"     stats CSV: {len(rows)} rows for {secs} s run; last frames {rows[-1]['frames'] if rows else '-'}, "
      f"RSS {rows[-1]['rss_mb'] if rows else '-'} MB")
check(len(rows) >= 0.9 * (secs - 15), "stats rows ~1 per second (start-up excepted)")
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
EOF
STATUS=$?
[ "${KEEP:-0}" = 1 ] || [ $STATUS -ne 0 ] || rm -rf "$W"
exit $STATUS
