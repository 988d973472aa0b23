"""GUI test setup: every test gets its own settings file and session folder, so tests never
touch the user's settings, and a MainWindow factory that closes (and joins) what it opened."""
import pytest

from tests.ui import fake_engine  # noqa: F401  (registers the "ui-test" engine)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("RECONSTUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    monkeypatch.setenv("RECONSTUDIO_SESSIONS", str(tmp_path / "sessions"))


@pytest.fixture
def make_window(qtbot, tmp_path):
    from app.settings import AppSettings
    from ui.main_window import MainWindow

    def make(engine="ui-test", **cfg):
        w = MainWindow(settings=AppSettings(), session_root=str(tmp_path / "sessions"))
        qtbot.addWidget(w)
        c = w.settings_panel.config()
        c.engine = engine
        for k, v in cfg.items():
            setattr(c, k, v)
        w.settings_panel.set_config(c)
        w.resize(1280, 800)
        w.show()
        qtbot.waitExposed(w)
        return w
    return make


def wait_finished(qtbot, w, timeout=60_000):
    """Wait for the current run to end; returns its summary."""
    if w.last_summary is None:
        with qtbot.waitSignal(w.runFinished, timeout=timeout) as blocker:
            pass
        return blocker.args[0]
    return w.last_summary
