"""Frame sources: webcam, video file and image folder, all yielding RGB uint8 frames.

Every failure a user can cause (missing file, truncated or corrupt video, empty folder, absent
webcam) raises `SourceError` with a message meant to be shown as-is. Reading never raises in the
middle of a stream: a damaged video simply ends at the last frame that decodes, and an unreadable
image in a folder is skipped with a warning (kept in `FrameSource.warnings` for the client to show).

OpenCV is imported lazily, with its own and FFmpeg's console logging silenced, so probing webcams
or opening a damaged file does not spam the terminal.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np

from ..api import EngineError

log = logging.getLogger("reconstudio.io")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
DEFAULT_FPS = 30.0
_TEXT_CODECS = {b"ansi", b"tty\0"}


class SourceError(EngineError):
    """A frame source could not be opened or used; the message is shown to the user as-is."""


@dataclass
class Frame:
    index: int              # position of the frame in its file / folder (webcam: frames grabbed)
    timestamp: float        # seconds of input time (video time, folder index / fps, webcam clock)
    image: np.ndarray       # H x W x 3 uint8 RGB


_cv2_mod = None


def _cv2():
    """Import OpenCV with console logging silenced (FFmpeg 'moov atom not found', V4L2 probes)."""
    global _cv2_mod
    if _cv2_mod is None:
        os.environ.setdefault("OPENCV_LOG_LEVEL", "SILENT")
        os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")   # AV_LOG_QUIET
        os.environ.setdefault("OPENCV_VIDEOIO_DEBUG", "0")
        import cv2
        try:
            cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
        except AttributeError:  # very old builds
            pass
        _cv2_mod = cv2
    return _cv2_mod


def _read_bgr(cap):
    """Next BGR frame of a cv2.VideoCapture, or None at the end. A damaged packet raises
    cv2.error inside OpenCV: that must end the stream, not the program."""
    cv2 = _cv2()
    try:
        ok, bgr = cap.read()
    except cv2.error:
        return None
    return bgr if ok else None


def _fit_max_side(image: np.ndarray, max_side: Optional[int]) -> np.ndarray:
    """Downscale so the longer side is at most `max_side` (never upscales)."""
    if not max_side:
        return image
    h, w = image.shape[:2]
    s = max_side / max(h, w)
    if s >= 1.0:
        return image
    cv2 = _cv2()
    size = (max(1, round(w * s)), max(1, round(h * s)))
    return cv2.resize(image, size, interpolation=cv2.INTER_AREA)


def _bgr_to_rgb(image: np.ndarray) -> np.ndarray:
    cv2 = _cv2()
    if image.ndim == 2:
        return cv2.cvtColor(image, cv2.COLOR_GRAY2RGB)
    if image.shape[2] == 4:
        return cv2.cvtColor(image, cv2.COLOR_BGRA2RGB)
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


class FrameSource:
    """Common interface. `read()` returns the next `Frame` or None at the end of the stream."""

    kind: str = ""
    name: str = ""
    fps: float = DEFAULT_FPS

    def __init__(self, *, max_side: Optional[int] = None, loop: bool = False):
        self.max_side = max_side
        self.loop = loop
        self.warnings: list[str] = []     # user-facing notes gathered while reading (skipped images)
        self._closed = False

    def __len__(self) -> int:
        return 0

    def read(self) -> Optional[Frame]:
        raise NotImplementedError

    def seek(self, index: int) -> None:
        raise SourceError(f"{self.kind} sources cannot seek")

    @property
    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self._closed = True

    def __iter__(self):
        while True:
            f = self.read()
            if f is None:
                return
            yield f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _warn(self, message: str) -> None:
        # Clients show `warnings` themselves (status bar, CLI); logging at info level avoids
        # Python's last-resort handler printing each one a second time.
        self.warnings.append(message)
        log.info(message)

    def _check_seek(self, index: int) -> int:
        n = len(self)
        if not isinstance(index, (int, np.integer)) or index < 0 or (n and index >= n):
            raise SourceError(f"cannot seek to frame {index}: {self.name} has {n} frames")
        return int(index)


class VideoSource(FrameSource):
    """A video file decoded with cv2.VideoCapture. Timestamps are the container's presentation
    times (falling back to index / fps), so they are seconds of video time."""

    kind = "video"

    def __init__(self, path: Union[str, Path], *, fps: Optional[float] = None,
                 max_side: Optional[int] = None, loop: bool = False):
        super().__init__(max_side=max_side, loop=loop)
        self.path = Path(path)
        self.name = self.path.name
        if not self.path.exists():
            raise SourceError(f"Video file not found: {self.path}")
        if not self.path.is_file():
            raise SourceError(f"Not a video file: {self.path}")
        if not os.access(self.path, os.R_OK):
            raise SourceError(f"Video file is not readable (permission denied): {self.path}")
        if self.path.stat().st_size == 0:
            raise SourceError(f"Video file is empty: {self.path}")
        cv2 = _cv2()
        self._cap = cv2.VideoCapture(str(self.path))
        if not self._cap.isOpened():
            self._cap.release()
            raise SourceError(
                f"Cannot open video {self.name}: the file is truncated, corrupt or not a video "
                "format this build can decode.")
        fourcc = int(self._cap.get(cv2.CAP_PROP_FOURCC)) & 0xFFFFFFFF
        if fourcc.to_bytes(4, "little") in _TEXT_CODECS:
            # FFmpeg "plays" any text file as ANSI art; that is never what the user meant.
            self._cap.release()
            raise SourceError(f"Cannot open video {self.name}: it is a text file, not a video.")
        container_fps = self._cap.get(cv2.CAP_PROP_FPS)
        if container_fps and np.isfinite(container_fps) and 0 < container_fps < 1000:
            self.fps = float(container_fps)
        else:
            self.fps = float(fps or DEFAULT_FPS)
        count = self._cap.get(cv2.CAP_PROP_FRAME_COUNT)
        self._count = int(count) if count and np.isfinite(count) and count > 0 else 0
        self._pos = 0               # index of the next frame to decode
        self._loops = 0             # completed passes (loop mode keeps timestamps increasing)
        self._last_t = -1.0
        self._duration = 0.0        # video time at the end of the last completed pass
        # Probe the first frame now: a file that opens but decodes nothing is unusable.
        ok, _ = self._cap.read()
        if not ok:
            self._cap.release()
            raise SourceError(f"Cannot decode any frame of video {self.name}: the file is corrupt or truncated.")
        self._rewind()

    def __len__(self) -> int:
        return self._count

    @property
    def seekable(self) -> bool:
        return True

    def _rewind(self) -> None:
        cv2 = _cv2()
        if not self._cap.set(cv2.CAP_PROP_POS_FRAMES, 0):
            self._cap.release()
            self._cap = cv2.VideoCapture(str(self.path))
        self._pos = 0
        self._last_t = -1.0

    def read(self) -> Optional[Frame]:
        if self._closed:
            return None
        bgr = _read_bgr(self._cap)
        if bgr is None:
            if self.loop and self._pos > 0:
                self._loops += 1
                self._duration += self._pass_length()
                self._rewind()
                return self.read()
            if self._count and self._pos < self._count and not self.loop:
                self._warn(f"{self.name}: stream ended after {self._pos} of {self._count} frames "
                           "(the file is truncated or damaged)")
            return None
        index = self._pos
        t = self._cap.get(_cv2().CAP_PROP_POS_MSEC) / 1000.0
        if not np.isfinite(t) or t < 0 or t <= self._last_t or (index > 0 and t == 0.0):
            t = index / self.fps       # container gave no usable time: use the nominal rate
        self._last_t = t
        self._pos += 1
        image = _fit_max_side(_bgr_to_rgb(bgr), self.max_side)
        return Frame(index=index, timestamp=self._duration + t, image=np.ascontiguousarray(image))

    def _pass_length(self) -> float:
        return max(self._last_t, 0.0) + 1.0 / self.fps

    def seek(self, index: int) -> None:
        index = self._check_seek(index)
        cv2 = _cv2()
        ok = self._cap.set(cv2.CAP_PROP_POS_FRAMES, index)
        if not ok or int(round(self._cap.get(cv2.CAP_PROP_POS_FRAMES))) != index:
            # The backend could not seek exactly: reopen and decode forward.
            self._cap.release()
            self._cap = cv2.VideoCapture(str(self.path))
            for _ in range(index):
                if not self._cap.grab():
                    break
        self._pos = index
        self._last_t = (index - 1) / self.fps if index else -1.0

    def close(self) -> None:
        super().close()
        self._cap.release()


class FolderSource(FrameSource):
    """jpg/jpeg/png files of a folder sorted by name (or one image file); other files ignored."""

    kind = "folder"

    def __init__(self, path: Union[str, Path], *, fps: Optional[float] = None,
                 max_side: Optional[int] = None, loop: bool = False):
        super().__init__(max_side=max_side, loop=loop)
        self.path = Path(path)
        self.fps = float(fps or DEFAULT_FPS)
        if self.fps <= 0:
            raise SourceError(f"Frame rate must be positive, got {fps}")
        if self.path.is_file():
            self.files = [self.path]
        else:
            try:
                entries = list(self.path.iterdir())
            except PermissionError:
                raise SourceError(f"Folder is not readable (permission denied): {self.path}") from None
            self.files = sorted((p for p in entries if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS),
                                key=lambda p: p.name)
            if not self.files:
                raise SourceError(
                    f"No images in folder {self.path} (looked for {', '.join(IMAGE_EXTENSIONS)} files)")
        self.name = self.path.name or str(self.path)
        self._pos = 0
        self._loops = 0
        self._decoded_any = False

    def __len__(self) -> int:
        return len(self.files)

    @property
    def seekable(self) -> bool:
        return True

    def read(self) -> Optional[Frame]:
        cv2 = _cv2()
        while not self._closed:
            if self._pos >= len(self.files):
                if not self.loop or not self._decoded_any:
                    return None      # (a loop over a folder where nothing decodes must still end)
                self._loops += 1
                self._pos = 0
            index = self._pos
            self._pos += 1
            path = self.files[index]
            try:
                buf = np.fromfile(path, dtype=np.uint8)   # (cv2.imread cannot take every path)
                bgr = cv2.imdecode(buf, cv2.IMREAD_COLOR) if buf.size else None
            except (OSError, cv2.error):
                bgr = None
            if bgr is None:
                if self._loops == 0:
                    self._warn(f"Skipped unreadable image {path.name}")
                continue
            self._decoded_any = True
            image = _fit_max_side(_bgr_to_rgb(bgr), self.max_side)
            t = (self._loops * len(self.files) + index) / self.fps
            return Frame(index=index, timestamp=t, image=np.ascontiguousarray(image))
        return None

    def seek(self, index: int) -> None:
        self._pos = self._check_seek(index)


class WebcamSource(FrameSource):
    """A live camera. Timestamps are seconds since the source was opened (monotonic clock)."""

    kind = "webcam"

    def __init__(self, index: int, *, fps: Optional[float] = None,
                 resolution: Optional[tuple] = None, max_side: Optional[int] = None):
        super().__init__(max_side=max_side, loop=False)
        self.index = int(index)
        self.name = f"webcam {self.index}"
        cv2 = _cv2()
        if sys.platform.startswith("linux") and not os.path.exists(f"/dev/video{self.index}"):
            self._cap = None
        else:
            self._cap = cv2.VideoCapture(self.index)
        if self._cap is None or not self._cap.isOpened():
            if self._cap is not None:
                self._cap.release()
            found = list_webcams()
            have = f"available: {', '.join(map(str, found))}" if found else "no webcam was found"
            raise SourceError(f"Webcam {self.index} is not available ({have})")
        if resolution:
            w, h = resolution
            self._cap.set(cv2.CAP_PROP_FRAME_WIDTH, int(w))
            self._cap.set(cv2.CAP_PROP_FRAME_HEIGHT, int(h))
        if fps:
            self._cap.set(cv2.CAP_PROP_FPS, float(fps))
        cam_fps = self._cap.get(cv2.CAP_PROP_FPS)
        self.fps = float(fps or (cam_fps if cam_fps and 0 < cam_fps < 1000 else DEFAULT_FPS))
        self._t0 = time.monotonic()
        self._n = 0

    def read(self) -> Optional[Frame]:
        if self._closed:
            return None
        bgr = _read_bgr(self._cap)
        if bgr is None:
            self._warn(f"{self.name} stopped delivering frames (unplugged or busy?)")
            return None
        frame = Frame(index=self._n, timestamp=time.monotonic() - self._t0,
                      image=np.ascontiguousarray(_fit_max_side(_bgr_to_rgb(bgr), self.max_side)))
        self._n += 1
        return frame

    def close(self) -> None:
        super().close()
        self._cap.release()


def list_webcams(max_index: int = 8) -> list[int]:
    """Indices of webcams that open (probed quietly; on Linux only existing /dev/videoN)."""
    cv2 = _cv2()
    found = []
    for i in range(max_index):
        if sys.platform.startswith("linux") and not os.path.exists(f"/dev/video{i}"):
            continue
        cap = cv2.VideoCapture(i)
        try:
            if cap.isOpened():
                found.append(i)
        finally:
            cap.release()
    return found


def _webcam_index(spec) -> Optional[int]:
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return int(spec)
    if isinstance(spec, str):
        s = spec.strip()
        if s.lower().startswith("webcam:"):
            rest = s.split(":", 1)[1].strip()
            if not rest.isdigit():
                raise SourceError(f"Bad webcam spec {spec!r}: expected webcam:N with N a number")
            return int(rest)
        if s.isdigit() and not os.path.exists(s):
            return int(s)
    return None


def open_source(spec, *, fps: Optional[float] = None, size=None, loop: bool = False,
                max_side: Optional[int] = None, resolution: Optional[tuple] = None) -> FrameSource:
    """Open a webcam (int, "N" or "webcam:N"), an image folder / single image, or a video file.

    fps: frame rate for folders (default 30), requested rate for webcams, fallback for videos
         whose container has none (a video's own timing always wins).
    size: an int = resize frames so their longer side is at most that (like `max_side`); a
          (width, height) pair = requested webcam capture resolution (files: longer side at most
          max(width, height)).
    loop: files restart at the end (timestamps keep increasing).
    """
    if size is not None:
        if isinstance(size, (int, np.integer)):
            max_side = max_side or int(size)
        else:
            w, h = (int(v) for v in size)
            resolution = resolution or (w, h)
    if max_side is not None and max_side <= 0:
        raise SourceError(f"Maximum frame side must be positive, got {max_side}")
    cam = _webcam_index(spec)
    if cam is not None:
        return WebcamSource(cam, fps=fps, resolution=resolution, max_side=max_side)
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        raise SourceError("No input given: choose a webcam, a video file or an image folder")
    path = Path(os.path.expanduser(str(spec)))
    if resolution and max_side is None:
        max_side = max(resolution)   # files: fit in the box (aspect kept)
    if path.is_dir():
        return FolderSource(path, fps=fps, max_side=max_side, loop=loop)
    if path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS:
        return FolderSource(path, fps=fps, max_side=max_side, loop=loop)
    if not path.exists():
        raise SourceError(f"Input not found: {path}")
    return VideoSource(path, fps=fps, max_side=max_side, loop=loop)
