"""Settings that persist between runs of the GUI (QSettings).

Stored: the engine SessionConfig (as JSON, so new fields need no migration code), the last
source, replay and display preferences, and the window geometry. `RECONSTUDIO_SETTINGS=/path.ini`
(or `--settings`) points at an INI file instead of the user's default store — tests use it so they
never touch the user's settings. Qt is imported on first use, so the CLI stays light.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from engine import envs
from engine.api import SessionConfig

ORGANIZATION = "ReconStudio"
APPLICATION = "ReconStudio"


DEFAULTS_FILE = Path(__file__).resolve().parents[1] / "resources" / "default_settings.json"


def session_defaults() -> dict:
    """The "session" block of the defaults file, generated from the SessionConfig metadata
    (every setting with its default; `extra` left out)."""
    d = SessionConfig().to_dict()
    d.pop("extra", None)
    return d


def write_defaults(path: Optional[Path] = None) -> Path:
    """Regenerate the defaults file's "session" block (and "engine") from the metadata, keeping its
    other sections: `python -m app.settings`."""
    path = Path(path or DEFAULTS_FILE)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        d = {}
    session = session_defaults()
    out = {"engine": session["engine"], "session": session}
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


RETENTION_KEYS = {"max_gb": "sessions/max_gb", "max_age_days": "sessions/max_age_days"}


def retention_limits(settings: Optional["AppSettings"] = None) -> tuple[float, float]:
    """(max_gb, max_age_days) of the sessions folder (0 = no limit): the app settings' values,
    else the defaults of engine.io.retention. Without `settings` the user's settings are read
    (the CLI shares the GUI's sessions folder and limits); no Qt → the defaults."""
    from engine.io.retention import DEFAULT_MAX_AGE_DAYS, DEFAULT_MAX_GB

    if settings is None:
        try:
            settings = AppSettings()
        except ImportError:
            return DEFAULT_MAX_GB, DEFAULT_MAX_AGE_DAYS

    def num(key, default):
        v = settings.get(RETENTION_KEYS[key], default)
        try:
            return max(0.0, float(v))
        except (TypeError, ValueError):
            return default
    return num("max_gb", DEFAULT_MAX_GB), num("max_age_days", DEFAULT_MAX_AGE_DAYS)


class AppSettings:
    def __init__(self, path: Optional[str] = None):
        from PySide6.QtCore import QSettings

        path = path or envs.get("RECONSTUDIO_SETTINGS")
        if path:
            self._q = QSettings(str(path), QSettings.Format.IniFormat)
        else:
            self._q = QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope,
                                ORGANIZATION, APPLICATION)

    @property
    def path(self) -> str:
        return self._q.fileName()

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
        d = self.get("engine/config", None)
        if not isinstance(d, dict):
            d = defaults().get("session")
        if not isinstance(d, dict):
            return SessionConfig()
        try:
            return SessionConfig.from_dict(d)
        except (TypeError, ValueError):
            return SessionConfig()

    def save_config(self, cfg: SessionConfig) -> None:
        self.set("engine/config", cfg.to_dict())

    def sync(self) -> None:
        self._q.sync()


if __name__ == "__main__":
    print(f"wrote {write_defaults()}")
