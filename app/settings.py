"""Settings that persist between runs of the GUI (QSettings).

Stored: the engine SessionConfig (as JSON, so new fields need no migration code), the last
source, replay and display preferences, and the window geometry. `RECONSTUDIO_SETTINGS=/path.ini`
(or `--settings`) points at an INI file instead of the user's default store — tests use it so they
never touch the user's settings. Qt is imported on first use, so the CLI stays light.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

from engine import envs
from engine.api import SessionConfig

ORGANIZATION = "ReconStudio"
APPLICATION = "ReconStudio"
log = logging.getLogger(__name__)


DEFAULTS_FILE = Path(__file__).resolve().parents[1] / "resources" / "default_settings.json"


def session_defaults() -> dict:
    """The "session" block of the defaults file, generated from the SessionConfig metadata
    (every setting with its default; `extra` left out)."""
    d = SessionConfig().to_dict()
    d.pop("extra", None)
    return d


def export_defaults() -> dict:
    """The "export" block of the defaults file (the CLI's --conf-threshold / --stride defaults):
    the display defaults declared in ui/settings_schema.py, so `run` exports what the GUI shows."""
    from ui.settings_schema import default
    return {"conf_threshold": default("display/conf_threshold"), "stride": default("display/stride")}


def write_defaults(path: Optional[Path] = None) -> Path:
    """Regenerate the defaults file's "session" block (and "engine") from the metadata and its
    "export" block from the display declarations, keeping its other sections: `python -m app.settings`."""
    path = Path(path or DEFAULTS_FILE)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        d = {}
    session = session_defaults()
    out = {"engine": session["engine"], "session": session, "export": export_defaults()}
    out.update({k: v for k, v in d.items() if k not in out})
    path.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def defaults() -> dict:
    """The shipped defaults (resources/default_settings.json), {} if missing or unreadable."""
    path = DEFAULTS_FILE
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def retention_limits(settings: Optional["AppSettings"] = None) -> tuple[float, float]:
    """engine.io.retention.retention_limits of `settings`, by default the user's settings (the CLI
    shares the GUI's sessions folder and limits); no Qt -> the defaults."""
    from engine.io.retention import retention_limits as limits_of

    if settings is None:
        try:
            settings = AppSettings()
        except ImportError:
            return limits_of(None)
    return limits_of(settings)


class AppSettings:
    def __init__(self, path: Optional[str] = None):
        from PySide6.QtCore import QSettings

        path = path or envs.get("RECONSTUDIO_SETTINGS")
        if path:
            self._q = QSettings(str(path), QSettings.Format.IniFormat)
        else:
            self._q = QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope,
                                ORGANIZATION, APPLICATION)
        self._problems: list = []
        self._warned: set = set()

    @property
    def path(self) -> str:
        return self._q.fileName()

    def raw(self, key: str) -> Any:
        """The stored value as written: JSON-decoded when it is JSON (what `set` writes), else
        as the INI file holds it (a hand-edited `loop=maybe` is the text "maybe"); None if absent."""
        raw = self._q.value(key, None)
        if isinstance(raw, str):
            try:
                return json.loads(raw)
            except ValueError:
                return raw
        return raw

    def value(self, key: str) -> Any:
        """A declared key's value (ui.settings_schema.KEYS), checked when read: a bad value gives
        the declared default and, once per key, a problem line (`take_problems`) and a log warning."""
        from ui.settings_schema import check
        v, problem = check(key, self.raw(key))
        self._note(key, problem)
        return v

    def _note(self, key: str, problem: Optional[str]) -> None:
        if problem and key not in self._warned:
            self._warned.add(key)
            self._problems.append(problem)
            log.warning("settings file %s: %s", self.path, problem)

    def take_problems(self) -> list:
        """Problems found in the settings file since the last call (each key once per process)."""
        out, self._problems = self._problems, []
        return out

    def get(self, key: str, default: Any = None) -> Any:
        """A JSON-decoded value (so ints, floats, bools and lists come back typed)."""
        raw = self._q.value(key, None)
        if raw is None:
            return default
        try:
            return json.loads(raw)
        except (TypeError, ValueError):
            return default

    def set(self, key: str, value: Any) -> None:
        self._q.setValue(key, json.dumps(value))

    def get_bytes(self, key: str) -> Optional[bytes]:
        v = self._q.value(key, None)
        try:
            return bytes(v) if v is not None else None
        except TypeError:
            return None

    def set_bytes(self, key: str, value: bytes) -> None:
        from PySide6.QtCore import QByteArray
        self._q.setValue(key, QByteArray(value))

    def load_config(self) -> SessionConfig:
        """The saved engine settings, each field checked with its `setting()` metadata
        (ui.settings_schema.check_session): a bad field takes its default, with a problem line."""
        from ui.settings_schema import check_session
        cfg, problems = check_session(self.raw("engine/config"), SessionConfig())
        for p in problems:
            self._note(p.split(" = ", 1)[0], p)
        return cfg

    def save_config(self, cfg: SessionConfig) -> None:
        self.set("engine/config", cfg.to_dict())

    def sync(self) -> None:
        self._q.sync()


if __name__ == "__main__":
    print(f"wrote {write_defaults()}")
