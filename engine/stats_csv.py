"""`--stats-csv FILE`: one row per second of a run, for soak tests and long-run monitoring.

Columns (blank when a value does not apply, e.g. the viewer's in a headless run):
    t_s                  seconds since the run started
    frames               results produced so far (all stored)
    engine_fps           results per wall second, recent (engine.run_driver)
    viewer_fps           GUI repaints per second (MainWindow.gui_stats)
    rss_mb               resident memory of the process
    gpu_allocated_mb     torch GPU memory allocated by the engine (when on a GPU)
    viewer_points        points the viewer draws
    viewer_buffer_bytes  bytes the viewer holds for them (host mirror; GPU buffers alike)
    loop_gap_p99_ms      GUI event loop: 99th percentile gap of a 10 ms timer
    dropped              live frames the engine could not take
    read_ms, push_ms, sinks_ms
                         the run driver's thread per input frame (recent mean): waiting for the
                         frame, the engine's push, the sinks (store, viewer hand-off) and stats

Every row is flushed, so a killed run keeps its rows. Qt-free: the GUI records through
`StatsRecorder` (a thread of its own, one row per second whatever the GUI thread does); headless
runs through `StatsCsvSink` (the run driver's stats).
"""
from __future__ import annotations

import csv
import os
import threading
import time
from pathlib import Path
from typing import Optional, Union

from .run_driver import Sink

COLUMNS = ("t_s", "frames", "engine_fps", "viewer_fps", "rss_mb", "gpu_allocated_mb", "viewer_points",
           "viewer_buffer_bytes", "loop_gap_p99_ms", "dropped", "read_ms", "push_ms", "sinks_ms")
GUI_KEYS = ("viewer_fps", "viewer_points", "viewer_buffer_bytes", "loop_gap_p99_ms")


def rss_mb() -> Optional[float]:
    """Resident set size of this process in MB (psutil, else /proc)."""
    try:
        import psutil
        return psutil.Process().memory_info().rss / 1e6
    except Exception:
        pass
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        return None


def _fmt(v) -> str:
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


class StatsCsv:
    """Appends rows to FILE (header first); `row(stats, gui)` takes a driver/engine stats dict and
    the GUI's `gui_stats()` dict (or None)."""

    def __init__(self, path: Union[str, Path]):
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "w", newline="", encoding="utf-8")
        self._w = csv.writer(self._f)
        self._w.writerow(COLUMNS)
        self._f.flush()
        self._t0 = time.perf_counter()
        self.rows = 0

    def row(self, stats: Optional[dict], gui: Optional[dict] = None) -> None:
        s, g = stats or {}, gui or {}
        gpu = s.get("gpu_allocated_bytes")
        values = {
            "t_s": round(time.perf_counter() - self._t0, 3),
            "frames": s.get("results_total", s.get("frames")),
            "engine_fps": s.get("engine_fps"),
            "rss_mb": rss_mb(),
            "gpu_allocated_mb": None if gpu is None else gpu / 1e6,
            "dropped": s.get("dropped"),
            **{k: s.get(k) for k in ("read_ms", "push_ms", "sinks_ms")},
            **{k: g.get(k) for k in GUI_KEYS},
        }
        self._w.writerow([_fmt(values[c]) for c in COLUMNS])
        self._f.flush()
        self.rows += 1

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


class StatsRecorder:
    """A row every `interval_s` written from a thread of its own, so the rows keep coming whatever
    the caller's threads do (a GUI thread busy painting for seconds must not leave holes in the
    record of a long run). `sample()` returns `(stats, gui)` as `StatsCsv.row` takes them and is
    called on the recorder's thread: it must only read snapshots (never wait on another thread).
    Rows are scheduled on a fixed clock (t0 + k * interval); a row that could not be written in
    time is not made up later, so `t_s` always says when a row was taken."""

    def __init__(self, path: Union[str, Path], sample, interval_s: float = 1.0):
        self.csv = StatsCsv(path)
        self.sample = sample
        self.interval_s = float(interval_s)
        self.errors = 0
        self._last_stats = None          # the stats object of the newest row
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._work, name="stats-csv", daemon=True)
        self._t.start()

    @property
    def rows(self) -> int:
        return self.csv.rows

    def row_now(self) -> None:
        """Write a row at once (e.g. the final counts when a run ends); any thread."""
        try:
            stats, gui = self.sample()
        except Exception:              # a sample that fails leaves a row of blanks, never a hole
            self.errors += 1
            stats, gui = None, None
        with self._lock:
            if not self.csv._f.closed:
                self.csv.row(stats, gui)
                self._last_stats = stats

    def _work(self) -> None:
        t0 = time.monotonic()
        k = 1
        while not self._stop.wait(max(0.0, t0 + k * self.interval_s - time.monotonic())):
            self.row_now()
            k = max(k + 1, int((time.monotonic() - t0) / self.interval_s) + 1)

    def close(self) -> None:
        """Stop the thread (after its current row), write a last row if the stats changed since
        the newest one (a run ended by a signal has no other record of its final counts; `sample`
        must return a new stats object when they change), and close the file."""
        self._stop.set()
        if self._t.is_alive() and self._t is not threading.current_thread():
            self._t.join()
        try:
            changed = self.sample()[0] is not self._last_stats
        except Exception:
            changed = False
        if changed:
            self.row_now()
        with self._lock:
            self.csv.close()


class StatsCsvSink(Sink):
    """Headless runs: a row per `interval_s` from the driver's stats (and a last one at the end)."""

    def __init__(self, path: Union[str, Path], interval_s: float = 1.0):
        self.csv = StatsCsv(path)
        self.interval_s = float(interval_s)
        self._next = 0.0
        self._last: dict = {}

    def on_stats(self, stats: dict) -> None:
        self._last = stats
        now = time.perf_counter()
        if now >= self._next:
            self._next = now + self.interval_s
            self.csv.row(stats)

    def on_finish(self, summary) -> None:
        if self._last:
            self.csv.row(self._last)
        self.csv.close()


def window_stats(values) -> Optional[dict]:
    """Level and swing of the samples of one window: median (the upper one for an even count, as
    quoted since the first soaks), p10 / p90 (nearest rank: sampled values) and min / max; None
    for no samples."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None

    def q(p):                         # nearest-rank percentile: a value that was sampled
        return v[min(len(v) - 1, max(0, int(round(p * (len(v) - 1)))))]
    return {"n": len(v), "median": v[len(v) // 2], "p10": q(0.1), "p90": q(0.9), "min": v[0], "max": v[-1]}


def summarise(path: Union[str, Path], at: tuple = (2000, 10000), window: int = 500) -> dict:
    """Figures of a soak run from its CSV: rows, the last row, and for each frame count in `at`
    the first row at or past it (RSS, viewer buffer bytes, ...), plus the relative change of RSS
    and buffer bytes between the first and the last of those rows.

    RSS is sampled once a second and swings between a low and a high state within seconds (a
    thinning pass, an upload or a store batch in flight), so single rows are noisy. For each
    count N in `at`, `rss_mb_window[N]` describes the rows whose frame count lies in
    [N - window, N]: median (the level quoted), p10 / p90 and min / max (the swing). The changes
    between the first and last count are given for the median (`rss_mb_median_change`) and for
    the p10 (`rss_mb_p10_change`: the low state, i.e. what stays held, without the swing)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))

    def num(r, k):
        try:
            return float(r[k])
        except (KeyError, TypeError, ValueError):
            return None

    out = {"rows": len(rows), "last": rows[-1] if rows else None, "at": {}}
    for n in at:
        r = next((r for r in rows if (num(r, "frames") or 0) >= n), None)
        if r is not None:
            out["at"][n] = r
    if len(out["at"]) >= 2:
        a, b = out["at"][min(out["at"])], out["at"][max(out["at"])]
        for k in ("rss_mb", "viewer_buffer_bytes", "viewer_points"):
            va, vb = num(a, k), num(b, k)
            out[f"{k}_change"] = (vb - va) / va if va and vb is not None else None
    out["rss_mb_window"] = {}
    for n in at:
        w = window_stats(num(r, "rss_mb") for r in rows if n - window <= (num(r, "frames") or 0) <= n)
        out["rss_mb_window"][n] = w
        out[f"rss_mb_median_{n}"] = w["median"] if w else None
    lo, hi = out["rss_mb_window"].get(min(at)) if at else None, out["rss_mb_window"].get(max(at)) if at else None
    if len(at) >= 2 and lo and hi:
        out["rss_mb_median_change"] = hi["median"] / lo["median"] - 1
        out["rss_mb_p10_change"] = hi["p10"] / lo["p10"] - 1
    gaps = [num(r, "loop_gap_p99_ms") for r in rows]
    gaps = [g for g in gaps if g is not None]
    fps = [num(r, "engine_fps") for r in rows]
    fps = [v for v in fps if v]
    out["engine_fps_median"] = sorted(fps)[len(fps) // 2] if fps else None
    out["loop_gap_p99_ms_median"] = sorted(gaps)[len(gaps) // 2] if gaps else None
    rss = [num(r, "rss_mb") for r in rows if num(r, "rss_mb") is not None]
    out["rss_mb_max"] = max(rss) if rss else None
    return out


def format_windows(s: dict) -> str:
    """One line per count: `N: median M MB (p10 A, p90 B, min C, max D; n rows)`."""
    lines = []
    for n, w in s.get("rss_mb_window", {}).items():
        lines.append(f"frame {n}: " + ("no rows" if not w else
                     f"RSS median {w['median']:.0f} MB (p10 {w['p10']:.0f}, p90 {w['p90']:.0f}, "
                     f"min {w['min']:.0f}, max {w['max']:.0f}; {w['n']} rows)"))
    for k in ("rss_mb_median_change", "rss_mb_p10_change"):
        if s.get(k) is not None:
            lines.append(f"{k}: {100 * s[k]:+.1f} %")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse
    import json
    ap = argparse.ArgumentParser(description="summarise a --stats-csv file (soak figures)")
    ap.add_argument("csv")
    ap.add_argument("--at", type=int, nargs="*", default=[2000, 10000], help="frame counts to compare")
    ap.add_argument("--window", type=int, default=500, help="frames before each count whose rows are summarised")
    a = ap.parse_args()
    s = summarise(a.csv, tuple(a.at), a.window)
    print(json.dumps(s, indent=1))
    print(format_windows(s))
