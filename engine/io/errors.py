"""Errors of the session folder layer, apart so that the store and its lease share them without
importing each other."""
from __future__ import annotations

from ..api import EngineError


class StoreError(EngineError):
    """A session folder cannot be created or read."""
