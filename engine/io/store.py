"""The crash-safe session store: every run writes its results to a folder as they arrive.

Layout of a session folder:
    config.json          settings used, source, engine, start (and, once closed, end) time
    frames/NNNNNN.npz    one small file per result, written atomically: c2w, K, timestamp,
                         index, is_keyframe, segment, pose_enc (if any), the colour image (JPEG
                         bytes `image_jpeg`, quality 95; raw `image` with image_codec="raw"),
                         depth and confidence as float16 — by default at the engine's full
                         result resolution, so exports have the density the viewer drew
                         (`max_side` > 0 downsamples them, K rescaled; old sessions kept 256 px)

Size vs density (ICL sample clip, 200 frames at 640x480, 9 with depth; docs/benchmarks_io.md):
256 px float32 + raw image 15.0 MB, exports 64 % of the points drawn; full resolution float16 +
JPEG about 13 MB, 100 %. Depth as float16 keeps 11 significant bits (0.05 % relative).
    events.jsonl         one JSON object per engine event, appended and flushed per event

A crash or kill loses at most the frame being written: frame files only ever appear complete
(temp file + rename) and `load_session` skips a damaged file or a half-written last event line.
"""
from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import socket
import threading
import time
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Union

import numpy as np

from .. import envs
from ..api import EngineError, EngineEvent, FrameResult, SessionConfig
from .atomic import OutputError, atomic_open

FORMAT_VERSION = 2          # 2: float16 depth/conf, JPEG images, full resolution (1 still reads)
IMAGE_JPEG_QUALITY = 95
_F16_MAX = float(np.finfo(np.float16).max)
FRAME_DIGITS = 6
RUNNING_FILE = "running.lock"      # present while a store is open: "<pid> <host>" (retention skips it)
STALE_TMP_S = 60.0                 # temp files older than this are leftovers of a killed writer


class StoreError(EngineError):
    """A session folder cannot be created or read."""


# --- where sessions live ----------------------------------------------------------------------

def default_session_root() -> Path:
    """$RECONSTUDIO_SESSIONS, else $XDG_DATA_HOME/reconstudio/sessions, else
    ~/.local/share/reconstudio/sessions."""
    env = envs.get("RECONSTUDIO_SESSIONS")
    if env is not None:
        return env
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "reconstudio" / "sessions"


def new_session_folder(source_name: str, root: Union[str, Path, None] = None) -> Path:
    """A fresh, not yet existing folder `<root>/<YYYYmmdd-HHMMSS>_<source>` (suffixed if taken)."""
    root = Path(root).expanduser() if root else default_session_root()
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(str(source_name)).stem or "session").strip("._") or "session"
    base = f"{datetime.now().strftime('%Y%m%d-%H%M%S')}_{stem[:60]}"
    folder, n = root / base, 1
    while folder.exists():
        n += 1
        folder = root / f"{base}_{n}"
    return folder


# --- downsampling -----------------------------------------------------------------------------

def _target_size(h: int, w: int, max_side: int) -> tuple[int, int]:
    s = min(1.0, max_side / max(h, w)) if max_side else 1.0
    return max(1, round(h * s)), max(1, round(w * s))


def scale_K(K: np.ndarray, src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> np.ndarray:
    """Intrinsics for an image resized from src_hw to dst_hw (pixel-centre convention)."""
    sy, sx = dst_hw[0] / src_hw[0], dst_hw[1] / src_hw[1]
    K = np.asarray(K, dtype=np.float64).copy()
    K[0, 0] *= sx
    K[0, 1] *= sx
    K[1, 1] *= sy
    K[0, 2] = (K[0, 2] + 0.5) * sx - 0.5
    K[1, 2] = (K[1, 2] + 0.5) * sy - 0.5
    return K


def _resize(a: np.ndarray, hw: tuple[int, int], nearest: bool) -> np.ndarray:
    if a.shape[:2] == hw:
        return a
    import cv2
    interp = cv2.INTER_NEAREST if nearest else cv2.INTER_AREA
    return cv2.resize(a, (hw[1], hw[0]), interpolation=interp)


def downsample_result(r: FrameResult, max_side: int) -> FrameResult:
    """A copy of `r` whose image/depth/conf have their longer side at most `max_side`.
    Depth and confidence use nearest neighbour (no averaging across depth edges); the image is
    resized to the depth's size when both exist, so every stored array shares one K."""
    ref = r.depth if r.depth is not None else np.asarray(r.image)
    src = ref.shape[:2]
    dst = _target_size(*src, max_side)
    image = np.asarray(r.image)
    image = _resize(image, dst, nearest=False) if image.size else image
    return FrameResult(
        index=int(r.index), timestamp=float(r.timestamp), is_keyframe=bool(r.is_keyframe),
        c2w=np.asarray(r.c2w, dtype=np.float64), K=scale_K(r.K, src, dst),
        image=np.ascontiguousarray(image, dtype=np.uint8),
        depth=None if r.depth is None else _resize(np.asarray(r.depth, np.float32), dst, nearest=True),
        conf=None if r.conf is None else _resize(np.asarray(r.conf, np.float32), dst, nearest=True),
        pose_enc=None if r.pose_enc is None else np.asarray(r.pose_enc, np.float32),
        segment=int(r.segment))


# --- (de)serialisation ------------------------------------------------------------------------

def _event_to_json(e: EngineEvent) -> dict:
    transform, message = e.transform, str(e.message or "")
    if transform is not None:
        try:
            transform = np.asarray(transform, dtype=np.float64).reshape(4, 4).tolist()
        except (TypeError, ValueError):
            # not a 4x4 matrix (e.g. text passed positionally): keep the text, never fail the run
            message = message or str(transform)
            transform = None
    d = {"kind": str(e.kind), "segment": int(e.segment), "transform": transform,
         "message": message, "time": time.time()}
    frames = getattr(e, "frames", None)
    if frames is not None:   # a "realign" limited to a frame range (engine.api.EngineEvent)
        d["frames"] = [int(frames[0]), int(frames[1])]
    return d


def _event_from_json(d: dict) -> EngineEvent:
    t = d.get("transform")
    return EngineEvent(kind=str(d["kind"]), segment=int(d.get("segment", 0)),
                       transform=None if t is None else np.asarray(t, dtype=np.float64).reshape(4, 4),
                       message=str(d.get("message", "")),
                       frames=None if d.get("frames") is None else (int(d["frames"][0]), int(d["frames"][1])))


def _encode_jpeg(image: np.ndarray) -> np.ndarray:
    import cv2
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR),
                           [cv2.IMWRITE_JPEG_QUALITY, IMAGE_JPEG_QUALITY])
    if not ok:
        raise StoreError("could not encode a frame image as JPEG")
    return buf.reshape(-1)


def _decode_jpeg(buf: np.ndarray) -> np.ndarray:
    import cv2
    img = cv2.imdecode(np.asarray(buf, np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError("undecodable JPEG image")
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def _to_f16(a) -> np.ndarray:
    """float16, saturating at its range instead of overflowing to inf (NaN stays NaN)."""
    return np.clip(np.asarray(a, np.float32), -_F16_MAX, _F16_MAX).astype(np.float16)


def _result_arrays(r: FrameResult, image_codec: str = "jpeg", depth_dtype: str = "float16") -> dict:
    arrays = {"c2w": np.asarray(r.c2w, np.float64), "K": np.asarray(r.K, np.float64),
              "timestamp": np.float64(r.timestamp), "index": np.int64(r.index),
              "is_keyframe": np.bool_(r.is_keyframe), "segment": np.int64(r.segment)}
    image = np.ascontiguousarray(r.image, np.uint8)
    if image_codec == "jpeg" and image.ndim == 3 and image.shape[2] == 3 and image.size:
        arrays["image_jpeg"] = _encode_jpeg(image)
    else:
        arrays["image"] = image
    f = _to_f16 if depth_dtype == "float16" else (lambda a: np.asarray(a, np.float32))
    if r.depth is not None:
        arrays["depth"] = f(r.depth)
    if r.conf is not None:
        arrays["conf"] = f(r.conf)
    if r.pose_enc is not None:
        arrays["pose_enc"] = np.asarray(r.pose_enc, np.float32)
    return arrays


def _save_npz(f, arrays: dict, compress: bool) -> None:
    """An .npz (readable by np.load) with fast deflate level 1: ~4x cheaper than
    np.savez_compressed's default level for nearly the same size, and the store runs on the
    engine's thread."""
    mode = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(f, "w", mode, compresslevel=1 if compress else None) as z:
        for name, a in arrays.items():
            with z.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(a), allow_pickle=False)


def _result_from_npz(z) -> FrameResult:
    return FrameResult(
        index=int(z["index"]), timestamp=float(z["timestamp"]), is_keyframe=bool(z["is_keyframe"]),
        c2w=z["c2w"], K=z["K"],
        image=_decode_jpeg(z["image_jpeg"]) if "image_jpeg" in z.files else z["image"],
        depth=z["depth"].astype(np.float32) if "depth" in z.files else None,
        conf=z["conf"].astype(np.float32) if "conf" in z.files else None,
        pose_enc=z["pose_enc"] if "pose_enc" in z.files else None,
        segment=int(z["segment"]))


# --- writer -----------------------------------------------------------------------------------

def store_writers_default() -> int:
    """Writer threads of a background store: RECONSTUDIO_STORE_WRITERS, else one per 4 CPU cores,
    1 to 3. Why several: one frame costs ~20-30 ms of deflate + JPEG (docs/benchmarks_io.md), so
    ONE writer caps a run near 30-40 frames/s -- below the H200's 518x378 engine (33 FPS; measured:
    `reconstudio run` 25.8 frames/s, the driver waiting on the full queue). zlib and OpenCV release
    the GIL, so writers overlap each other and the engine."""
    try:
        val = envs.get("RECONSTUDIO_STORE_WRITERS")
    except envs.EnvError as exc:
        raise StoreError(str(exc)) from None
    if val is not None:
        return val
    return max(1, min(3, (os.cpu_count() or 1) // 4))


class SessionStore:
    """Writes one session folder as results arrive (see the module docstring for the layout).

    `meta` is stored in config.json beside the settings (e.g. the source's kind, fps, frame
    count). `max_side` 0 (default) keeps the engine's result resolution; `image_codec` "jpeg"
    (default, ~1/5 the size of deflated raw pixels) or "raw"; `depth_dtype` "float16" (default)
    or "float32" for depth and confidence. `fsync=True` also survives power loss, at a cost per frame; a killed process loses
    nothing committed either way.

    By default `write` is synchronous: when it returns the frame is on disk (a few ms per
    frame, see docs/benchmarks_io.md). `background=True` moves compression and file writing to
    `writers` threads (default `store_writers_default`; zlib releases the GIL, so they overlap
    the engine and each other); `write` then only downsamples and queues, blocking when
    `queue_size` frames wait for their writer, so a kill loses at most those frames (per writer)
    plus the ones being written. A frame goes to the writer of its index (index mod writers), so a
    re-emitted index is written after the result it replaces. Writer errors surface on the next
    `write` or on `close`, which waits for the queues to drain.
    """

    def __init__(self, folder: Union[str, Path], config: SessionConfig, source_name: str,
                 max_side: int = 0, *, meta: Optional[dict] = None, fsync: bool = False,
                 compress: bool = True, background: bool = False, queue_size: int = 2,
                 image_codec: str = "jpeg", depth_dtype: str = "float16", writers: Optional[int] = None):
        self.folder = Path(folder).expanduser()
        self.frames_dir = self.folder / "frames"
        self.max_side = int(max_side or 0)
        self.image_codec = image_codec
        self.depth_dtype = depth_dtype
        if image_codec not in ("jpeg", "raw") or depth_dtype not in ("float16", "float32"):
            raise StoreError(f"unknown store encoding {image_codec!r} / {depth_dtype!r}")
        self.fsync = fsync
        self.compress = compress
        self.frames_written = 0
        self.events_written = 0
        created = not self.folder.exists()
        try:
            self._open_folder(config, source_name, meta)
        except BaseException:
            if created:                    # a failed start leaves no empty session folder
                import shutil
                shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self._created = created
        self._closed = False
        self._error: Optional[BaseException] = None
        self._queues: list = []            # one per writer thread (background stores)
        self._threads: list = []
        self._count_lock = threading.Lock()
        if background:
            n = store_writers_default() if writers is None else max(1, int(writers))
            self._queues = [queue.Queue(maxsize=max(1, int(queue_size))) for _ in range(n)]
            self._threads = [threading.Thread(target=self._writer, args=(q,), name=f"session-store-writer-{i}",
                                              daemon=True) for i, q in enumerate(self._queues)]
            for t in self._threads:
                t.start()

    def _open_folder(self, config: SessionConfig, source_name: str, meta: Optional[dict]) -> None:
        try:
            self.frames_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"Cannot create session folder {self.folder}: {exc.strerror or exc}") from None
        if any(self.frames_dir.iterdir()):
            raise StoreError(f"Session folder {self.folder} already holds a session; choose a new folder")
        self._info = {
            "format": "reconstudio-session", "version": FORMAT_VERSION,
            "source": str(source_name), "engine": config.engine,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "finished": None, "frames": None, "max_side": self.max_side,
            "image_codec": self.image_codec, "depth_dtype": self.depth_dtype,
            "config": _jsonable(config.to_dict()), "meta": _jsonable(meta or {}),
        }
        self._write_info()
        try:
            self._events = open(self.folder / "events.jsonl", "a", encoding="utf-8")
            (self.folder / RUNNING_FILE).write_text(f"{os.getpid()} {socket.gethostname()}\n")
        except OSError as exc:
            raise StoreError(f"Cannot write to session folder {self.folder}: {exc.strerror or exc}") from None

    def _write_info(self) -> None:
        try:
            with atomic_open(self.folder / "config.json", "w", fsync=self.fsync) as f:
                json.dump(self._info, f, indent=2)
        except OutputError as exc:
            raise StoreError(str(exc)) from None

    def frame_path(self, index: int) -> Path:
        return self.frames_dir / f"{int(index):0{FRAME_DIGITS}d}.npz"

    def write(self, r: FrameResult) -> None:
        """Store one result (downsampled), atomically; a re-emitted index replaces its file."""
        if self._closed:
            raise StoreError("session store is closed")
        self._raise_writer_error()
        small = downsample_result(r, self.max_side)
        if not self._queues:
            self._store(small)
            return
        # own copies: the engine may reuse its buffers while the frame waits in the queue
        for name in ("image", "depth", "conf"):
            a, src = getattr(small, name), getattr(r, name)
            if a is not None and src is not None and np.shares_memory(a, np.asarray(src)):
                setattr(small, name, a.copy())
        self._queues[int(small.index) % len(self._queues)].put(small)

    @property
    def writers(self) -> int:
        """Writer threads (0: a synchronous store)."""
        return len(self._threads)

    def _store(self, small: FrameResult) -> None:
        try:
            with atomic_open(self.frame_path(small.index), "wb", fsync=self.fsync) as f:
                _save_npz(f, _result_arrays(small, self.image_codec, self.depth_dtype), compress=self.compress)
        except OutputError as exc:
            raise StoreError(str(exc)) from None
        with self._count_lock:
            self.frames_written += 1

    def _writer(self, q: queue.Queue) -> None:
        while True:
            item = q.get()
            try:
                if item is None:
                    return
                if self._error is None:
                    self._store(item)
            except BaseException as exc:   # kept for the caller's thread; later frames are dropped
                self._error = exc
            finally:
                q.task_done()

    def _raise_writer_error(self) -> None:
        if self._error is not None:
            exc, self._error = self._error, None
            if isinstance(exc, StoreError):
                raise exc
            raise StoreError(f"Writing the session store failed: {exc}") from exc

    def write_event(self, e: EngineEvent) -> None:
        """Append one event line and flush it to the OS at once."""
        if self._closed:
            raise StoreError("session store is closed")
        try:
            self._events.write(json.dumps(_event_to_json(e)) + "\n")
            self._events.flush()
            if self.fsync:
                os.fsync(self._events.fileno())
        except OSError as exc:
            raise StoreError(f"Cannot write event to {self.folder}: {exc.strerror or exc}") from None
        self.events_written += 1

    def mark_cut_short(self, reason: str, frames_in: Optional[int] = None) -> None:
        """Record in config.json (at once) that the run ended before its input did: why, and after
        how many input frames. Every re-export and the GUI say so (`LoadedSession.cut_short`)."""
        self._info["cut_short"] = str(reason) or "cut short"
        if frames_in is not None:
            self._info["frames_in"] = int(frames_in)
        self._write_info()

    def close(self, discard_empty: bool = False) -> None:
        """Record the end time and frame count in config.json (a folder without them was cut short).
        `discard_empty`: a folder this store created and that got no frame is removed (a run that
        failed to start leaves nothing behind)."""
        if self._closed:
            return
        self._closed = True
        for q in self._queues:
            q.put(None)
        for t in self._threads:
            t.join()
        self._events.close()
        n = len(list(self.frames_dir.glob("*.npz")))
        if discard_empty and n == 0 and self._created and self._error is None:
            import shutil
            shutil.rmtree(self.folder, ignore_errors=True)
            return
        self._info["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._info["frames"] = n
        try:
            self._write_info()
        finally:
            with contextlib.suppress(OSError):
                (self.folder / RUNNING_FILE).unlink()
        self._raise_writer_error()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _jsonable(obj):
    """Settings as plain JSON (tuples → lists, numpy scalars → numbers, anything else → str)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


# --- reader -----------------------------------------------------------------------------------

@dataclass
class LoadedSession:
    folder: Path
    config: SessionConfig
    results: list                       # FrameResult (downsampled), sorted by index
    events: list                        # EngineEvent, in order
    info: dict = field(default_factory=dict)      # config.json: source, engine, started, finished, meta
    problems: list = field(default_factory=list)  # damaged files / lines that were skipped

    @property
    def complete(self) -> bool:
        """True if the run closed its store (False after a crash or kill)."""
        return bool(self.info.get("finished"))

    @property
    def source(self) -> str:
        return str(self.info.get("source", ""))

    @property
    def cut_short(self) -> str:
        """Why this session holds less than its run was asked for, "" if it does not: the reason
        its run recorded (interrupted, stopped, error), or a run that never closed its store."""
        if self.info.get("cut_short"):
            return str(self.info["cut_short"])
        if not self.complete:
            return "the run did not finish (killed or crashed); the frames stored up to then are kept"
        return ""


def clean_stale_temp_files(folder: Union[str, Path], min_age_s: float = STALE_TMP_S) -> int:
    """Remove the temp files a killed writer left in a session folder (`.NAME.*.tmp`, see
    engine.io.atomic); recent ones may belong to a writer still running and are kept."""
    from .atomic import TMP_SUFFIX
    folder = Path(folder)
    now = time.time()
    removed = 0
    for d in (folder, folder / "frames"):
        for p in d.glob(f".*{TMP_SUFFIX}") if d.is_dir() else ():
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime >= min_age_s:
                    p.unlink()
                    removed += 1
    return removed


def load_session(folder: Union[str, Path]) -> LoadedSession:
    """Reopen a session folder, tolerating what a crash leaves behind: a missing or damaged
    config.json, leftover temp files, an unreadable frame file, a half-written last event."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise StoreError(f"Session folder not found: {folder}")
    frames_dir = folder / "frames"
    if not frames_dir.is_dir() and not (folder / "config.json").exists():
        raise StoreError(f"{folder} is not a ReconStudio session folder (no config.json or frames/)")
    problems: list[str] = []
    info: dict = {}
    clean_stale_temp_files(folder)
    try:
        info = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        config = SessionConfig.from_dict(info.get("config", {}))
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        problems.append(f"config.json unreadable ({exc}); default settings assumed")
        config = SessionConfig()

    results = []
    for p in sorted(frames_dir.glob("*.npz")) if frames_dir.is_dir() else []:
        try:
            with np.load(p, allow_pickle=False) as z:
                r = _result_from_npz(z)
            results.append(r)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            problems.append(f"skipped damaged frame file {p.name} ({type(exc).__name__})")
    results.sort(key=lambda r: r.index)

    events = []
    ev_path = folder / "events.jsonl"
    if ev_path.exists():
        with open(ev_path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    events.append(_event_from_json(json.loads(line)))
                except (ValueError, KeyError, TypeError):
                    problems.append(f"skipped damaged event line {n}")
    return LoadedSession(folder=folder, config=config, results=results, events=events,
                         info=info, problems=problems)
