"""Settings panel follows the engine's capabilities; settings persist between runs; the hub
download reports offline mode as a message; the monitors show the KV page map."""
import numpy as np

from app.settings import AppSettings
from engine.api import SessionConfig
from ui.monitors import PAGE_COLOURS
from ui.settings_panel import SettingsPanel


def _visible(panel, field):
    return not panel._rows[field].isHidden()


def test_controls_follow_capabilities(qtbot):
    p = SettingsPanel()
    qtbot.addWidget(p)
    p.set_config(SessionConfig(engine="ui-test", mode="windowed", window=32))
    assert [p.controls["mode"].itemText(i) for i in range(p.controls["mode"].count())] == ["streaming", "windowed"]
    assert _visible(p, "window") and _visible(p, "mode") and not _visible(p, "checkpoint")
    assert not _visible(p, "dtype") and not _visible(p, "intrinsics")
    assert p.controls["window"].toolTip() == "test tooltip for window"
    cfg = p.config()
    assert cfg.engine == "ui-test" and cfg.mode == "windowed" and cfg.window == 32

    p.set_config(SessionConfig(engine="geometric"))
    assert _visible(p, "intrinsics") and _visible(p, "max_side") and not _visible(p, "window")
    assert "arbitrary scale" in p.engine_note.text()
    p.intrinsics.setText("480 480 319.5 239.5 640 480")
    assert p.config().intrinsics == (480.0, 480.0, 319.5, 239.5, 640.0, 480.0)

    p.set_config(SessionConfig(engine="lingbot-map", dtype="bf16"))
    from engine import engine_capabilities
    caps = engine_capabilities("lingbot-map")
    assert _visible(p, "checkpoint") and p.download_button.isEnabled()
    combo = p.controls["dtype"]
    assert [combo.itemText(i) for i in range(combo.count())] == caps["dtypes"]
    assert p.config().dtype == "bf16"


def test_download_offline_shows_message(qtbot, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    p = SettingsPanel()
    qtbot.addWidget(p)
    p.set_config(SessionConfig(engine="lingbot-map"))
    with qtbot.waitSignal(p.message, timeout=60_000) as got:
        p.download("lingbot-map")
    assert "offline" in got.args[0].lower()
    assert p.download_button.isEnabled() and p.download_progress.isHidden()


def test_settings_persist_between_windows(qtbot, make_window, tmp_path):
    w = make_window(engine="ui-test", window=40)
    w.set_input(str(tmp_path))
    w.point_size.setValue(4.5)
    w.color_mode.setCurrentIndex(2)
    w.loop.setChecked(True)
    w.close()
    from ui.main_window import MainWindow
    w2 = MainWindow(settings=AppSettings())
    qtbot.addWidget(w2)
    cfg = w2.settings_panel.config()
    assert cfg.engine == "ui-test" and cfg.window == 40
    assert w2.source_panel.spec() == str(tmp_path)
    assert w2.point_size.value() == 4.5 and w2.color_mode.currentIndex() == 2 and w2.loop.isChecked()


def test_kv_page_map_colours(qtbot):
    from ui.monitors import MonitorsPanel
    m = MonitorsPanel()
    qtbot.addWidget(m)
    m.update_stats({"fps": 10.0, "latency_ms": 5.0, "kv_page_map": np.array([0, 1, 2, 3, 4, 2], np.int8)})
    m.refresh()
    assert list(m.page_map_shown) == [0, 1, 2, 3, 4, 2]
    img = m.kv_image.image                     # (columns, rows, rgba)
    assert np.array_equal(img[1, 0], PAGE_COLOURS[1]) and np.array_equal(img[3, 0], PAGE_COLOURS[3])
    assert "window 2" in m.kv_title.text()
    m.update_stats({"fps": 10.0})              # an engine without KV cache keeps the last map
    m.refresh()
    x, y = m.engine_fps.curve.getData()
    assert list(y) == [10.0, 10.0]
    assert list(m.page_map_shown) == [0, 1, 2, 3, 4, 2]
