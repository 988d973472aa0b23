"""Summarise a long GUI soak (figures, not a test) against issue #29's soak targets: no
event-loop gap over 1 s, the engine never stalls on the GUI, RSS flat within 5 % from minute 10
to the end. Reads the app's `--stats-csv` file and, when given, the output of
`benchmarks.gui_stall_probe` (its stall list: the longest gaps, measured by a 20 ms heartbeat)
and a load-average log (lines of `date +%s` then /proc/loadavg, or `uptime` lines).

    python -m benchmarks.soak_report STATS.csv [--probe PROBE.log] [--load LOAD.log] [--from-min 10]

Prints: rows per second; the per-second event-loop p99 gap (max, seconds over 1 s); the viewer's
redraws per second; engine frames per minute (min / median, minutes with no progress); RSS at
minute 10, at the end and its range in between (% of the minute-10 value); from the probe, the
longest stalls; from the load log, the load average's range.
"""
from __future__ import annotations

import argparse
import csv
import re

import numpy as np


def _col(rows, name):
    out = []
    for r in rows:
        v = r.get(name, "")
        out.append(float(v) if v not in ("", None) else np.nan)
    return np.asarray(out, float)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="summary of a GUI soak's stats CSV (issue #29 targets)")
    ap.add_argument("csv")
    ap.add_argument("--probe", help="stdout of benchmarks.gui_stall_probe for the same run")
    ap.add_argument("--load", help="load-average log written during the run")
    ap.add_argument("--from-min", type=float, default=10.0, help="RSS flatness from this minute to the end")
    a = ap.parse_args(argv)
    rows = list(csv.DictReader(open(a.csv, newline="", encoding="utf-8")))
    if not rows:
        print("no rows")
        return 1
    t, frames = _col(rows, "t_s"), _col(rows, "frames")
    gap, rss, vfps = _col(rows, "loop_gap_p99_ms"), _col(rows, "rss_mb"), _col(rows, "viewer_fps")
    span = t[-1] - t[0]
    print(f"rows: {len(rows)} for {span:.0f} s ({len(rows) / max(span, 1e-9):.3f} rows/s); "
          f"largest interval between rows {np.diff(t).max() if len(t) > 1 else 0:.1f} s")
    g = gap[~np.isnan(gap)]
    if len(g):
        print(f"event-loop p99 gap per second: median {np.median(g):.0f} ms, max {g.max():.0f} ms, "
              f"seconds with p99 > 1 s: {int((g > 1000).sum())}, > 200 ms: {int((g > 200).sum())} of {len(g)}")
    v = vfps[~np.isnan(vfps)]
    if len(v):
        print(f"viewer redraws/s: mean {v.mean():.2f}, rows without a redraw {int((v == 0).sum())} of {len(v)}")
    ok = ~np.isnan(frames)
    if ok.sum() > 1:
        minute = (t[ok] // 60).astype(int)
        f = frames[ok]
        per_min = []
        for m in range(minute.min(), minute.max()):
            sel = f[minute == m]
            nxt = f[minute == m + 1]
            if len(sel) and len(nxt):
                per_min.append(nxt[0] - sel[0])
        pm = np.asarray(per_min)
        if len(pm):
            print(f"engine frames per minute: min {pm.min():.0f}, median {np.median(pm):.0f}, max {pm.max():.0f}; "
                  f"minutes with no progress {int((pm <= 0).sum())} of {len(pm)}; frames at the end {f[-1]:.0f}")
        # the longest stretch without a new engine frame (a stall of the engine, e.g. on the GUI)
        tf = t[ok]
        adv = np.flatnonzero(np.diff(f) > 0) + 1           # rows where the frame count went up
        marks = np.concatenate([[tf[0]], tf[adv], [tf[-1]]])
        print(f"longest stretch without a new engine frame: {np.diff(marks).max():.1f} s; "
              f"stretches over 5 s: {int((np.diff(marks) > 5).sum())}")
    r = ~np.isnan(rss)
    if r.any():
        tr, rr = t[r], rss[r]
        after = tr >= 60 * a.from_min
        if after.any():
            r10, rend = rr[after][0], rr[-1]
            lo, hi = rr[after].min(), rr[after].max()
            print(f"RSS: {r10:.0f} MB at minute {a.from_min:g}, {rend:.0f} MB at the end "
                  f"({100 * (rend - r10) / r10:+.1f} %); range after minute {a.from_min:g}: {lo:.0f}-{hi:.0f} MB "
                  f"({100 * (lo - r10) / r10:+.1f} % .. {100 * (hi - r10) / r10:+.1f} %)")
        else:
            print(f"RSS: the run ended before minute {a.from_min:g}; last {rr[-1]:.0f} MB")
    pts = _col(rows, "viewer_points")
    if (~np.isnan(pts)).any():
        p = pts[~np.isnan(pts)]
        print(f"viewer points: {p[0]:.0f} at the start, max {p.max():.0f}, end {p[-1]:.0f}")
    if a.probe:
        text = open(a.probe, encoding="utf-8", errors="replace").read()
        m = re.search(r"== GUI stalls over ([\d.]+) s in (\d+) s: (\d+), total ([\d.]+) s, longest ([\d.]+) s", text)
        if m:
            print(f"stall probe: {m.group(3)} stalls over {m.group(1)} s in {m.group(2)} s, {m.group(4)} s in all, "
                  f"longest {m.group(5)} s")
            lens = [float(x) for x in re.findall(r"^\s+at\s+-?[\d.]+ s:\s+([\d.]+) s", text, re.M)]
            print(f"  of the longest listed: {sum(x > 1.0 for x in lens)} over 1 s")
        else:
            print("stall probe: no summary line (the run did not reach its end?)")
    if a.load:
        loads = []
        for line in open(a.load, encoding="utf-8", errors="replace"):
            m = re.search(r"load average:\s*([\d.]+)", line) or re.search(r"^\S+\s+([\d.]+)\s+[\d.]+\s+[\d.]+", line)
            if m:
                loads.append(float(m.group(1)))
        if loads:
            la = np.asarray(loads)
            print(f"load average (1 min) during the run: min {la.min():.1f}, median {np.median(la):.1f}, "
                  f"max {la.max():.1f} ({len(la)} samples)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
