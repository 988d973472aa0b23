"""Reviewing a run (no Qt): a session folder read frame by frame for a timeline, and the picking
maths of the viewer's click tools.

`SessionTimeline(folder)` reads a session store lazily — the frame files present now (a live run
keeps adding them; `refresh()` rescans, `scan_in_background()` rescans on a worker thread so a
viewer's live timeline never lists tens of thousands of files on its GUI thread), one result at a
time with a small LRU cache, and the events — so scrubbing a long or still-running session never
loads it whole. It holds the folder (engine/io/lease.py) until `close()` (or until it is
garbage-collected, or its process ends): retention in any process leaves a session on screen alone.

`frames_up_to(indices, n, mode)` says which stored frames a timeline position shows:
"accumulated" = every frame up to n; "current" = only frame n's points (the cameras up to n stay).

`pick_nearest(screen_xy, depth, click, radius)`: the front-most of the projected points within
`radius` pixels of a click (what a user means by clicking a point).

`pick_frustum(apex_xy, corners_xy, depth, click, radius)`: the front-most camera whose drawn
frustum the click hits -- inside its image rectangle (where its thumbnail is drawn) or within
`radius` pixels of one of its eight edges -- so a camera is clicked where the user sees it, not
only at its centre. `place(local, mats)` puts per-camera points in the world (the frame transform
of each camera, as the viewer draws them).
"""
from __future__ import annotations

import collections
import concurrent.futures
import os
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from .io.lease import hold_session
from .io.store import FRAME_DIGITS, StoreError, _result_from_npz, read_events

MODES = ("accumulated", "current")


def frame_indices(folder: Union[str, Path]) -> list[int]:
    """Sorted indices of a session's frame files (names only: one directory listing, no Path
    object per file); none when the folder is gone (a run that stored nothing is removed)."""
    n = FRAME_DIGITS + len(".npz")
    out = []
    try:
        with os.scandir(Path(folder) / "frames") as it:
            for e in it:
                name = e.name
                if len(name) == n and name.endswith(".npz") and name[:FRAME_DIGITS].isdigit():
                    out.append(int(name[:FRAME_DIGITS]))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out.sort()
    return out


_SCAN_POOL: Optional[concurrent.futures.ThreadPoolExecutor] = None


def _scan_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _SCAN_POOL
    if _SCAN_POOL is None:
        _SCAN_POOL = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="timeline-scan")
    return _SCAN_POOL


class SessionTimeline:
    """Lazy, refreshable access to a session folder's frames (see the module docstring)."""

    def __init__(self, folder: Union[str, Path], cache_frames: int = 64):
        self.folder = Path(folder).expanduser()
        if not (self.folder / "frames").is_dir():
            raise StoreError(f"{self.folder} is not a session folder (no frames/)")
        self._lease = hold_session(self.folder, role="review")
        self._cache: "collections.OrderedDict[int, object]" = collections.OrderedDict()
        self.cache_frames = int(cache_frames)
        self.indices: list[int] = []
        self.refresh()

    def refresh(self) -> list[int]:
        """Rescan the frame files (a live run adds them); returns the sorted frame indices."""
        self.indices = frame_indices(self.folder)
        return self.indices

    def scan_in_background(self) -> "concurrent.futures.Future":
        """The sorted frame indices, listed on the one scan thread; the caller applies them with
        `self.indices = future.result()` on its own thread (the future raises what the scan
        raised, e.g. OSError when the folder went away)."""
        return _scan_pool().submit(frame_indices, self.folder)

    def __len__(self) -> int:
        return len(self.indices)

    def close(self) -> None:
        """Let go of the folder (retention may remove it again); idempotent."""
        self._lease.release()
        self._cache.clear()

    def __enter__(self) -> "SessionTimeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def result(self, index: int):
        """The stored FrameResult of frame `index` (None if it is missing or unreadable)."""
        if index in self._cache:
            self._cache.move_to_end(index)
            return self._cache[index]
        p = self.folder / "frames" / f"{int(index):0{FRAME_DIGITS}d}.npz"
        try:
            with np.load(p, allow_pickle=False) as z:
                r = _result_from_npz(z)
        except (OSError, ValueError, KeyError, EOFError):
            return None
        self._cache[index] = r
        while len(self._cache) > self.cache_frames:
            self._cache.popitem(last=False)
        return r

    def events(self) -> list:
        """The engine events recorded so far (damaged lines skipped)."""
        return read_events(self.folder)


def frames_up_to(indices: Sequence[int], n: int, mode: str = "accumulated") -> tuple[list[int], list[int]]:
    """(frames whose cameras show, frames whose points show) at timeline frame `n`."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    cams = [i for i in indices if i <= n]
    pts = cams if mode == "accumulated" else [i for i in cams if i == (cams[-1] if cams else None)]
    return cams, pts


def pick_nearest(screen_xy: np.ndarray, depth: np.ndarray, click: Sequence[float],
                 radius: float = 8.0) -> Optional[int]:
    """Index of the front-most (smallest `depth`, > 0) point whose screen position lies within
    `radius` pixels of `click`; None if there is none."""
    xy = np.asarray(screen_xy, np.float64).reshape(-1, 2)
    d = np.asarray(depth, np.float64).reshape(-1)
    if not len(xy):
        return None
    r2 = ((xy - np.asarray(click, np.float64)[None, :2]) ** 2).sum(axis=1)
    ok = np.flatnonzero((r2 <= radius * radius) & (d > 0) & np.isfinite(d))
    if not len(ok):
        return None
    return int(ok[np.argmin(d[ok])])


def place(local: np.ndarray, mats: np.ndarray) -> np.ndarray:
    """World positions [N,K,3] of points `local` [N,K,3] of N cameras, each moved by its 4x4 `mats` [N]."""
    local = np.asarray(local, np.float64)
    mats = np.asarray(mats, np.float64)
    return np.einsum("nij,nkj->nki", mats[:, :3, :3], local) + mats[:, None, :3, 3]


def _segment_distance(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance of point p [2] to segments a-b ([..., 2] each)."""
    ab = b - a
    t = np.clip(((p - a) * ab).sum(-1) / np.maximum((ab * ab).sum(-1), 1e-12), 0.0, 1.0)
    return np.linalg.norm(a + t[..., None] * ab - p, axis=-1)


def pick_frustum(apex_xy: np.ndarray, corners_xy: np.ndarray, depth: np.ndarray, click: Sequence[float],
                 radius: float = 6.0) -> Optional[int]:
    """Index of the front-most camera (smallest `depth` > 0) whose projected frustum the click
    hits: inside the quadrilateral of its image corners `corners_xy` [N,4,2] (TL, TR, BR, BL, any
    winding) or within `radius` pixels of an edge (apex to each corner, and the rectangle);
    `apex_xy` [N,2]. None when no frustum is hit."""
    apex = np.asarray(apex_xy, np.float64).reshape(-1, 2)
    quad = np.asarray(corners_xy, np.float64).reshape(-1, 4, 2)
    d = np.asarray(depth, np.float64).reshape(-1)
    if not len(apex):
        return None
    p = np.asarray(click, np.float64)[:2]
    nxt = np.roll(quad, -1, axis=1)
    # inside a convex quadrilateral: the same side of its four edges (either winding)
    cross = ((nxt - quad)[..., 0] * (p - quad)[..., 1] - (nxt - quad)[..., 1] * (p - quad)[..., 0])
    inside = (cross >= 0).all(axis=1) | (cross <= 0).all(axis=1)
    near_rect = _segment_distance(p, quad, nxt).min(axis=1) <= radius
    near_rays = _segment_distance(p, apex[:, None, :], quad).min(axis=1) <= radius
    finite = np.isfinite(quad).all(axis=(1, 2)) & np.isfinite(apex).all(axis=1) & np.isfinite(d)
    ok = np.flatnonzero((inside | near_rect | near_rays) & finite & (d > 0))
    if not len(ok):
        return None
    return int(ok[np.argmin(d[ok])])
