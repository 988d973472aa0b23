"""The settings panel is generated from the setting() metadata: every field has a row, the
rows show the knobs an engine honours, and every knob set in the panel persists (INI file)."""
import dataclasses

from app.settings import AppSettings
from engine.api import SessionConfig, engine_capabilities, setting_fields
from ui.settings_panel import SettingsPanel


def _nondefault(panel, f, meta):
    from PySide6 import QtWidgets
    w = panel.controls[f.name]
    if isinstance(w, QtWidgets.QComboBox):
        items = [w.itemText(i) for i in range(w.count())]
        other = [c for c in items if c != str(f.default)]
        return type(f.default)(other[0]) if other else f.default
    if isinstance(w, QtWidgets.QCheckBox):
        return not f.default
    if isinstance(w, (QtWidgets.QSpinBox, QtWidgets.QDoubleSpinBox)):
        v = f.default + w.singleStep()
        return type(f.default)(v if v <= w.maximum() else f.default - w.singleStep())
    if f.name == "intrinsics":
        return (500.0, 500.0, 320.0, 240.0, 640.0, 480.0)
    return "/tmp/some_file.txt"


def test_every_setting_has_a_row(qtbot):
    p = SettingsPanel()
    qtbot.addWidget(p)
    names = {f.name for f, m in setting_fields() if m.get("panel", True)} - {"engine"}
    assert names <= set(p._rows)
    for f, meta in setting_fields():
        if f.name in p._rows and f.name != "checkpoint":
            assert p.controls[f.name].toolTip(), f.name


def test_panel_shows_and_persists_every_knob(qtbot, tmp_path):
    ini = tmp_path / "s.ini"
    for engine in ("lingbot-map", "geometric"):
        p = SettingsPanel()
        qtbot.addWidget(p)
        p.set_config(SessionConfig(engine=engine))
        fields = engine_capabilities(engine)["fields"]
        for name in fields:
            assert not p._rows[name].isHidden(), (engine, name)
        changes = {f.name: _nondefault(p, f, m) for f, m in setting_fields()
                   if f.name in fields and f.name in p.controls}
        if engine == "lingbot-map":
            assert {"kv_dtype", "weight_dtype", "cuda_graphs", "model", "kv_keep_ratio"} <= set(changes)
            assert changes["cuda_graphs"] is False
        else:
            assert {"depth", "depth_width", "max_features", "depth_max_lag"} <= set(changes)
        want = dataclasses.replace(SessionConfig(engine=engine), **changes)
        p.set_config(want)
        got = p.config()
        for name, v in changes.items():
            assert getattr(got, name) == v, (engine, name)
        s = AppSettings(str(ini))
        s.save_config(got)
        s.sync()
        back = AppSettings(str(ini)).load_config()
        assert back == got
        p2 = SettingsPanel()
        qtbot.addWidget(p2)
        p2.set_config(back)
        assert p2.config() == got
