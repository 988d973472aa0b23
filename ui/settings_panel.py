"""Engine settings panel: one control per SessionConfig field the selected engine honours.

The choices and the visible rows come from `engine.engine_capabilities(name)`; each control's
tooltip says what it trades (the engine's own `tooltips` first, ours as a fallback). The
checkpoint row can fetch a released checkpoint from the hub (`engine.hub`) in a background
thread with a progress bar; failures (offline, gated, missing) show the hub module's message.
"""
from __future__ import annotations

import logging
import threading
from typing import Optional

from PySide6 import QtCore, QtWidgets

from engine.api import EngineError, SessionConfig, available_engines, engine_capabilities

log = logging.getLogger(__name__)

# Used when an engine gives no tooltip of its own for a field.
DEFAULT_TOOLTIPS = {
    "engine": "Which reconstruction engine runs. The geometric engine needs no weights (CPU, "
              "arbitrary scale); neural engines need a checkpoint and are best on a GPU.",
    "checkpoint": "Weights file (.pt / .safetensors) of the neural engine.",
    "device": "Where the engine runs: a GPU is much faster; CPU works everywhere.",
    "dtype": "Compute precision: bf16/fp16 halve memory and run faster on GPUs; fp32 is exact but slow.",
    "backend": "Attention kernel: flashinfer (paged, CUDA) or sdpa (PyTorch, any device); auto picks.",
    "image_width": "Model input width in pixels: larger = finer depth and poses, slower and more memory.",
    "mode": "streaming keeps one KV cache; windowed restarts it every window and aligns the pieces "
            "(bounded drift memory for very long videos, small seams).",
    "window": "Frames kept with full tokens in the KV cache: more = better long-range consistency, "
              "more memory and slower steps.",
    "scale_frames": "First frames processed together to fix the scene scale; never evicted. More = "
                    "steadier scale, longer wait before the first result.",
    "keyframe_interval": "Every N-th frame stays in the cache: larger N = longer memory per cached "
                         "frame and faster, but coarser tracking.",
    "camera_iterations": "Camera-head refinement passes: more = slightly better poses, slower.",
    "kv_compression": "Drop or merge cached tokens: less memory and faster attention, some accuracy loss.",
    "kv_dtype": "Precision of the cached keys/values: lower = less memory, small accuracy loss.",
    "special_cap": "How many past frames keep their special (camera) tokens: the long-range trajectory memory.",
    "intrinsics": "Camera intrinsics 'fx fy cx cy width height' of the input frames; empty = assume "
                  "the field of view below. Exact intrinsics give better geometry.",
    "fov_deg": "Horizontal field of view assumed when no intrinsics are given.",
    "max_side": "The geometric engine works at most at this resolution: larger = denser, slower.",
    "fps": "Frame rate assumed for image folders (their timestamps = index / fps); videos use their own clock.",
}

_COMBO_FIELDS = {  # config field → capability list with its choices
    "device": "devices", "dtype": "dtypes", "backend": "backends", "mode": "modes",
    "kv_compression": "kv_compression", "kv_dtype": "kv_dtypes",
}
_SPIN_FIELDS = {  # field → (min, max, step)
    "image_width": (112, 1022, 14), "window": (2, 1024, 1), "scale_frames": (1, 64, 1),
    "keyframe_interval": (1, 32, 1), "camera_iterations": (1, 8, 1), "special_cap": (16, 100000, 16),
    "max_side": (160, 1920, 32),
}
_LABELS = {
    "device": "Device", "dtype": "Precision", "backend": "Attention", "mode": "Mode",
    "kv_compression": "KV compression", "kv_dtype": "KV precision", "image_width": "Input width",
    "window": "Sliding window", "scale_frames": "Scale frames", "keyframe_interval": "Keyframe every",
    "camera_iterations": "Camera iterations", "special_cap": "Special-token cap",
    "max_side": "Working size", "intrinsics": "Intrinsics", "fov_deg": "Assumed FOV",
    "fps": "Folder frame rate",
}


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
        self._caps: dict = {}
        self.engine = QtWidgets.QComboBox()
        self.engine.setToolTip(DEFAULT_TOOLTIPS["engine"])
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
        self.checkpoint.setToolTip(DEFAULT_TOOLTIPS["checkpoint"])
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

        self.controls: dict[str, QtWidgets.QWidget] = {}
        for f in ("device", "dtype", "backend", "mode", "kv_compression", "kv_dtype"):
            w = QtWidgets.QComboBox()
            w.currentIndexChanged.connect(self.changed)
            self.controls[f] = w
            self._add_row(f, _LABELS[f], w)
        for f, (lo, hi, step) in _SPIN_FIELDS.items():
            w = QtWidgets.QSpinBox()
            w.setRange(lo, hi)
            w.setSingleStep(step)
            w.valueChanged.connect(self.changed)
            self.controls[f] = w
            self._add_row(f, _LABELS[f], w)
        self.intrinsics = QtWidgets.QLineEdit()
        self.intrinsics.setPlaceholderText("fx fy cx cy width height (empty = assumed FOV)")
        self.controls["intrinsics"] = self.intrinsics
        self._add_row("intrinsics", _LABELS["intrinsics"], self.intrinsics)
        self.fov = QtWidgets.QDoubleSpinBox()
        self.fov.setRange(20.0, 150.0)
        self.fov.setSuffix("°")
        self.controls["fov_deg"] = self.fov
        self._add_row("fov_deg", _LABELS["fov_deg"], self.fov)
        self.fps = QtWidgets.QDoubleSpinBox()
        self.fps.setRange(1.0, 240.0)
        self.fps.setSuffix(" fps")
        self.controls["fps"] = self.fps
        self._add_row("fps", _LABELS["fps"], self.fps)

        self.engine.currentIndexChanged.connect(self._on_engine_changed)
        self.set_config(SessionConfig())

    def _add_row(self, field: str, label: str, widget: QtWidgets.QWidget) -> None:
        widget.setToolTip(DEFAULT_TOOLTIPS.get(field, ""))
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
            if f in _COMBO_FIELDS:
                choices = list(caps.get(_COMBO_FIELDS[f], []) or [])
                current = w.currentText()
                w.blockSignals(True)
                w.clear()
                w.addItems([str(c) for c in choices])
                if current in choices:
                    w.setCurrentText(current)
                w.blockSignals(False)
                visible = visible and len(choices) > 0
            w.setToolTip(tips.get(f, DEFAULT_TOOLTIPS.get(f, "")))
            self._set_row_visible(f, visible)

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
        for f in _COMBO_FIELDS:
            w = self.controls[f]
            v = str(getattr(cfg, f))
            if w.findText(v) >= 0:
                w.setCurrentText(v)
        for f in _SPIN_FIELDS:
            w = self.controls[f]
            w.blockSignals(True)
            w.setValue(int(getattr(cfg, f)))
            w.blockSignals(False)
        self.intrinsics.setText(" ".join(f"{v:g}" for v in cfg.intrinsics) if cfg.intrinsics else "")
        self.fov.setValue(float(cfg.fov_deg))
        self.fps.setValue(float(cfg.fps))
        self._base = cfg
        self.changed.emit()

    def config(self) -> SessionConfig:
        """The SessionConfig the controls describe. Raises EngineError on malformed intrinsics."""
        d = dict(getattr(self, "_base", SessionConfig()).to_dict())
        d["engine"] = self.engine_name()
        d["checkpoint"] = self.checkpoint.text().strip() or None
        for f in _COMBO_FIELDS:
            t = self.controls[f].currentText()
            if t:
                d[f] = t
        for f in _SPIN_FIELDS:
            d[f] = int(self.controls[f].value())
        text = self.intrinsics.text().replace(",", " ").split()
        if "intrinsics" not in set(self._caps.get("fields", [])):
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
        d["fov_deg"] = float(self.fov.value())
        d["fps"] = float(self.fps.value())
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
