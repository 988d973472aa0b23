"""benchmarks/gui_path_bench.py runs here (in tests/ui: it converts results with ui.display, as the GUI) (CPU, the test-sized model): both paths deliver every
frame, the GUI path's scene receives the points and the latency is measured. Its figures are a
benchmark's (docs/benchmarks.md), never asserted."""
from __future__ import annotations

import json
import math


def test_gui_path_bench_runs_both_paths_on_cpu(tmp_path):
    from benchmarks.gui_path_bench import main
    out = tmp_path / "gui.json"
    res = main(["--device", "cpu", "--model", "lingbot-map-tiny", "--width", "70", "--input-size", "96", "72",
                "--frames", "12", "--warmup", "1", "--repeats", "1", "--point-budget", "20000",
                "--json", str(out)])
    rows = {r["path"]: r for r in res["rows"]}
    assert set(rows) == {"run", "gui"}
    assert rows["run"]["results"] == rows["gui"]["results"] == 12       # no frame lost on either path
    gui = rows["gui"]
    assert 0 < gui["scene_points"] <= 20000                            # the viewer's budget holds
    assert gui["read_to_shown_ms_p95"] >= gui["read_to_shown_ms_p50"] > 0
    assert gui["gui_updates_per_s"] > 0
    assert math.isfinite(res["gui_over_run"]) and res["gui_over_run"] > 0
    assert json.loads(out.read_text())["fps_steady_median"]["gui"] == res["fps_steady_median"]["gui"]


def test_gui_path_bench_stops_once_two_pairs_agree(tmp_path):
    """--agree: pairs (run, gui) repeat until two consecutive gui/run ratios agree within the
    fraction; with a fraction no two finite ratios miss (1000x), it stops after the second pair."""
    from benchmarks.gui_path_bench import main
    res = main(["--device", "cpu", "--model", "lingbot-map-tiny", "--width", "70", "--input-size", "96", "72",
                "--frames", "12", "--warmup", "1", "--repeats", "4", "--agree", "1000", "--point-budget", "20000"])
    assert [r["path"] for r in res["rows"]] == ["run", "gui", "run", "gui"]
    assert res["settled_pairs"] == [0, 1] and len(res["pair_ratios"]) == 2
    assert all(math.isfinite(x) and x > 0 for x in res["pair_ratios"])
