"""engine.stats_csv.summarise: per-window level (median) and swing (p10/p90, min/max) of RSS."""
import csv

from engine.stats_csv import COLUMNS, format_windows, summarise, window_stats


def _write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for frames, rss in rows:
            w.writerow([frames / 10, frames, 20, 1, rss, "", 1000, 28000, 50, 0])


def test_window_stats_quantiles():
    s = window_stats([5, None, 1, 4, 2, 3, 10, 6, 7, 8, 9])
    assert s == {"n": 10, "median": 6, "p10": 2, "p90": 9, "min": 1, "max": 10}
    assert window_stats([None]) is None


def test_bimodal_rss_reports_level_and_swing(tmp_path):
    """Two states 40 MB apart: the median follows how many rows fell high, the p10 does not."""
    p = tmp_path / "soak.csv"
    rows = [(f, 640 + (40 if f % 100 < 30 else 0)) for f in range(1500, 2001, 10)]      # 30 % high
    rows += [(f, 640 + (40 if f % 100 < 60 else 0)) for f in range(9500, 10001, 10)]    # 60 % high
    _write(p, rows)
    s = summarise(p, (2000, 10000))
    lo, hi = s["rss_mb_window"][2000], s["rss_mb_window"][10000]
    assert (lo["median"], hi["median"]) == (640, 680)
    assert lo["p10"] == hi["p10"] == lo["min"] == 640 and lo["max"] == hi["max"] == 680
    assert abs(s["rss_mb_median_change"] - 0.0625) < 1e-9 and s["rss_mb_p10_change"] == 0
    assert "frame 2000: RSS median 640 MB (p10 640, p90 680" in format_windows(s)
    assert s["rss_mb_median_2000"] == 640            # the older key stays


def test_recorder_writes_rows_from_its_own_thread(tmp_path):
    """Rows come from the recorder's thread while the caller's thread is busy; a failing sample
    gives a blank row (never a hole); close() writes the final counts once and ends the thread."""
    import threading
    import time

    from engine.stats_csv import StatsRecorder

    state = {"stats": {"results_total": 1}, "fail": False}

    def sample():
        if state["fail"]:
            raise RuntimeError("boom")
        return state["stats"], None

    p = tmp_path / "rows.csv"
    rec = StatsRecorder(p, sample, interval_s=0.05)
    time.sleep(0.6)                               # the caller's thread does not call anything
    state["fail"] = True
    time.sleep(0.2)
    state["fail"] = False
    state["stats"] = {"results_total": 42}        # a new snapshot (replaced whole)
    rec.close()
    rows = list(csv.DictReader(open(p)))
    assert len(rows) >= 6 and rec.errors >= 1
    assert any(r["frames"] == "" for r in rows)   # the failed samples: blank, not missing
    assert rows[-1]["frames"] == "42"
    assert sum(r["frames"] == "42" for r in rows) <= 2
    assert not any(t.name == "stats-csv" for t in threading.enumerate())
    rec.close()                                   # twice is fine
