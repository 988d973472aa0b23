"""Read a session for export one frame at a time: memory bounded by one frame, not the session.

`open_frames(source)` gives a `FrameReader` over a session folder (or an in-memory list of
FrameResults, the same interface):

    reader.poses          one `FramePose` per stored frame, sorted by index: index, timestamp,
                          c2w (re-alignments applied), K, is_keyframe, segment, has_depth. Read
                          from the frame files' small members only (np.load of an .npz is lazy
                          per member), so a trajectory never inflates an image or a depth map.
    reader.frame(pose)    the full FrameResult of one pose (decoded through the store's own
                          `_result_from_npz`, so every store format reads), re-alignment applied
    reader.frames(poses)  those, one at a time (a generator: the previous frame is garbage)

A damaged frame file is skipped while the poses are read (and named in `reader.problems`, as
`load_session` does); one that fails later, when its arrays are decoded, raises StoreError naming it.

Session edits (engine/io/edits.py: crop, outlier removal, floor, metric scale) are applied here,
after the re-alignments, so every export honours them: a session folder's own `edits.json` by
default, other edits or none with `edits=` (`reader.set_edits`). Poses and frames come out moved by
the edits' similarity; a frame's dropped points have depth 0 (no depth).
"""
from __future__ import annotations

import dataclasses
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np

from ..api import FrameResult, SessionConfig
from ..geometry import apply_similarity, backproject, result_transforms

_POSE_MEMBERS = ("index", "timestamp", "c2w", "K", "is_keyframe", "segment")
_READ_ERRORS = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)
POSE_READERS = 4            # threads reading poses: inflate releases the GIL (docs/benchmarks_io.md)
STORED_EDITS = "stored"     # `edits=`: the session folder's own edits.json (none if it has none)
EDIT_MASK_CACHE_BYTES = 64 << 20   # the edits' per-frame keep masks kept (bit-packed): an export reads
                                   # each frame once per format / NPZ member, the test is done once


@dataclasses.dataclass
class FramePose:
    """What a trajectory needs of a frame (and where to find the rest)."""
    index: int
    timestamp: float
    c2w: np.ndarray
    K: np.ndarray
    is_keyframe: bool
    segment: int
    has_depth: bool
    key: object = None                         # the frame file (folder) or list position
    transform: Optional[np.ndarray] = None     # its re-alignment similarity (None: none)
    depth: None = None                         # lets geometry.apply_similarity move a pose


def _has_plane(files: Sequence[str], name: str) -> bool:
    """The frame stores this plane in any of the store's encodings (`depth`, `depth_<codec>`)."""
    return any(f == name or f.startswith(name + "_") for f in files)


# numpy parses each member's .npy header with ast.literal_eval, and CPython 3.11's AST
# constructor is not thread-safe: POSE_READERS threads parsing at once raised "SystemError: AST
# constructor recursion depth mismatch" (seen once in a full test run). The pose members are a few
# scalars and small matrices, so reading them one thread at a time costs little; opening the files
# and reading their zip directories still overlap.
_MEMBER_PARSE = threading.Lock()


def read_pose(path: Path) -> FramePose:
    """The pose members of one frame file, without touching its image, depth or confidence."""
    with np.load(path, allow_pickle=False) as z:
        with _MEMBER_PARSE:
            v = {name: z[name] for name in _POSE_MEMBERS}
        has_depth = _has_plane(z.files, "depth")
    return FramePose(index=int(v["index"]), timestamp=float(v["timestamp"]),
                     c2w=np.asarray(v["c2w"], np.float64).reshape(4, 4),
                     K=np.asarray(v["K"], np.float64).reshape(3, 3), is_keyframe=bool(v["is_keyframe"]),
                     segment=int(v["segment"]), has_depth=has_depth, key=path)


class FrameReader:
    """Poses of every frame up front (small), whole frames on demand; see the module docstring."""

    def __init__(self, poses: list, events: Sequence, info: Optional[dict] = None,
                 config: Optional[SessionConfig] = None, folder: Optional[Path] = None,
                 problems: Optional[list] = None, results: Optional[Sequence] = None, edits=None):
        self.events = list(events)
        self.info = dict(info or {})
        self.config = config
        self.folder = folder
        self.problems = list(problems or [])
        self._results = results
        poses.sort(key=lambda p: p.index)
        Ts = result_transforms([(p.segment, p.index) for p in poses], self.events) if poses else []
        self.placed = [p if T is None else dataclasses.replace(apply_similarity(p, T), transform=T)
                       for p, T in zip(poses, Ts)]      # re-aligned, before the edits
        self.set_edits(edits)

    def set_edits(self, edits) -> None:
        """Apply these engine.io.edits.SessionEdits from now on (None or empty: the raw session)."""
        self.edits = edits if edits is not None and not edits.empty else None
        self._outlier_model = None
        self._masks: dict = {}                 # frame index -> bit-packed keep mask of its valid pixels
        self._mask_bytes = 0
        S = self.edits.similarity() if self.edits is not None else None
        self.poses = (list(self.placed) if S is None else
                      [dataclasses.replace(apply_similarity(p, S), transform=p.transform) for p in self.placed])

    def __len__(self) -> int:
        return len(self.poses)

    def frame(self, pose: FramePose) -> FrameResult:
        """The FrameResult of `pose` (one of `self.poses`): re-aligned, then edited."""
        r = self._placed_frame(pose)
        if self.edits is None:
            return r
        if self.edits.removes_points and r.depth is not None:
            r = self._drop_points(r)
        S = self.edits.similarity()
        return r if S is None else apply_similarity(r, S)

    def keep_mask(self, points) -> "np.ndarray":
        """Which of these world points (re-aligned, before the edits' similarity: as the viewer
        draws the session) the edits keep (all without edits)."""
        if self.edits is None:
            return np.ones(len(points), bool)
        return self.edits.keep_mask(points, self.outlier_model())

    def outlier_model(self):
        """The edits' outlier statistics over this session (built on first use: one pass over
        the frames), or None without outlier removal."""
        if self.edits is None or self.edits.outliers is None:
            return None
        if self._outlier_model is None:
            from .edits import fit_outliers
            with_depth = [p for p in self.placed if p.has_depth]
            self._outlier_model = fit_outliers((self._placed_frame(p) for p in with_depth), len(with_depth),
                                               self.edits)
        return self._outlier_model

    def _drop_points(self, r: FrameResult) -> FrameResult:
        d = np.asarray(r.depth)
        valid = np.isfinite(d) & (d > 0)
        n = int(np.count_nonzero(valid))
        packed = self._masks.get(int(r.index))
        if packed is not None and packed[0] == n:
            keep = np.unpackbits(packed[1], count=n).astype(bool)
        else:
            pts, valid = backproject(r.depth, r.K, r.c2w, 1)
            keep = self.keep_mask(pts)
            bits = np.packbits(keep)
            if self._mask_bytes + bits.nbytes <= EDIT_MASK_CACHE_BYTES:
                self._masks[int(r.index)] = (n, bits)
                self._mask_bytes += bits.nbytes
        if keep.all():
            return r
        depth = np.array(r.depth, np.float32, copy=True)
        drop = np.zeros_like(valid)
        drop[valid] = ~keep
        depth[drop] = 0.0
        return dataclasses.replace(r, depth=depth)

    def _placed_frame(self, pose: FramePose) -> FrameResult:
        if self._results is not None:
            r = self._results[pose.key]
        else:
            from .store import StoreError, _result_from_npz
            try:
                with np.load(pose.key, allow_pickle=False) as z:
                    r = _result_from_npz(z)
            except _READ_ERRORS as exc:
                raise StoreError(f"cannot read frame file {pose.key} ({type(exc).__name__}: {exc})") from None
        return r if pose.transform is None else apply_similarity(r, pose.transform)

    def frames(self, poses: Iterable[FramePose]) -> Iterator[FrameResult]:
        for p in poses:
            yield self.frame(p)


def results_reader(results: Sequence, events: Iterable = ()) -> FrameReader:
    """A FrameReader over FrameResults already in memory (the live GUI, tests)."""
    results = list(results)
    poses = [FramePose(index=int(r.index), timestamp=float(r.timestamp),
                       c2w=np.asarray(r.c2w, np.float64), K=np.asarray(r.K, np.float64),
                       is_keyframe=bool(r.is_keyframe), segment=int(r.segment),
                       has_depth=r.depth is not None, key=i) for i, r in enumerate(results)]
    return FrameReader(poses, list(events), results=results)


def read_session(folder, progress: bool = False, extra_events: Iterable = (), edits=STORED_EDITS) -> FrameReader:
    """A FrameReader over a session folder: config.json, events.jsonl and every frame's pose.
    Leftover temp files of a killed writer are removed first (as `load_session` does).
    `progress`: a tqdm bar on stderr if reading the poses takes more than a couple of seconds.
    `edits`: STORED_EDITS (the folder's edits.json; an unreadable one raises EditsError), a
    SessionEdits, or None (the raw session)."""
    import sys

    from tqdm import tqdm
    from .store import read_events, read_header, session_folder

    folder = session_folder(folder)
    frames_dir = folder / "frames"
    info, config, problems = read_header(folder)
    poses = []
    paths = sorted(frames_dir.glob("*.npz")) if frames_dir.is_dir() else []

    def one(p):
        try:
            return read_pose(p)
        except _READ_ERRORS as exc:
            return exc
    # a few threads overlap the files' reads (the GIL is released while waiting for the disk)
    with ThreadPoolExecutor(POSE_READERS) as pool, \
            tqdm(total=len(paths), desc="reading poses", unit="frame", file=sys.stderr, disable=not progress,
                 delay=2.0, dynamic_ncols=True, leave=False) as bar:
        for p, got in zip(paths, pool.map(one, paths, chunksize=32)):
            if isinstance(got, BaseException):
                problems.append(f"skipped damaged frame file {p.name} ({type(got).__name__})")
            else:
                poses.append(got)
            bar.update(1)
    # re-alignments are the only events an export uses
    events = [e for e in read_events(folder, problems) if e.kind == "realign"]
    events += [e for e in extra_events if e.kind == "realign"]
    if isinstance(edits, str) and edits == STORED_EDITS:
        from .edits import load_edits
        edits = load_edits(folder)
    return FrameReader(poses, events, info=info, config=config, folder=folder, problems=problems, edits=edits)


def open_frames(source, events: Iterable = (), progress: bool = False) -> FrameReader:
    """A FrameReader from a session folder, a FrameReader, a LoadedSession or a list of results;
    `events` are replayed after the source's own."""
    events = list(events)
    if isinstance(source, FrameReader):
        if events:
            raise ValueError("a FrameReader already holds its events")
        return source
    if isinstance(source, (str, Path)):
        return read_session(source, progress=progress, extra_events=events)
    if hasattr(source, "results") and hasattr(source, "events"):
        reader = results_reader(source.results, list(source.events) + events)
        reader.info = dict(getattr(source, "info", {}) or {})
        reader.config = getattr(source, "config", None)
        reader.folder = getattr(source, "folder", None)
        reader.problems = list(getattr(source, "problems", []) or [])
        if reader.folder is not None:             # a reopened session: its stored edits
            from .edits import load_edits
            reader.set_edits(load_edits(reader.folder))
        return reader
    return results_reader(source, events)
