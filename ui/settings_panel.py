"""Engine settings panel: one row per `SessionConfig` setting the selected engine honours.

The rows are generated from the `engine.api.setting()` metadata (label, tooltip, choices, range,
step, group): a choice field is a combo box (its items narrowed by the engine's capabilities), a
bool a check box, a number a spin box, text a line edit; a new setting gets its row without code
here. The engine selector, the checkpoint row (browse, download from the hub in a background
thread with a progress bar) and the intrinsics row (six numbers, checked) are built by hand.
Which rows show and their tooltips come from `engine_capabilities(name)` ("fields", "tooltips").
"""
from __future__ import annotations

import logging
import threading
from typing import Optional

from PySide6 import QtCore, QtWidgets

from engine.api import (CHOICE_KEYS, EngineError, SessionConfig, _field_kind, available_engines,
                        engine_capabilities, setting_fields)

log = logging.getLogger(__name__)

# fields with a hand-made row (the rest are generated)
_CUSTOM = ("engine", "checkpoint", "intrinsics")


def _tooltip(name: str) -> str:
    for f, meta in setting_fields():
        if f.name == name:
            return meta["tooltip"]
    return ""


class _Downloader(QtCore.QObject):
    """Runs engine.hub.download_known in a Python thread; reports through queued signals."""

    progress = QtCore.Signal(int, int)
    done = QtCore.Signal(str)
    failed = QtCore.Signal(str)

    def start(self, name: str) -> None:
        def job():
            from engine import hub
            try:
                path = hub.download_known(name, progress=lambda d, t: self.progress.emit(int(d // 1024), int(t // 1024)))
            except EngineError as exc:
                self.failed.emit(str(exc))
            except Exception as exc:  # keep the GUI alive whatever the hub library raises
                log.exception("download failed")
                self.failed.emit(f"Download failed: {exc}")
            else:
                self.done.emit(str(path))
        self._thread = threading.Thread(target=job, name="reconstudio-download", daemon=True)
        self._thread.start()


class SettingsPanel(QtWidgets.QWidget):
    changed = QtCore.Signal()
    message = QtCore.Signal(str)

    def __init__(self, parent: Optional[QtWidgets.QWidget] = None):
        super().__init__(parent)
        self._form = QtWidgets.QFormLayout(self)
        self._form.setFieldGrowthPolicy(QtWidgets.QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self._rows: dict[str, QtWidgets.QWidget] = {}
        self._groups: dict[str, tuple] = {}      # group -> (heading label, [fields])
        self._caps: dict = {}
        self._meta = {f.name: (f, meta) for f, meta in setting_fields() if meta.get("panel", True)}
        self.engine = QtWidgets.QComboBox()
        self.engine.setToolTip(_tooltip("engine"))
        self._engines = available_engines()
        for name in self._engines:
            try:
                label = engine_capabilities(name).get("label", name)
            except EngineError:
                label = name
            self.engine.addItem(label, name)
        self._form.addRow("Engine", self.engine)
        self.engine_note = QtWidgets.QLabel()
        self.engine_note.setWordWrap(True)
        self.engine_note.setStyleSheet("color: #888;")
        self._form.addRow(self.engine_note)
        if not self._engines:
            self.engine_note.setText("No engine is installed.")

        # checkpoint row: path, browse, download from the hub
        ck = QtWidgets.QWidget()
        v = QtWidgets.QVBoxLayout(ck)
        v.setContentsMargins(0, 0, 0, 0)
        v.setSpacing(2)
        h = QtWidgets.QHBoxLayout()
        h.setContentsMargins(0, 0, 0, 0)
        self.checkpoint = QtWidgets.QLineEdit()
        self.checkpoint.setPlaceholderText("weights file (.pt / .safetensors)")
        self.checkpoint.setToolTip(_tooltip("checkpoint"))
        self.checkpoint.editingFinished.connect(self.changed)
        browse = QtWidgets.QToolButton(text="Browse…")
        browse.setToolTip("Choose a checkpoint file")
        browse.clicked.connect(self._browse_checkpoint)
        self.download_button = QtWidgets.QToolButton(text="Download")
        self.download_button.setPopupMode(QtWidgets.QToolButton.ToolButtonPopupMode.InstantPopup)
        self.download_button.setToolTip("Download a released checkpoint from the Hugging Face hub")
        self._download_menu = QtWidgets.QMenu(self.download_button)
        self.download_button.setMenu(self._download_menu)
        v.addWidget(self.checkpoint)
        h.addWidget(browse)
        h.addWidget(self.download_button)
        h.addStretch(1)
        v.addLayout(h)
        self._add_row("checkpoint", "Checkpoint", ck)
        self.download_progress = QtWidgets.QProgressBar()
        self.download_progress.setVisible(False)
        self._form.addRow(self.download_progress)
        self._downloader = _Downloader()
        self._downloader.progress.connect(self._on_download_progress)
        self._downloader.done.connect(self._on_download_done)
        self._downloader.failed.connect(self._on_download_failed)

        # one generated row per setting, under a heading per group
        self.controls: dict[str, QtWidgets.QWidget] = {}
        for name, (f, meta) in self._meta.items():
            if name in ("engine", "checkpoint"):
                continue
            group = meta.get("group") or "Other"
            if group not in self._groups:
                heading = QtWidgets.QLabel(f"<b>{group}</b>")
                self._form.addRow(heading)
                self._groups[group] = (heading, [])
            self._groups[group][1].append(name)
            if name == "intrinsics":
                w = self.intrinsics = QtWidgets.QLineEdit()
                w.setPlaceholderText("fx fy cx cy width height (empty = file or assumed FOV)")
                w.editingFinished.connect(self.changed)
            else:
                w = self._make_control(f, meta)
            self.controls[name] = w
            self._add_row(name, meta.get("label") or name, w)
        self.fov = self.controls.get("fov_deg")       # kept names for callers and tests
        self.fps = self.controls.get("fps")
        # read-only: the memory plan the current settings would run with (engine/memory_plan.py)
        self.memory_plan_note = QtWidgets.QLabel()
        self.memory_plan_note.setWordWrap(True)
        self.memory_plan_note.setStyleSheet("color: #888;")
        if "gpu_memory" in self._rows:
            row = self._form.getWidgetPosition(self._rows["gpu_memory"])[0] + 1
            self._form.insertRow(row, self.memory_plan_note)
        self.changed.connect(self.update_memory_plan)

        self.engine.currentIndexChanged.connect(self._on_engine_changed)
        self.set_config(SessionConfig())

    def _make_control(self, f, meta) -> QtWidgets.QWidget:
        kind = _field_kind(f)
        if f.name in CHOICE_KEYS or meta.get("choices"):
            w = QtWidgets.QComboBox()
            w.currentIndexChanged.connect(self.changed)
        elif kind is bool:
            w = QtWidgets.QCheckBox()
            w.toggled.connect(self.changed)
        elif kind is int:
            w = QtWidgets.QSpinBox()
            lo, hi = meta.get("range") or (0, 2**31 - 1)
            w.setRange(int(lo), int(min(hi, 2**31 - 1)))
            w.setSingleStep(int(meta.get("step") or 1))
            w.valueChanged.connect(self.changed)
        elif kind is float:
            w = QtWidgets.QDoubleSpinBox()
            lo, hi = meta.get("range") or (0.0, 1e9)
            step = float(meta.get("step") or (0.05 if hi <= 1 else 1.0))
            w.setDecimals(2 if step >= 0.01 else 4)
            w.setRange(float(lo), float(hi))
            w.setSingleStep(step)
            w.valueChanged.connect(self.changed)
        else:
            w = QtWidgets.QLineEdit()
            w.setPlaceholderText("(none)")
            w.editingFinished.connect(self.changed)
        return w

    def update_memory_plan(self) -> None:
        from engine.memory_plan import preview
        try:
            text = preview(self.config())
        except EngineError as exc:          # settings the panel cannot build yet
            text = f"Memory plan: {exc}"
        self.memory_plan_note.setText(text)
        self.memory_plan_note.setVisible(bool(text))

    def _add_row(self, field: str, label: str, widget: QtWidgets.QWidget) -> None:
        widget.setToolTip(_tooltip(field))
        self._form.addRow(label, widget)
        self._rows[field] = widget

    def _set_row_visible(self, field: str, visible: bool) -> None:
        w = self._rows[field]
        w.setVisible(visible)
        lab = self._form.labelForField(w)
        if lab is not None:
            lab.setVisible(visible)

    # -- engine capabilities -----------------------------------------------------------------
    def engine_name(self) -> str:
        return self.engine.currentData() or "geometric"

    def capabilities(self) -> dict:
        return dict(self._caps)

    def _on_engine_changed(self) -> None:
        self._apply_capabilities(self.engine_name())
        self.changed.emit()

    def _choices(self, name: str) -> list:
        meta = self._meta[name][1]
        key = CHOICE_KEYS.get(name, f"{name}_choices")
        return list(self._caps.get(key) or meta.get("choices") or [])

    def _apply_capabilities(self, name: str) -> None:
        try:
            caps = engine_capabilities(name)
        except EngineError as exc:
            caps = {}
            self.engine_note.setText(str(exc))
        self._caps = caps
        fields = set(caps.get("fields", []))
        tips = caps.get("tooltips", {}) or {}
        notes = []
        if caps.get("needs_checkpoint"):
            notes.append("needs a checkpoint")
        if name == "geometric" or caps.get("monocular_scale"):
            notes.append("monocular: arbitrary scale")
        self.engine_note.setText(" · ".join(notes))
        self._set_row_visible("checkpoint", bool(caps.get("needs_checkpoint")) or "checkpoint" in fields)
        self._download_menu.clear()
        from engine import hub
        for ck in hub.KNOWN_CHECKPOINTS:
            if ck.engine == name:
                act = self._download_menu.addAction(f"{ck.label} ({ck.size_bytes / 1e9:.1f} GB)")
                act.setToolTip(ck.description)
                act.triggered.connect(lambda _=False, n=ck.name: self.download(n))
        self.download_button.setEnabled(not self._download_menu.isEmpty())
        for f, w in self.controls.items():
            visible = f in fields
            if isinstance(w, QtWidgets.QComboBox):
                choices = self._choices(f)
                current = w.currentText()
                w.blockSignals(True)
                w.clear()
                w.addItems([str(c) for c in choices])
                if current in choices:
                    w.setCurrentText(current)
                w.blockSignals(False)
                visible = visible and len(choices) > 0
            w.setToolTip(tips.get(f, _tooltip(f)))
            self._set_row_visible(f, visible)
        for heading, names in self._groups.values():
            heading.setVisible(any(not self._rows[n].isHidden() for n in names))

    # -- config in / out ---------------------------------------------------------------------
    def set_config(self, cfg: SessionConfig) -> None:
        i = self.engine.findData(cfg.engine)
        if i < 0 and self.engine.count():
            i = 0
        self.engine.blockSignals(True)
        self.engine.setCurrentIndex(i)
        self.engine.blockSignals(False)
        self._apply_capabilities(self.engine_name())
        self.checkpoint.setText(cfg.checkpoint or "")
        for f, w in self.controls.items():
            v = getattr(cfg, f)
            w.blockSignals(True)
            if f == "intrinsics":
                w.setText(" ".join(f"{x:g}" for x in v) if v else "")
            elif isinstance(w, QtWidgets.QComboBox):
                if w.findText(str(v)) >= 0:
                    w.setCurrentText(str(v))
            elif isinstance(w, QtWidgets.QCheckBox):
                w.setChecked(bool(v))
            elif isinstance(w, QtWidgets.QSpinBox):
                w.setValue(int(v))
            elif isinstance(w, QtWidgets.QDoubleSpinBox):
                w.setValue(float(v))
            else:
                w.setText("" if v is None else str(v))
            w.blockSignals(False)
        self._base = cfg
        self.changed.emit()

    def config(self) -> SessionConfig:
        """The SessionConfig the controls describe. Raises EngineError on malformed intrinsics."""
        d = dict(getattr(self, "_base", SessionConfig()).to_dict())
        d["engine"] = self.engine_name()
        d["checkpoint"] = self.checkpoint.text().strip() or None
        fields = set(self._caps.get("fields", []))
        for f, w in self.controls.items():
            if f == "intrinsics":
                continue
            if isinstance(w, QtWidgets.QComboBox):
                if w.currentText():
                    kind = _field_kind(self._meta[f][0])
                    d[f] = kind(w.currentText()) if kind in (int, float) else w.currentText()
            elif isinstance(w, QtWidgets.QCheckBox):
                d[f] = w.isChecked()
            elif isinstance(w, QtWidgets.QSpinBox):
                d[f] = int(w.value())
            elif isinstance(w, QtWidgets.QDoubleSpinBox):
                d[f] = float(w.value())
            else:
                d[f] = w.text().strip() or None
        text = self.intrinsics.text().replace(",", " ").split() if "intrinsics" in self.controls else []
        if "intrinsics" not in fields:
            text = []                          # not honoured by this engine: not parsed either
        if text:
            try:
                vals = tuple(float(v) for v in text)
            except ValueError:
                vals = ()
            if len(vals) != 6 or min(vals[0], vals[1], vals[4], vals[5]) <= 0:
                raise EngineError("Intrinsics must be six numbers 'fx fy cx cy width height' "
                                  "(focal lengths and size positive)")
            d["intrinsics"] = vals
        else:
            d["intrinsics"] = None
        return SessionConfig.from_dict(d)

    # -- checkpoint ---------------------------------------------------------------------------
    def _browse_checkpoint(self) -> None:
        path, _ = QtWidgets.QFileDialog.getOpenFileName(
            self, "Choose a checkpoint", self.checkpoint.text(), "Checkpoints (*.pt *.pth *.safetensors);;All files (*)")
        if path:
            self.checkpoint.setText(path)
            self.changed.emit()

    def download(self, name: str) -> None:
        self.download_button.setEnabled(False)
        self.download_progress.setVisible(True)
        self.download_progress.setRange(0, 0)
        self.download_progress.setFormat(f"downloading {name}… %p%")
        self._downloader.start(name)

    def _on_download_progress(self, done_kb: int, total_kb: int) -> None:
        if total_kb > 0:
            self.download_progress.setRange(0, total_kb)
            self.download_progress.setValue(done_kb)

    def _on_download_done(self, path: str) -> None:
        self.download_progress.setVisible(False)
        self.download_button.setEnabled(True)
        self.checkpoint.setText(path)
        self.message.emit(f"Checkpoint ready: {path}")
        self.changed.emit()

    def _on_download_failed(self, text: str) -> None:
        self.download_progress.setVisible(False)
        self.download_button.setEnabled(True)
        self.message.emit(text)
