"""The settings panel shows, read-only, the memory plan the current settings would run with
(engine/memory_plan.py `preview`): the planned settings for a budget, the refusal when nothing
fits, nothing for engines without a plan."""
from engine.api import SessionConfig
from ui.settings_panel import SettingsPanel


def test_panel_shows_the_plan_and_the_refusal(qtbot):
    p = SettingsPanel()
    qtbot.addWidget(p)
    p.set_config(SessionConfig(engine="lingbot-map", dtype="bf16", gpu_memory=8.0))
    text = p.memory_plan_note.text()
    assert "window" in text and "of 8.00 GiB" in text and "exact path" not in text
    p.controls["gpu_memory"].setValue(64.0)           # a user edit updates the line
    assert "exact path" in p.memory_plan_note.text()
    p.controls["gpu_memory"].setValue(1.0)
    assert "not enough GPU memory" in p.memory_plan_note.text()
    p.set_config(SessionConfig(engine="geometric"))
    assert p.memory_plan_note.text() == ""
