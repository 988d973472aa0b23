"""Every value read from the settings file is checked against its declared type and range: a bad
one takes its default with one banner warning (and a log line) naming the key; the app never fails
to start and never runs with a silently out-of-range value (issue #24)."""
import json
import logging
import math
import subprocess
import sys

import pytest

from app.settings import AppSettings, retention_limits
from engine.api import SessionConfig
from tests.conftest import REPO
from ui import settings_schema
from ui.settings_schema import KEYS, check, check_session, default


def _window(qtbot, path):
    from ui.main_window import MainWindow
    w = MainWindow(settings=AppSettings(str(path)) if path is not None else None)
    qtbot.addWidget(w)
    return w


def _warnings(w, key):
    return [t for level, t in w.messages if level == "warning" and key in t]


@pytest.mark.parametrize("key, bad, read", [
    ("display/point_size", "abc", lambda w: w.point_size.value()),
    ("display/stride", "x", lambda w: w.stride.value()),
    ("display/point_size", [1, 2], lambda w: w.point_size.value()),
    ("display/point_budget", float("nan"), lambda w: int(round(w.point_budget.value() * 1e6))),
    ("display/point_budget", 1e12, lambda w: int(round(w.point_budget.value() * 1e6))),
    ("run/loop", "maybe", lambda w: w.loop.isChecked()),
    ("display/color_mode", "purple", lambda w: settings_schema.COLOR_MODES[w.color_mode.currentIndex()]),
    ("run/speed", -2, lambda w: w.speed.currentData()),
    ("sessions/max_age_days", -3, lambda w: w.retention_limits()[1]),
])
def test_bad_value_falls_back_to_its_default_with_one_warning(qtbot, tmp_path, caplog, key, bad, read):
    s = AppSettings(str(tmp_path / "s.ini"))
    s.set(key, bad)
    s.sync()
    with caplog.at_level(logging.WARNING):
        w = _window(qtbot, tmp_path / "s.ini")
    assert read(w) == default(key)
    assert len(_warnings(w, key)) == 1, list(w.messages)
    assert w.banner.isVisibleTo(w) and key in w.banner.label.text()
    assert sum(key in r.getMessage() for r in caplog.records) == 1


def test_hand_edited_ini_values_are_checked(qtbot, tmp_path):
    """Values typed into the INI file by hand (not JSON): `loop=maybe` is not a bool."""
    (tmp_path / "s.ini").write_text('[run]\nloop=maybe\n[display]\npoint_size="abc"\nstride=3\nfollow=false\n')
    w = _window(qtbot, tmp_path / "s.ini")
    assert w.loop.isChecked() is False and w.point_size.value() == default("display/point_size")
    assert w.stride.value() == 3 and w.follow.isChecked() is False       # good values are used
    text = w.banner.label.text()
    assert "run/loop" in text and "display/point_size" in text and "display/stride" not in text


def test_good_values_are_used_without_warning(qtbot, tmp_path):
    s = AppSettings(str(tmp_path / "s.ini"))
    for k, v in (("display/point_size", 5.5), ("display/stride", 4), ("run/loop", True),
                 ("display/point_budget", 2_000_000), ("display/color_mode", "depth"), ("run/speed", 3.0)):
        s.set(k, v)
    s.sync()
    w = _window(qtbot, tmp_path / "s.ini")
    assert (w.point_size.value(), w.stride.value(), w.loop.isChecked()) == (5.5, 4, True)
    assert w.point_budget.value() == 2.0 and w.color_mode.currentIndex() == 1
    assert w.speed.currentData() == 3.0                   # a speed not in the list is added
    assert not [m for m in w.messages if m[0] == "warning"] and not w.banner.isVisibleTo(w)


def test_retention_limits_reject_negative_and_nan(tmp_path):
    s = AppSettings(str(tmp_path / "s.ini"))
    s.set("sessions/max_age_days", -3)
    s.set("sessions/max_gb", float("nan"))
    assert retention_limits(s) == (default("sessions/max_gb"), default("sessions/max_age_days"))
    assert default("sessions/max_age_days") > 0             # -3 no longer means "no limit"
    problems = s.take_problems()
    assert len(problems) == 2 and any("sessions/max_age_days" in p for p in problems)
    retention_limits(s)
    assert s.take_problems() == []                          # one warning per key
    s.set("sessions/max_age_days", 0)                       # 0 is the documented "no limit"
    s2 = AppSettings(str(tmp_path / "s.ini"))
    assert retention_limits(s2)[1] == 0


def test_session_values_are_checked_with_their_setting_metadata(qtbot, tmp_path):
    s = AppSettings(str(tmp_path / "s.ini"))
    s.set("engine/config", {"engine": "geometric", "window": "abc", "fov_deg": float("nan"),
                            "max_side": 10, "mode": "sideways", "max_features": 800, "future_knob": 1})
    s.sync()
    w = _window(qtbot, tmp_path / "s.ini")
    cfg = w.settings_panel.config()
    base = SessionConfig()
    assert (cfg.window, cfg.mode, cfg.max_side) == (base.window, base.mode, base.max_side)
    assert math.isfinite(cfg.fov_deg) and cfg.fov_deg == base.fov_deg
    assert cfg.max_features == 800                          # the good field is kept
    text = w.banner.label.text()
    for k in ("engine/config/window", "engine/config/fov_deg", "engine/config/max_side", "engine/config/mode"):
        assert k in text
    assert "max_features" not in text


def test_schema_declares_what_the_window_uses(qtbot):
    from ui.viewer import COLOR_MODES
    assert settings_schema.COLOR_MODES == COLOR_MODES
    for k in KEYS.values():                                 # every default passes its own check
        assert check(k.name, k.default) == (k.default, None)
    assert check_session(None, SessionConfig())[1] == []
    w = _window(qtbot, None)
    assert (w.point_size.minimum(), w.point_size.maximum()) == KEYS["display/point_size"].range
    from ui.sessions_dialog import SessionsDialog
    d = SessionsDialog(w)                                   # what the dialog can write is valid
    assert (d.max_gb.minimum(), d.max_gb.maximum()) == KEYS["sessions/max_gb"].range
    assert (d.max_days.minimum(), d.max_days.maximum()) == KEYS["sessions/max_age_days"].range
    d.deleteLater()


def test_bad_settings_file_does_not_stop_the_app(tmp_path):
    """The repro: `point_size="abc"` made every launch exit 1."""
    s = AppSettings(str(tmp_path / "s.ini"))
    s.set("display/point_size", "abc")
    s.set("display/stride", [1, 2])
    s.sync()
    out = subprocess.run([sys.executable, "-m", "app", "gui", "--settings", str(tmp_path / "s.ini"),
                          "--exit-when-done"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "display/point_size" in out.stderr and "Traceback" not in out.stderr
    fixed = AppSettings(str(tmp_path / "s.ini"))            # rewritten at exit with good values
    assert fixed.value("display/point_size") == default("display/point_size")
    assert json.loads(json.dumps(fixed.take_problems())) == []
