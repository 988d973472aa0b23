"""Shared test helpers: where the shared data lives, and the Qt import blocker."""
import sys
from pathlib import Path

import pytest

from engine import envs     # the registry of RECONSTUDIO_* variables (imports no Qt)

REPO = Path(__file__).resolve().parents[1]
SHARED = envs.get("RECONSTUDIO_SHARED") or REPO.parent / "shared"
DATA = SHARED / "data"
FIXTURES = SHARED / "fixtures"


class _BlockQt:
    """Meta-path finder that makes every Qt-based package unimportable, so the engine tests
    prove the engine needs no Qt (RECONSTUDIO_BLOCK_QT=1)."""

    BLOCKED = ("PySide6", "PyQt5", "PyQt6", "shiboken6", "vispy", "pyqtgraph", "ui")

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.BLOCKED:
            raise ImportError(f"{name} is blocked: engine tests run without Qt")
        return None


if envs.get("RECONSTUDIO_BLOCK_QT"):
    sys.meta_path.insert(0, _BlockQt())


@pytest.fixture
def shared_data():
    if not DATA.is_dir():
        pytest.fail(f"shared data not found at {DATA} (set RECONSTUDIO_SHARED)")
    return DATA


@pytest.fixture
def fixtures_dir():
    if not FIXTURES.is_dir():
        pytest.fail(f"shared fixtures not found at {FIXTURES} (set RECONSTUDIO_SHARED)")
    return FIXTURES
