"""The monitors' stats tick repaints one plot at a time (ui.monitors.REFRESH_STAGGER_MS apart),
so no single paint of the panel redraws every plot's axes; all plots still show the samples."""
import time

from ui import monitors
from ui.monitors import MonitorsPanel


def test_stats_tick_refreshes_the_plots_one_at_a_time(qtbot, monkeypatch):
    m = MonitorsPanel()
    qtbot.addWidget(m)
    m.resize(900, 200)
    m.show()
    qtbot.waitExposed(m)
    m._timer.setInterval(10)                       # the tick at once (the stagger is the real one)
    calls = []
    plot = m.refresh_plot
    monkeypatch.setattr(m, "refresh_plot", lambda i: (calls.append((i, time.perf_counter())), plot(i))[1])
    for t in range(4):
        m.update_stats({"fps": 10.0 + t, "latency_ms": 50.0, "latency_p95_ms": 60.0})
        m.update_viewer_fps(5.0)
    qtbot.waitUntil(lambda: len(calls) >= 3, timeout=5000)
    assert [i for i, _ in calls[:3]] == [0, 1, 2]
    gaps = [b - a for (_, a), (_, b) in zip(calls[:3], calls[1:3])]
    assert min(gaps) >= 0.8 * monitors.REFRESH_STAGGER_MS / 1000
    # every plot shows every sample of its curves
    curves = [m.engine_fps.curve, m.viewer_fps.curve, m.latency.curve] + ([m.ram.curve] if m._proc else [])
    for curve in curves:
        x, _ = curve.getData()
        assert x is not None and len(x) == 4
