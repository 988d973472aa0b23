"""Display defaults have one home (ui/settings_schema.py): the window's widgets, the viewer's
state, the worker's RunOptions and the CLI's export defaults (resources/default_settings.json)
all read it."""
import json

from app.settings import DEFAULTS_FILE, export_defaults
from ui.settings_schema import COLOR_MODES, KEYS, default
from ui.worker import RunOptions


def test_defaults_file_export_block_is_generated_from_the_display_declarations():
    d = json.loads(DEFAULTS_FILE.read_text(encoding="utf-8"))
    assert d["export"] == export_defaults(), "run `python -m app.settings`"
    assert d["export"]["stride"] == default("display/stride")
    assert RunOptions(source="x").display_stride == default("display/stride")


def test_a_fresh_window_shows_and_draws_the_declared_defaults(qtbot):
    from ui.main_window import MainWindow

    w = MainWindow(settings=None)          # no settings file: nothing but the declarations
    qtbot.addWidget(w)
    v = w.viewer
    assert w.follow.isChecked() == default("display/follow") == v.follow
    assert (w.review.camera.currentText() == "Follow") == default("display/follow")
    assert w.show_frustums.isChecked() == default("display/frustums") == v.frustums.visible
    assert w.show_traj.isChecked() == default("display/trajectory") == v.trajectory.visible
    assert w.all_frustums.isChecked() == default("display/all_frustums") == v.all_frustums
    assert w.stride.value() == default("display/stride")
    assert (w.stride.minimum(), w.stride.maximum()) == KEYS["display/stride"].range
    assert w.point_size.value() == default("display/point_size")
    assert COLOR_MODES[w.color_mode.currentIndex()] == default("display/color_mode")
    assert v.point_budget == default("display/point_budget")
    assert w.run_options().display_stride == w.stride.value()
    # a change reaches the viewer, and toggling back and forth keeps the two in step
    w.follow.setChecked(not default("display/follow"))
    assert v.follow == (not default("display/follow")) and w.review.camera.currentText() in ("Free", "Follow")
    w.close()
