"""benchmarks/side_by_side.py's honesty rules, on the CPU with made-up runs: two upstream runs
agree only within the tolerance in both p50 and steady FPS; the report quotes the settled pair
(not the best of several), says when upstream did not settle, and gives ours deferred and sync."""
from __future__ import annotations

import json

from benchmarks.side_by_side import agree, cmd_report, speed_summary


def _row(label, fps, p50, interval=1, variant="compiled"):
    return {"label": label, "steady_fps": fps, "full_window_fps": fps, "overall_fps": fps, "latency_p50_ms": p50,
            "peak_allocated_gib": 12.0, "interval": interval, "variant": variant, "latency_trace_ms": [p50]}


def test_agreement_needs_both_figures_within_tolerance():
    a = _row("a", 23.6, 42.4)
    assert agree(a, _row("b", 23.0, 43.0), 0.03)
    assert not agree(a, _row("c", 20.1, 42.4), 0.03)          # FPS 15 % off
    assert not agree(a, _row("d", 23.6, 58.6), 0.03)          # p50 not flat


def test_agreement_of_numpy_figures_is_a_json_bool():
    """The runs' figures are numpy floats; the flag is written to the upstream JSON after each run."""
    import numpy as np
    a, b = _row("a", np.float64(23.6), np.float64(42.4)), _row("b", np.float64(23.0), np.float64(43.0))
    flag = agree(a, b, 0.03)
    assert flag is True and json.loads(json.dumps({"agrees_with_previous": flag}))["agrees_with_previous"] is True


def test_speed_summary_keeps_a_latency_trace():
    times = [0.04] * 100 + [0.07] * 100
    r = speed_summary(times, 8, 0, sum(times), "x")
    assert r["latency_trace_ms"] == [40.0, 40.0, 70.0, 70.0]


def _report(tmp_path, capsys, upstream_rows, settled):
    ours = {"impl": "reconstudio", "machine": {}, "settings": {}, "fid_frames": 8,
            "speed": [_row("ours default kf1", 32.0, 30.0, variant="default"), _row("ours sync kf1", 29.5, 33.0, variant="sync"),
                      _row("ours default kf2", 32.0, 30.0, 2, "default")]}
    up = {"impl": "upstream", "machine": {}, "settings": {}, "fid_frames": 8, "speed": upstream_rows, "settled": settled}
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(ours))
    pb.write_text(json.dumps(up))

    class A:
        ours, upstream, npz_ours, npz_upstream = str(pa), str(pb), None, None
    cmd_report(A)
    return capsys.readouterr().out


def test_report_uses_the_settled_pair_and_both_ways(tmp_path, capsys):
    rows = [_row("up #1", 30.0, 33.0), _row("up #2", 23.6, 42.4), _row("up #3", 23.5, 42.6), _row("up kf2", 20.0, 45.0, 2)]
    out = _report(tmp_path, capsys, rows, {"runs": ["up #2", "up #3"], "tolerance": 0.03})
    assert "agree within 3%" in out
    assert "deferred: the product's way on CUDA" in out and "ratio ours (sync)" in out
    assert f"{32.0 / 23.5:.2f}x" in out and f"{29.5 / 23.5:.2f}x" in out     # not the fast outlier #1
    out = _report(tmp_path, capsys, rows[:2], None)
    assert "did NOT settle" in out
