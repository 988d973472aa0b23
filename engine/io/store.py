"""The crash-safe session store: every run writes its results to a folder as they arrive.

Layout of a session folder:
    config.json          settings used, source, engine, start (and, once closed, end) time
    frames/NNNNNN.npz    one small file per result, written atomically: c2w, K, timestamp,
                         index, is_keyframe, segment, pose_enc (if any), the colour image (JPEG
                         bytes `image_jpeg`, quality 95, stored without deflate; raw `image`
                         with image_codec="raw"), depth and confidence as float16 -- by default
                         at the engine's full result resolution, so exports have the density
                         the viewer drew (`max_side` > 0 downsamples them, K rescaled)
    events.jsonl         one JSON object per engine event, appended and flushed per event
    running.lock         the lease file of the processes that have the folder open
                         (engine/io/lease.py; retention never removes a held folder)

Format versions (config.json "version"; every one still reads, `_result_from_npz`):
1: 256 px, float32 depth/conf `depth` / `conf`, raw `image`;
2: full resolution, float16 `depth` / `conf`, JPEG `image_jpeg`;
3: float16 depth/conf byte-shuffled: `depth_f16_planes` / `conf_f16_planes`, uint8 (2, h, w) =
   the high bytes of every value, then the low bytes. Neighbouring depths share their high byte
   (sign, exponent, top of the mantissa), so deflate sees long runs there and the noisy low bytes
   apart: smaller than deflating the interleaved float16 and cheaper to write
   (docs/benchmarks_io.md). float16 keeps 11 significant bits (0.05 % relative).

A crash or kill loses at most the frame being written: frame files only ever appear complete
(temp file + rename) and `load_session` skips a damaged file or a half-written last event line.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import re
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
from ..geometry import scale_intrinsics
from .atomic import OutputError, atomic_open
from .errors import StoreError
from .lease import LOCK_FILE, hold_session

SESSION_FORMAT = "reconstudio-session"    # config.json "format": the marker retention requires
FORMAT_VERSION = 3          # see the module docstring; 1 and 2 still read
IMAGE_JPEG_QUALITY = 95
_F16_MAX = float(np.finfo(np.float16).max)
FRAME_DIGITS = 6
RUNNING_FILE = LOCK_FILE           # held by every process that has the folder open (lease.py)
STALE_TMP_S = 60.0                 # temp files older than this are leftovers of a killed writer
DISK_FULL_REASON = "disk full"     # config.json "cut_short" of a session whose disk filled up
_DISK_FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


class DiskFullError(StoreError):
    """The session's disk (or the user's quota) is full. The store has closed itself: its writer
    threads ended, its files closed, its lease released, the session marked cut short ("disk
    full") where that could still be written; every frame stored before is kept."""


def is_disk_full(exc: Optional[BaseException]) -> bool:
    """`exc` (or an error it was raised from or during) is ENOSPC / EDQUOT."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFullError) or getattr(exc, "errno", None) in _DISK_FULL_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


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
        c2w=np.asarray(r.c2w, dtype=np.float64), K=scale_intrinsics(r.K, src, dst),
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


def shuffle_f16(a) -> np.ndarray:
    """float16 planes of format 3: uint8 (2, h, w), the high bytes of all values, then the low."""
    b = _to_f16(a).astype("<f2", copy=False).view(np.uint8).reshape(*np.shape(a), 2)
    return np.ascontiguousarray(np.moveaxis(b[..., ::-1], -1, 0))


def unshuffle_f16(planes: np.ndarray) -> np.ndarray:
    """float32 values of `shuffle_f16` planes."""
    p = np.asarray(planes, np.uint8)
    u = (p[0].astype(np.uint16) << 8) | p[1]
    return u.view(np.float16).astype(np.float32)


_PLANES = "_f16_planes"             # member suffix of a format-3 float16 plane pair
_STORED_MEMBERS = {"image_jpeg"}    # already compressed: deflating them costs time and saves nothing


def _result_arrays(r: FrameResult, image_codec: str = "jpeg", depth_dtype: str = "float16") -> dict:
    arrays = {"c2w": np.asarray(r.c2w, np.float64), "K": np.asarray(r.K, np.float64),
              "timestamp": np.float64(r.timestamp), "index": np.int64(r.index),
              "is_keyframe": np.bool_(r.is_keyframe), "segment": np.int64(r.segment)}
    image = np.ascontiguousarray(r.image, np.uint8)
    if image_codec == "jpeg" and image.ndim == 3 and image.shape[2] == 3 and image.size:
        arrays["image_jpeg"] = _encode_jpeg(image)
    else:
        arrays["image"] = image
    for name in ("depth", "conf"):
        a = getattr(r, name)
        if a is None:
            continue
        if depth_dtype == "float16":
            arrays[name + _PLANES] = shuffle_f16(a)
        else:
            arrays[name] = np.asarray(a, np.float32)
    if r.pose_enc is not None:
        arrays["pose_enc"] = np.asarray(r.pose_enc, np.float32)
    return arrays


def _save_npz(f, arrays: dict, compress: bool) -> None:
    """An .npz (readable by np.load) with fast deflate level 1: far cheaper than
    np.savez_compressed's default level for nearly the same size (docs/benchmarks_io.md), and the
    store runs beside the engine. JPEG bytes are stored as they are."""
    mode = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(f, "w", mode, compresslevel=1 if compress else None) as z:
        for name, a in arrays.items():
            member = f"{name}.npy"
            if name in _STORED_MEMBERS:
                member = zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0))
                member.compress_type = zipfile.ZIP_STORED
            with z.open(member, "w", force_zip64=True) as out:
                np.lib.format.write_array(out, np.asanyarray(a), allow_pickle=False)


def _plane(z, name: str) -> Optional[np.ndarray]:
    """Depth or confidence as float32 from any format: shuffled float16 planes (3), float16 (2)
    or float32 (1); None when the frame has none."""
    if name + _PLANES in z.files:
        return unshuffle_f16(z[name + _PLANES])
    if name in z.files:
        return z[name].astype(np.float32)
    return None


def _result_from_npz(z) -> FrameResult:
    return FrameResult(
        index=int(z["index"]), timestamp=float(z["timestamp"]), is_keyframe=bool(z["is_keyframe"]),
        c2w=z["c2w"], K=z["K"],
        image=_decode_jpeg(z["image_jpeg"]) if "image_jpeg" in z.files else z["image"],
        depth=_plane(z, "depth"), conf=_plane(z, "conf"),
        pose_enc=z["pose_enc"] if "pose_enc" in z.files else None,
        segment=int(z["segment"]))


# --- writer -----------------------------------------------------------------------------------

def store_writers_default() -> int:
    """Writer threads of a background store: RECONSTUDIO_STORE_WRITERS, else one per 4 CPU cores,
    1 to 3. Why several: deflate + JPEG of one frame take tens of milliseconds
    (docs/benchmarks_io.md), so ONE writer can cap a run below a GPU engine's frame rate (the
    driver then waits on the full queue). zlib and OpenCV release the GIL, so writers overlap each
    other and the engine."""
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

    The store holds the folder's lease (engine/io/lease.py) from its start to `close`, so no
    retention in any process removes it meanwhile. A full disk (ENOSPC / EDQUOT) raises
    `DiskFullError` from the call that meets it and ends the store there: writers stopped (frames
    still queued are dropped), files closed, lease released, config.json marked cut short "disk
    full" when that still fits; later `mark_cut_short` / `close` calls change nothing.
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
        self.disk_full = False             # the store ended because its disk filled (DiskFullError)
        self._lease = None
        self._events = None
        self._opened = False               # the folder is set up (frames may be kept from here on)
        created = not self.folder.exists()
        try:
            self._open_folder(config, source_name, meta)
        except BaseException:
            self._release()
            if created:                    # a failed start leaves no empty session folder
                import shutil
                shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self._created = created
        self._opened = True
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

    def _os_error(self, what: str, exc: BaseException) -> StoreError:
        """StoreError for a failed write; DiskFullError when the disk (or quota) is full."""
        why, e = str(exc), exc
        while e is not None:           # the OS's own words ("No space left on device"), if any
            if getattr(e, "strerror", None):
                why = e.strerror
                break
            e = e.__cause__ or e.__context__
        if is_disk_full(exc):
            kept = (f"; the session {self.folder} keeps the {self.frames_written} frames stored before"
                    if self._opened else "")
            return DiskFullError(f"disk full: {what} ({why}){kept}")
        return StoreError(f"{what}: {why}")

    def _open_folder(self, config: SessionConfig, source_name: str, meta: Optional[dict]) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            # held before config.json exists: retention never sees this session unheld
            self._lease = hold_session(self.folder, role="store", strict=True)
            self.frames_dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise self._os_error(f"Cannot create session folder {self.folder}", exc) from None
        if any(self.frames_dir.iterdir()):
            raise StoreError(f"Session folder {self.folder} already holds a session; choose a new folder")
        self._info = {
            "format": SESSION_FORMAT, "version": FORMAT_VERSION,
            "source": str(source_name), "engine": config.engine,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "finished": None, "frames": None, "max_side": self.max_side,
            "image_codec": self.image_codec, "depth_dtype": self.depth_dtype,
            "config": _jsonable(config.to_dict()), "meta": _jsonable(meta or {}),
        }
        self._write_info()
        try:
            self._events = open(self.folder / "events.jsonl", "a", encoding="utf-8")
        except OSError as exc:
            raise self._os_error(f"Cannot write to session folder {self.folder}", exc) from None

    def _write_info(self) -> None:
        try:
            with atomic_open(self.folder / "config.json", "w", fsync=self.fsync) as f:
                json.dump(self._info, f, indent=2)
        except OutputError as exc:
            raise self._os_error(f"Cannot write {self.folder / 'config.json'}", exc) from None

    def frame_path(self, index: int) -> Path:
        return self.frames_dir / f"{int(index):0{FRAME_DIGITS}d}.npz"

    def write(self, r: FrameResult) -> None:
        """Store one result (downsampled), atomically; a re-emitted index replaces its file."""
        self._check_open()
        self._raise_writer_error()
        small = downsample_result(r, self.max_side)
        if not self._queues:
            try:
                self._store(small)
            except DiskFullError as exc:
                self._end_disk_full(exc)
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
        except (OutputError, OSError) as exc:
            raise self._os_error(f"Cannot write frame {small.index} in {self.frames_dir}", exc) from None
        with self._count_lock:
            self.frames_written += 1

    def _writer(self, q: queue.Queue) -> None:
        while True:
            item = q.get()
            try:
                if item is None:
                    return
                if self._error is None and not self.disk_full:
                    self._store(item)
            except BaseException as exc:   # kept for the caller's thread; later frames are dropped
                self._error = exc
            finally:
                q.task_done()

    def _check_open(self) -> None:
        if self._closed:
            raise (DiskFullError if self.disk_full else StoreError)(
                "session store is closed" + (" (disk full)" if self.disk_full else ""))

    def _raise_writer_error(self) -> None:
        if self._error is not None:
            exc, self._error = self._error, None
            if isinstance(exc, DiskFullError):
                self._end_disk_full(exc)
            if isinstance(exc, StoreError):
                raise exc
            raise StoreError(f"Writing the session store failed: {exc}") from exc

    def _stop_writers(self) -> None:
        for q in self._queues:
            q.put(None)
        for t in self._threads:
            t.join()

    def _release(self) -> None:
        if self._events is not None:
            with contextlib.suppress(OSError):
                self._events.close()
        if self._lease is not None:
            self._lease.release()

    def _end_disk_full(self, exc: DiskFullError) -> None:
        """The disk is full: end the store at once (writers stop and drop what they hold, files
        closed, lease released), mark the session "disk full" if that still fits, raise `exc`."""
        self.disk_full = True
        if not self._closed:
            self._closed = True
            self._stop_writers()
            self._info["cut_short"] = DISK_FULL_REASON
            self._info["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            self._info["frames"] = len(list(self.frames_dir.glob("*.npz")))
            with contextlib.suppress(StoreError):   # best effort: it may not fit either
                self._write_info()
            self._release()
        raise exc

    def write_event(self, e: EngineEvent) -> None:
        """Append one event line and flush it to the OS at once."""
        self._check_open()
        if isinstance(self._error, DiskFullError):
            self._raise_writer_error()
        try:
            self._events.write(json.dumps(_event_to_json(e)) + "\n")
            self._events.flush()
            if self.fsync:
                os.fsync(self._events.fileno())
        except OSError as exc:
            err = self._os_error(f"Cannot write event to {self.folder}", exc)
            if isinstance(err, DiskFullError):
                self._end_disk_full(err)
            raise err from None
        self.events_written += 1

    def mark_cut_short(self, reason: str, frames_in: Optional[int] = None) -> None:
        """Record in config.json (at once) that the run ended before its input did: why, and after
        how many input frames. Every re-export and the GUI say so (`LoadedSession.cut_short`).
        A store its full disk ended keeps "disk full" as the reason."""
        if self.disk_full:
            return
        self._info["cut_short"] = str(reason) or "cut short"
        if frames_in is not None:
            self._info["frames_in"] = int(frames_in)
        try:
            self._write_info()
        except DiskFullError as exc:
            if not self._closed:
                self._end_disk_full(exc)
            raise

    def close(self, discard_empty: bool = False) -> None:
        """Record the end time and frame count in config.json (a folder without them was cut short).
        `discard_empty`: a folder this store created and that got no frame is removed (a run that
        failed to start leaves nothing behind). Raises DiskFullError (the store closed all the
        same) when the disk filled while the last frames were written."""
        if self._closed:
            return
        self._closed = True
        try:
            self._stop_writers()
            with contextlib.suppress(OSError):
                self._events.close()
            n = len(list(self.frames_dir.glob("*.npz")))
            if discard_empty and n == 0 and self._created and self._error is None:
                import shutil
                shutil.rmtree(self.folder, ignore_errors=True)
                return
            if isinstance(self._error, DiskFullError):
                self.disk_full = True
                self._info["cut_short"] = DISK_FULL_REASON
            self._info["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            self._info["frames"] = n
            try:
                self._write_info()
            except DiskFullError:
                self.disk_full = True
                raise
        finally:
            self._release()
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


def read_events(folder: Union[str, Path], problems: Optional[list] = None) -> list:
    """The engine events of a session folder's events.jsonl, in order. A damaged line (a kill
    mid-write leaves half a last line) is skipped and, with `problems`, named there."""
    events = []
    ev_path = Path(folder) / "events.jsonl"
    if not ev_path.exists():
        return events
    with open(ev_path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                events.append(_event_from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                if problems is not None:
                    problems.append(f"skipped damaged event line {n}")
    return events


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


def session_folder(folder: Union[str, Path]) -> Path:
    """`folder` as a Path, or StoreError when it does not exist or is not a session folder."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise StoreError(f"Session folder not found: {folder}")
    if not (folder / "frames").is_dir() and not (folder / "config.json").exists():
        raise StoreError(f"{folder} is not a ReconStudio session folder (no config.json or frames/)")
    return folder


def read_header(folder: Path) -> tuple[dict, SessionConfig, list]:
    """(config.json's contents, the session's settings, problems) of an existing session folder,
    after cleaning a killed writer's temp files: a missing or damaged config.json gives default
    settings and a problem line, never an error."""
    problems: list[str] = []
    info: dict = {}
    clean_stale_temp_files(folder)
    try:
        info = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        config = SessionConfig.from_dict(info.get("config", {}))
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        problems.append(f"config.json unreadable ({exc}); default settings assumed")
        config = SessionConfig()
    return info, config, problems


def load_session(folder: Union[str, Path]) -> LoadedSession:
    """Reopen a session folder, tolerating what a crash leaves behind: a missing or damaged
    config.json, leftover temp files, an unreadable frame file, a half-written last event.
    The folder is held (engine/io/lease.py) while it is read: retention cannot remove it midway."""
    folder = session_folder(folder)
    frames_dir = folder / "frames"
    with hold_session(folder, role="read"):
        info, config, problems = read_header(folder)

        results = []
        for p in sorted(frames_dir.glob("*.npz")) if frames_dir.is_dir() else []:
            try:
                with np.load(p, allow_pickle=False) as z:
                    r = _result_from_npz(z)
                results.append(r)
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
                problems.append(f"skipped damaged frame file {p.name} ({type(exc).__name__})")
        results.sort(key=lambda r: r.index)

        events = read_events(folder, problems)
        return LoadedSession(folder=folder, config=config, results=results, events=events,
                             info=info, problems=problems)
