"""File > Sessions folder: where runs are saved, how much space they take, and the retention limits.

Every run is saved as a session folder under the sessions folder ($RECONSTUDIO_SESSIONS or
~/.local/share/reconstudio/sessions). When a new run starts, the oldest sessions are removed until
the folder is within the size limit and no session is older than the age limit (engine.io.retention);
only session folders are removed, and never one that a ReconStudio process has open (a run writing
it, a window showing it, an export reading it). The limits live in the app settings
(engine.io.retention.RETENTION_KEYS); 0 = no limit. Sizes per engine: docs/benchmarks_io.md.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from PySide6 import QtCore, QtGui, QtWidgets


class SessionsDialog(QtWidgets.QDialog):
    def __init__(self, parent=None, *, settings=None, root: Optional[str] = None, keep=()):
        super().__init__(parent)
        from engine.io.retention import retention_limits
        from engine.io.store import default_session_root

        self.setWindowTitle("Sessions folder")
        self.settings = settings
        self.root = Path(root).expanduser() if root else default_session_root()
        self.keep = tuple(k for k in keep if k)
        lay = QtWidgets.QVBoxLayout(self)
        self.path_label = QtWidgets.QLabel(str(self.root))
        self.path_label.setTextInteractionFlags(QtCore.Qt.TextInteractionFlag.TextSelectableByMouse)
        self.usage_label = QtWidgets.QLabel()
        form = QtWidgets.QFormLayout()
        form.addRow("Folder:", self.path_label)
        form.addRow("Holds:", self.usage_label)
        max_gb, max_days = retention_limits(settings)
        self.max_gb = QtWidgets.QDoubleSpinBox(minimum=0.0, maximum=100_000.0, decimals=1, suffix=" GB",
                                               value=max_gb, specialValueText="no limit")
        self.max_gb.setToolTip("When a new run starts, the oldest sessions are removed until the folder "
                               "holds at most this much. A neural engine stores dense depth and confidence "
                               "with every frame, far more per hour than the geometric engine (sizes per "
                               "hour: docs/benchmarks_io.md). 0 = no limit.")
        self.max_days = QtWidgets.QDoubleSpinBox(minimum=0.0, maximum=36_500.0, decimals=0, suffix=" days",
                                                 value=max_days, specialValueText="no limit")
        self.max_days.setToolTip("Sessions older than this are removed when a new run starts. 0 = no limit.")
        form.addRow("Keep at most:", self.max_gb)
        form.addRow("Keep for:", self.max_days)
        lay.addLayout(form)
        note = QtWidgets.QLabel("A neural engine's sessions are large (dense depth and confidence per frame): the "
                                "default 20 GB does not hold an hour of neural capture.\nSessions open in any "
                                "ReconStudio window or run (the running one, the one on screen) are never "
                                "removed; nothing but session folders is.")
        note.setWordWrap(True)
        note.setStyleSheet("color: #888;")
        lay.addWidget(note)
        buttons = QtWidgets.QDialogButtonBox()
        self.open_btn = buttons.addButton("Open folder", QtWidgets.QDialogButtonBox.ButtonRole.ActionRole)
        self.apply_btn = buttons.addButton("Apply limits now", QtWidgets.QDialogButtonBox.ButtonRole.ActionRole)
        buttons.addButton(QtWidgets.QDialogButtonBox.StandardButton.Close)
        self.open_btn.clicked.connect(self.open_folder)
        self.apply_btn.clicked.connect(self.apply_now)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        self.max_gb.valueChanged.connect(self.save)
        self.max_days.valueChanged.connect(self.save)
        self.refresh()

    def refresh(self) -> None:
        from engine.io.retention import format_bytes, sessions_usage

        n, total = sessions_usage(self.root)
        self.usage_label.setText(f"{n} session(s), {format_bytes(total)}")

    def limits(self) -> tuple[float, float]:
        return float(self.max_gb.value()), float(self.max_days.value())

    def save(self) -> None:
        from engine.io.retention import RETENTION_KEYS

        if self.settings is not None:
            self.settings.set(RETENTION_KEYS["max_gb"], self.max_gb.value())
            self.settings.set(RETENTION_KEYS["max_age_days"], self.max_days.value())

    def apply_now(self) -> list:
        from engine.io.retention import apply_retention

        max_gb, max_days = self.limits()
        deleted = apply_retention(self.root, max_gb=max_gb, max_age_days=max_days, keep=self.keep)
        self.refresh()
        return deleted

    def open_folder(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        QtGui.QDesktopServices.openUrl(QtCore.QUrl.fromLocalFile(str(self.root)))


def sessions_summary(root: Optional[str] = None) -> str:
    """One line for a status text: "<folder>: N sessions, X GB"."""
    from engine.io.retention import format_bytes, sessions_usage
    from engine.io.store import default_session_root

    folder = Path(root).expanduser() if root else default_session_root()
    n, total = sessions_usage(folder)
    return f"{folder}: {n} session(s), {format_bytes(total)}"
