"""The scene the live viewer draws, as plain arrays (numpy only, no Qt, no GL). Slightly over
800 lines on purpose: the point budget, thinning, level-of-detail order and re-alignment slots
all rewrite the same rows and must agree on what changed (`take_changes`), so they live together.

`SceneModel` holds what the 3D view shows of a run: the points of every frame (segment-local
positions, colours, confidence, depth in the capturing camera, segment, frame sequence number,
keyframe flag), the cameras (frustum corners, centre, segment, keyframe flag, frame sequence
number) for the frustum and trajectory layers, and one transform per frame that the
re-alignment events set. The view
(`ui/viewer.py`) uploads the rows that changed (`take_changes`) into GPU buffers of the model's
capacity; nothing here knows about GL.

Re-alignment: events are kept and resolved with `engine.geometry.result_transforms` (the rule
the exports and eval use: absolute similarities; for each frame the latest event of its segment
whose range — `frames=(first, last)` input indices, or the whole segment — contains it wins).
Each frame (sequence number) holds a *slot*: the number of the event placing it (0 = none,
identity). Points and cameras stay stored as emitted and carry their frame's sequence number
(thinning keeps it), so an event changes the slots of the frames it covers (O(frames), never
O(points)); the view keeps one matrix per frame in a texture and rewrites only the rows of
changed frames (`SceneChanges.transforms_from`). Events are resolved in batches at the next
query or `take_changes`, so a loop closure's hundreds of per-stretch events cost one pass.
Events are bounded: once as many have come again as were in effect, those whose range lies inside
later events' ranges of their segment (never the winner again, for frames held or to come) are
dropped and the frames' slots renumbered, so repeated loop closures re-sending every stretch
keep ~2x the stretches in effect, not every event of the run.

Point budget: the arrays never hold more than `point_budget` points. Appending writes at the end
(O(new points)). When a frame does not fit, one *thinning pass* makes room:

- the newest rows (at most RECENT_FRACTION of the budget) stay untouched: recent frames stay dense;
- older rows not yet thinned are reduced to one point per voxel of a grid per segment (keyframe
  points on a grid KEYFRAME_VOXEL_RATIO finer, so keyframes stay denser), and voxels that the
  already-thinned part holds are dropped; the kept point of a voxel carries the voxel's highest
  confidence, so a confidence threshold hides a voxel only when none of its points passes;
- if the thinned part then exceeds OLD_FRACTION of the budget, the grid is coarsened (voxel x2)
  and the whole thinned part re-gridded.

So after a pass at most (OLD_FRACTION + RECENT_FRACTION) of the budget is used, the next pass
comes only after the rest has been filled again, and a pass costs O(rows it touches): thinning is
amortised O(1) per appended point and never O(total) per frame. Rows before the first one a pass
rewrote stay where they are, so the view re-uploads only the rewritten tail.

`background=True` (the viewer's choice): a pass starts at HIGH_WATER of the budget; its thread
computes the plan (hashing, sorting) and gathers the kept rows (rows appends never touch); the
caller's thread applies it at a later frame (moves the rows after the pass's region down) and
never waits for it: if the budget fills first, a new frame keeps an even subsample of what fits
(`points_skipped`). `hold_passes` lets the view finish uploading the previous pass first.
Without it (tests, tools) passes are synchronous and deterministic.

Level of detail (the view's draw order): every point gets a *level* as it arrives, from its
rank among the points of its voxel on a few nested grids (per segment): the fine LOD grid
(LOD_GRID cells across the first frames' extent) and LOD_COARSE grids 4x and 2x coarser. A
frame's points are ranked in a seeded random order, so which point of a voxel comes first is
random, not the image's first row. Level 0: the first point of a 4x voxel; level 1: the first
of a 2x voxel (not already level 0); level 2 + floor(log2(r + 1)) for the point of rank r in
its fine voxel (capped at LOD_LEVELS - 1; rank 0 not already taken -> level 2). The draw order
is "level 0, then level 1, ...": levels <= 0 / <= 1 hold one point of every occupied 4x / 2x
voxel, and levels <= 2 + k hold min(n, 2^(k+1) - 1) points of every fine voxel of n points, so
any such prefix is a spatially even subsample, octree-like, the coarsest first.
The ranks are counted in a fixed table of per-voxel counters indexed by the voxel hash
(LOD_TABLE_BITS; two voxels sharing a counter only share ranks), so ranking is O(new points)
and memory is flat; `level_counts` (points per level) is kept up to date by appends and by
thinning (O(rows a pass rewrites)). Thinning keeps a row's level.

Voxel keys: the voxel coordinates (20 bits each, wrapping) and segment/keyframe are folded into a
64-bit key, hashed to its top bits and sorted together with the row index in the low bits (one
`np.sort` of uint64, much faster than an argsort). Two different voxels share a hash with
probability ~ voxels² / 2^38 per pass (37-bit hash): ~60 of 4 M voxels, i.e. one point in ~70k
is dropped, which nobody sees.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

import numpy as np

# 4 M points, twice the pixels of a 1080p view (more points than pixels adds nothing visible):
# the viewer's GPU buffers take 28 B/point (112 MB, ~3 % of a 4 GB GPU, leaving the rest for a
# neural engine's weights and KV cache); the model ~34 B/point of host RAM (135 MB) plus a
# thinning pass's scratch (~40 B per aged point, ~120 MB) and upload staging (~28 B per
# rewritten point, ~85 MB): ~0.35 GB at the peak, well inside 2 GB of host RAM. At the neural
# engine's ~50k points/frame (518x392, stride 2) that is ~80 dense frames before thinning starts.
DEFAULT_POINT_BUDGET = 4_000_000
MIN_POINT_BUDGET = 100_000
MAX_POINT_BUDGET = 100_000_000
_INDEX_BITS = 27                   # row index in the low bits of the sort key (2^27 > MAX budget)
_HASH_BITS = 64 - _INDEX_BITS      # voxel hash in the high bits
DEFAULT_CAMERA_BUDGET = 8_192      # cameras kept (old ones decimated); the viewer preallocates 18 line vertices each (~4 MB)
RECENT_FRACTION = 0.25             # newest rows kept dense by a thinning pass
OLD_FRACTION = 0.5                 # thinned rows above this → coarsen the grid
KEYFRAME_VOXEL_RATIO = 0.5         # keyframe points: grid this much finer
RECENT_CAMERAS = 200               # newest cameras never decimated
HIGH_WATER = 0.8                   # background mode: start a pass when this full
MIN_EVENTS_COMPACTED = 64          # superseded realign events are dropped once this many are kept
PASS_CHUNK = 1 << 18               # rows a thinning pass hashes / moves at a time (bounds its scratch)
LOD_LEVELS = 10                    # draw-order levels (module docstring, "Level of detail")
LOD_GRID = 64                      # fine LOD voxels across the first frames' extent
LOD_COARSE = (4, 2)                # coarser grids (x fine voxel): their first points come first
LOD_TABLE_BITS = 23                # per-voxel rank counters (uint8, 8 MiB)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MASK20 = np.int64((1 << 20) - 1)


@dataclass
class SceneChanges:
    """What changed since the last `take_changes`: point rows [points_from, count) and camera
    rows [cameras_from, camera_count) must be (re-)uploaded; `capacity_changed` means the point
    arrays were reallocated (re-create the GPU buffers at the new capacity); the per-frame
    transforms of frames [transforms_from, frames) must be re-read (`frame_matrices`)."""
    points_from: int
    cameras_from: int
    capacity_changed: bool
    transforms_from: int = 0    # frames [transforms_from, frames) have new transforms (frame_matrices)
    frames: int = 0             # frames (sequence numbers) known so far


class SceneModel:
    """Points, cameras and segment transforms of one run, bounded by `point_budget`."""

    def __init__(self, point_budget: int = DEFAULT_POINT_BUDGET,
                 camera_budget: int = DEFAULT_CAMERA_BUDGET, initial_capacity: int = 1 << 16,
                 background: bool = False, lod_seed: int = 0):
        self.lod_seed = int(lod_seed)
        self._initial_capacity = int(initial_capacity)
        self.background = bool(background)     # compute thinning passes on a thread
        self._job: Optional[dict] = None
        self._pool = None
        # set by the view while it uploads what the last pass rewrote: a pass that finishes
        # meanwhile is applied afterwards, or when the budget is full (whichever comes first)
        self.hold_passes = False
        self._generation = 0
        self.point_budget = _clamp_budget(point_budget)
        self.camera_budget = max(2 * RECENT_CAMERAS, int(camera_budget))
        self.clear()

    # -- state --------------------------------------------------------------------------------
    def clear(self) -> None:
        """An empty scene (a new run)."""
        self._generation = getattr(self, "_generation", 0) + 1    # a running pass is dropped
        job = getattr(self, "_job", None)
        if job is not None:                  # it may be writing rows: let it stop (it checks the
            try:                             # generation between chunks) before reusing them
                job["future"].result()
            except Exception:
                pass
        self._job = None
        if getattr(self, "capacity", self.point_budget + 1) > self.point_budget:
            if getattr(self, "positions", None) is not None and len(self.positions) > self.point_budget:
                self.positions = None            # a lowered budget: smaller arrays
            self._alloc_points(min(self._initial_capacity, self.point_budget))
            self._capacity_changed = True
        else:                                # a new run reuses the arrays: nothing allocated
            self._capacity_changed = False
        self.count = 0
        self.thinned = 0                     # rows [0, thinned) are one point per voxel
        self.voxel: Optional[float] = None   # grid size of the thinned rows (segment units)
        self._vkeys = np.zeros(0, np.uint64)  # sorted voxel hashes of rows [0, thinned)
        self._seq = 0                        # frames added (the per-point frame sequence number)
        self.segments: dict[int, np.ndarray] = {}   # whole-segment transforms (latest per segment)
        self.events: list = []               # the "realign" events in effect, in order (superseded ones dropped)
        self._events_live = 0                # events left by the last compaction
        self.events_dropped = 0              # superseded events forgotten (_compact_events)
        self._ev_seg = np.zeros(64, np.int64)    # per event: segment, first / last input index
        self._ev_lo = np.zeros(64, np.int64)
        self._ev_hi = np.zeros(64, np.int64)
        self._mats = np.eye(4)[None].copy()  # slot k > 0 = event k-1's matrix; slot 0 = identity
        self._pending = 0                    # events[-pending:] not yet resolved onto frames
        self._fseg = np.zeros(256, np.int64)    # per frame sequence number: segment, input index,
        self._findex = np.zeros(256, np.int64)  # slot of its transform
        self._fslot = np.zeros(256, np.int64)
        self._dirty_xf = 0                   # frames from here on have new transforms
        self.conf_range = (0.0, 1.0)
        self._conf_seen = False
        self.depth_hi = 0.0
        self.thinning_passes = 0
        self.coarsenings = 0
        self.points_skipped = 0              # new points not kept because a background pass was late
        self.rows_rewritten = 0              # rows thinning has moved (its cost; amortised O(1)/point)
        self.frames_added = 0
        self.points_added = 0
        self.lod_voxel: Optional[float] = None    # LOD grid size (segment units), set by the first points
        self.level_counts = np.zeros(LOD_LEVELS, np.int64)   # rows [0, count) per level
        self.lod_ranked = 0                  # points ranked so far (the ranking's work: O(new points))
        self._lod_rng = np.random.default_rng(self.lod_seed)
        if getattr(self, "_lod_table", None) is None:
            self._lod_table = np.zeros(1 << LOD_TABLE_BITS, np.uint8)
        else:
            self._lod_table.fill(0)
        if getattr(self, "_cam_capacity", 0) == 0:
            self._alloc_cameras(256)
        self.camera_count = 0
        self._dirty_points = 0
        self._dirty_cameras = 0

    def _alloc_points(self, cap: int, keep: int = 0) -> None:
        """Capacity `cap` (what the view sizes its GPU buffers by). The arrays themselves are
        allocated once at the budget: np.zeros pages are only committed when rows are written,
        so this costs no memory up front, and a capacity doubling copies nothing on the caller's
        (GUI) thread -- the copy of the rows held took ~0.6 s at 2 M rows on a loaded machine."""
        rows = max(cap, self.point_budget)
        if getattr(self, "positions", None) is not None and len(self.positions) >= rows:
            self.capacity = cap
            return
        cap_rows = rows
        new = {"positions": np.zeros((cap_rows, 3), np.float32), "colors": np.zeros((cap_rows, 3), np.uint8),
               "conf": np.zeros(cap_rows, np.float32), "depth": np.zeros(cap_rows, np.float32),
               "segment": np.zeros(cap_rows, np.int32), "frame": np.zeros(cap_rows, np.int32),
               "keyframe": np.zeros(cap_rows, bool), "level": np.zeros(cap_rows, np.uint8)}
        for k, a in new.items():
            if keep:
                a[:keep] = getattr(self, k)[:keep]
            setattr(self, k, a)
        self.capacity = cap

    def _alloc_cameras(self, cap: int, keep: int = 0) -> None:
        new = {"cam_frustum": np.zeros((cap, 5, 3), np.float32), "cam_center": np.zeros((cap, 3), np.float32),
               "cam_segment": np.zeros(cap, np.int32), "cam_keyframe": np.zeros(cap, bool),
               "cam_index": np.zeros(cap, np.int64), "cam_frame": np.zeros(cap, np.int64)}
        for k, a in new.items():
            if keep:
                a[:keep] = getattr(self, k)[:keep]
            setattr(self, k, a)
        self._cam_capacity = cap

    @property
    def host_bytes(self) -> int:
        """Bytes of the point and camera arrays (the capacity's rows, not only used rows)."""
        c = self.capacity
        arrays = (self.positions[:c], self.colors[:c], self.conf[:c], self.depth[:c], self.segment[:c],
                  self.frame[:c], self.keyframe[:c], self.level[:c], self._lod_table, self.cam_frustum,
                  self.cam_center, self.cam_segment, self.cam_keyframe, self.cam_index, self._vkeys)
        return int(sum(a.nbytes for a in arrays))

    def set_point_budget(self, budget: int) -> None:
        """Change the budget; a smaller one is enforced by the next `add_frame` (thinning)."""
        self.point_budget = _clamp_budget(budget)

    def take_changes(self) -> SceneChanges:
        self._resolve()
        ch = SceneChanges(min(self._dirty_points, self.count), min(self._dirty_cameras, self.camera_count),
                          self._capacity_changed, min(self._dirty_xf, self._seq), self._seq)
        self._dirty_points, self._dirty_cameras, self._capacity_changed = self.count, self.camera_count, False
        self._dirty_xf = self._seq
        return ch

    # -- frames -------------------------------------------------------------------------------
    def add_frame(self, f) -> None:
        """Add one frame. `f` has the fields of ui.display.DisplayFrame that matter here:
        points [M,3], colors [M,3] uint8, conf [M], depth [M], segment, is_keyframe, index,
        frustum [5,3] (apex then the image corners) and c2w [4,4]."""
        seg = int(f.segment)
        self.segments.setdefault(seg, np.eye(4))
        self._add_frame_key(seg, int(f.index))
        pts = np.asarray(f.points, np.float32).reshape(-1, 3)
        n = len(pts)
        colors, conf, depth = f.colors, f.conf, f.depth
        limit = int(self.point_budget * RECENT_FRACTION)
        if n > limit:                           # one frame larger than the dense window: subsample
            step = -(-n // limit)
            sl = slice(None, None, step)
            pts, colors, conf, depth = pts[sl], colors[sl], conf[sl], depth[sl]
            n = len(pts)
        if n:
            room = self._make_room(n)
            if room < n:                        # a background pass is still running (below)
                self.points_skipped += n - room
                sl = np.linspace(0, n - 1, room).astype(np.intp) if room else slice(0, 0)
                pts, colors, conf, depth = pts[sl], _rows(colors, sl), _rows(conf, sl), _rows(depth, sl)
            if room:
                self._append_points(pts, colors, conf, depth, seg, bool(f.is_keyframe))
        self._add_camera(f, seg)
        self._seq += 1
        self.frames_added += 1

    def _append_points(self, pts, colors, conf, depth, seg: int, kf: bool) -> None:
        n = len(pts)
        need = self.count + n
        if need > len(self.positions) and self._job is not None:
            self._finish_job(wait=True)        # the arrays are re-allocated only after a raised
            need = self.count + n              # budget: not while a pass's thread writes them
        if need > self.capacity:
            cap = self.capacity
            while cap < need:
                cap *= 2
            self._alloc_points(min(max(cap, need), self.point_budget), keep=self.count)
            self._capacity_changed = True
        s = slice(self.count, need)
        self.positions[s] = pts
        self.colors[s] = np.asarray(colors, np.uint8).reshape(-1, 3)
        c = np.ones(n, np.float32) if conf is None else np.asarray(conf, np.float32).reshape(-1)
        self.conf[s] = c
        d = np.asarray(depth, np.float32).reshape(-1)
        self.depth[s] = d
        self.segment[s] = seg
        self.frame[s] = self._seq
        self.keyframe[s] = kf
        self.level[s] = self._rank_levels(self.positions[s], seg)
        self.level_counts += np.bincount(self.level[s], minlength=LOD_LEVELS)
        self.count = need
        self.points_added += n
        lo, hi = float(c.min()), float(c.max())
        if self._conf_seen:
            lo, hi = min(lo, self.conf_range[0]), max(hi, self.conf_range[1])
        self.conf_range, self._conf_seen = (lo, hi), True
        if len(d):
            self.depth_hi = max(self.depth_hi, float(np.percentile(d, 95)))

    def _rank_levels(self, pos: np.ndarray, seg: int) -> np.ndarray:
        """Levels of new points (module docstring, "Level of detail"): O(n log n) in the n new
        points, whatever the scene holds."""
        n = len(pos)
        if self.lod_voxel is None:
            p = pos[:: max(1, n // 20000)]
            ext = float(np.linalg.norm(np.percentile(p, 95, axis=0) - np.percentile(p, 5, axis=0)))
            self.lod_voxel = max(ext, 1e-6) / LOD_GRID
        order = self._lod_rng.permutation(n)                 # random rank inside a voxel
        level = np.empty(n, np.uint8)
        nofk = np.zeros(n, bool)
        mask = np.uint64((1 << LOD_TABLE_BITS) - 1)
        table = self._lod_table
        for g, factor in enumerate(LOD_COARSE + (1,)):       # coarsest grid first, fine grid last
            tag = np.full(n, seg * 8 + g, np.int32)          # each grid its own counters
            slot = _voxel_hash(pos, nofk, tag, self.lod_voxel * factor) & mask
            # grouped by slot, in the random order inside a slot: one sort of (slot, position in
            # the order) keys -- the stable argsort of slot[order], about twice as fast
            key = (slot[order] << np.uint64(32)) | np.arange(n, dtype=np.uint64)
            key.sort()
            o = order[(key & np.uint64(0xFFFFFFFF)).astype(np.intp)]
            ss = (key >> np.uint64(32)).astype(np.intp)
            starts = np.flatnonzero(np.r_[True, ss[1:] != ss[:-1]]) if n else np.zeros(0, np.intp)
            lens = np.diff(np.r_[starts, n])
            rank = table[ss].astype(np.int64) + (np.arange(n) - np.repeat(starts, lens))
            table[ss[starts]] = np.minimum(table[ss[starts]].astype(np.int64) + lens, 255).astype(np.uint8)
            if factor == 1:        # fine grid: rank r -> level len(LOD_COARSE) + floor(log2(r + 1))
                lv = len(LOD_COARSE) + np.floor(np.log2(rank + 1.0))
                first = level[o] < g                         # already a coarser grid's first point
                level[o] = np.where(first, level[o], np.minimum(lv, LOD_LEVELS - 1)).astype(np.uint8)
            else:                  # a coarse voxel's first point: level g (coarser levels kept)
                if g == 0:
                    level[:] = 255
                cur = level[o]
                level[o] = np.where((rank == 0) & (cur == 255), g, cur).astype(np.uint8)
        self.lod_ranked += n
        return level

    def first_row_of_frame(self, seq: int) -> int:
        """The first row of frame `seq` or a later one (rows keep the frames' order): the rows
        from it on are the newest frames', which the view always draws in full."""
        return int(np.searchsorted(self.frame[: self.count], np.int32(seq), "left"))   # int32: no O(n) cast

    def choose_detail(self, max_points: float, live_from: int) -> tuple[int, int]:
        """The largest draw-order prefix that fits `max_points`, the rows [live_from, count)
        (the newest frames) always included: (level, points drawn) -- all rows of levels
        <= level before `live_from`, plus the live rows. level = LOD_LEVELS - 1 means every
        row; at least level 0 is drawn (every occupied voxel), even over `max_points`.
        O(live rows)."""
        live_from = min(max(0, int(live_from)), self.count)
        live = self.count - live_from
        older = self.level_counts - np.bincount(self.level[live_from:self.count], minlength=LOD_LEVELS)
        cum = np.cumsum(older) + live
        fits = np.flatnonzero(cum <= max_points)
        j = int(fits[-1]) if len(fits) else 0
        return j, int(cum[j])

    def draw_prefix(self, level: int, rows_before: Optional[int] = None) -> np.ndarray:
        """Rows (sorted) of levels <= `level` among rows [0, rows_before) (default all): the
        draw order's prefix (for tools and tests; the view keeps per-level index lists)."""
        hi = self.count if rows_before is None else min(rows_before, self.count)
        return np.flatnonzero(self.level[:hi] <= level)

    def _add_camera(self, f, seg: int) -> None:
        if self.camera_count >= self.camera_budget:
            self._decimate_cameras()
        if self.camera_count >= self._cam_capacity:
            self._alloc_cameras(min(2 * self._cam_capacity, self.camera_budget), keep=self.camera_count)
        i = self.camera_count
        self.cam_frustum[i] = np.asarray(f.frustum, np.float32)[:5]
        self.cam_center[i] = np.asarray(f.c2w, np.float32)[:3, 3]
        self.cam_segment[i] = seg
        self.cam_keyframe[i] = bool(f.is_keyframe)
        self.cam_index[i] = int(f.index)
        self.cam_frame[i] = self._seq
        self.camera_count += 1

    def _decimate_cameras(self) -> None:
        """Halve the older cameras (non-keyframes first) so the camera layers stay bounded."""
        n = self.camera_count
        old = n - RECENT_CAMERAS
        keep = np.ones(n, bool)
        nk = np.flatnonzero(~self.cam_keyframe[:old])
        keep[nk[1::2]] = False                   # every other old non-keyframe
        if keep.sum() > 0.75 * self.camera_budget:
            k = np.flatnonzero(keep[:old])
            keep[k[1::2]] = False                # then every other old camera
        idx = np.flatnonzero(keep)
        for name in ("cam_frustum", "cam_center", "cam_segment", "cam_keyframe", "cam_index", "cam_frame"):
            a = getattr(self, name)
            a[: len(idx)] = a[idx]
        self.camera_count = len(idx)
        self._dirty_cameras = 0

    def set_segment_transform(self, segment: int, matrix) -> None:
        """Place segment `segment` with an absolute similarity (4x4); its points stay as stored."""
        self.add_realign(segment, matrix)

    # -- re-alignment -------------------------------------------------------------------------
    def add_realign(self, segment: int, matrix, frames=None) -> None:
        """Apply a "realign" event: the absolute similarity `matrix` places segment `segment`'s
        frames (all, or input indices `frames=(first, last)` inclusive), replacing earlier events
        on those frames; frames added later that it covers get it too. Resolved lazily."""
        T = np.asarray(matrix, np.float64).reshape(4, 4)
        seg = int(segment)
        fr = None if frames is None else (int(frames[0]), int(frames[1]))
        k = len(self.events)
        if k >= len(self._ev_seg):
            for name in ("_ev_seg", "_ev_lo", "_ev_hi"):
                a = getattr(self, name)
                setattr(self, name, np.concatenate([a, np.zeros_like(a)]))
        if k + 1 >= len(self._mats):
            self._mats = np.concatenate([self._mats, np.zeros_like(self._mats)])
        self._ev_seg[k] = seg
        self._ev_lo[k], self._ev_hi[k] = fr if fr is not None else (np.iinfo(np.int64).min, np.iinfo(np.int64).max)
        self._mats[k + 1] = T
        self.events.append(SimpleNamespace(kind="realign", segment=seg, transform=T, frames=fr))
        self._pending += 1
        if fr is None:
            self.segments[seg] = T

    def apply_events(self, events) -> None:
        """`add_realign` for every "realign" event of `events` (others are ignored)."""
        for e in events:
            if getattr(e, "kind", None) == "realign" and e.transform is not None:
                self.add_realign(e.segment, e.transform, getattr(e, "frames", None))

    def _add_frame_key(self, seg: int, index: int) -> None:
        """Record frame `self._seq` = (segment, input index) and the slot of the latest event
        covering it (decided by engine.geometry.result_transforms)."""
        i = self._seq
        if i >= len(self._fseg):
            for name in ("_fseg", "_findex", "_fslot"):
                a = getattr(self, name)
                setattr(self, name, np.concatenate([a, np.zeros_like(a)]))
        self._fseg[i], self._findex[i] = seg, index
        k = len(self.events)
        # a vectorised pre-selection of the events that may contain it; the rule is the engine's
        cand = np.flatnonzero((self._ev_seg[:k] == seg) & (self._ev_lo[:k] <= index) & (self._ev_hi[:k] >= index))
        self._fslot[i] = max(0, self._winning_slots([(seg, index)], cand)[0]) if len(cand) else 0
        self._dirty_xf = min(self._dirty_xf, i)

    def _winning_slots(self, keys, event_numbers) -> np.ndarray:
        """For (segment, index) keys: the slot (event number + 1) of the event among
        `event_numbers` that engine.geometry.result_transforms places each key by, -1 where none
        covers it. Each event is passed with its slot number as its "transform", so the
        function's answer names the winning event (the rule is not copied here)."""
        from .geometry import result_transforms
        proxies = [SimpleNamespace(kind="realign", segment=self.events[j].segment,
                                   frames=self.events[j].frames, transform=np.full((4, 4), float(j + 1)))
                   for j in event_numbers]
        won = result_transforms(keys, proxies)
        return np.array([-1 if T is None else int(T[0, 0]) for T in won], np.int64)

    def _resolve(self) -> None:
        """Apply the pending events to the frames they cover (one pass over those segments' frames)."""
        if not self._pending:
            return
        k = len(self.events)
        pend = range(k - self._pending, k)
        self._pending = 0
        n = self._seq
        rows = np.flatnonzero(np.isin(self._fseg[:n], np.unique(self._ev_seg[pend.start:k])))
        if len(rows):
            keys = list(zip(self._fseg[rows].tolist(), self._findex[rows].tolist()))
            slots = self._winning_slots(keys, pend)
            hit = slots >= 0
            if hit.any():
                self._fslot[rows[hit]] = slots[hit]
                self._dirty_xf = min(self._dirty_xf, int(rows[hit][0]))
        if k >= max(MIN_EVENTS_COMPACTED, 2 * self._events_live):
            self._compact_events()

    def _compact_events(self) -> None:
        """Forget the events that can never place a frame again: those whose range (segment,
        input indices) lies inside the union of later events' ranges of the same segment — the
        latest covering event wins, for the frames held and for any frame added later. Loop
        closures re-send every keyframe stretch, so without this the events (and the per-frame
        lookups among them) grow with every closure. Frames' slots are renumbered; matrices are
        unchanged, so nothing is re-uploaded. Runs after `_resolve` (no event pending)."""
        k = len(self.events)
        covered: dict[int, list] = {}            # segment -> sorted disjoint [lo, hi] (merged)
        live = np.zeros(k, bool)
        for j in range(k - 1, -1, -1):
            seg, lo, hi = int(self._ev_seg[j]), int(self._ev_lo[j]), int(self._ev_hi[j])
            live[j] = not _inside(covered.setdefault(seg, []), lo, hi)
            if live[j]:
                _insert(covered[seg], lo, hi)
        keep = np.flatnonzero(live)
        m = len(keep)
        if m < k:
            new_slot = np.zeros(k + 1, np.int64)
            new_slot[keep + 1] = np.arange(1, m + 1)
            self._fslot[: self._seq] = new_slot[self._fslot[: self._seq]]
            for name in ("_ev_seg", "_ev_lo", "_ev_hi"):
                a = getattr(self, name)
                a[:m] = a[keep]
            self._mats[1:m + 1] = self._mats[keep + 1]
            self.events = [self.events[j] for j in keep]
            self.events_dropped += k - m
        self._events_live = m

    def frame_matrices(self, lo: int = 0, hi: Optional[int] = None) -> np.ndarray:
        """4x4 transforms (float64 [n,4,4]) of frames (sequence numbers) [lo, hi)."""
        self._resolve()
        hi = self._seq if hi is None else hi
        return self._mats[self._fslot[lo:hi]]

    def frame_transform(self, seq: int = -1) -> np.ndarray:
        """The 4x4 transform placing frame `seq` (sequence number; -1 = the newest frame)."""
        seq = self._seq - 1 if seq < 0 else seq
        return self.frame_matrices(seq, seq + 1)[0] if 0 <= seq < self._seq else np.eye(4)

    def _transformed(self, p: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """Positions p [n,3] of frames `frames` (sequence numbers) in world: each row times its
        frame's matrix, gathered in chunks (O(n) whatever the number of distinct transforms: a
        loop closure gives one per keyframe stretch)."""
        self._resolve()
        p = p.astype(np.float64)
        slot = self._fslot[frames]
        if not slot.any():
            return p
        out = np.empty_like(p)
        for a in range(0, len(p), 1 << 18):
            b = min(len(p), a + (1 << 18))
            M, q = self._mats[slot[a:b], :3], p[a:b]
            out[a:b] = M[:, :, 3] + M[:, :, 0] * q[:, :1] + M[:, :, 1] * q[:, 1:2] + M[:, :, 2] * q[:, 2:3]
        return out

    # -- thinning -----------------------------------------------------------------------------
    def _make_room(self, n: int) -> int:
        """Make room for n new points; returns how many fit (n unless a background pass is
        late). Background mode never waits for its pass: the caller is the GUI thread, and a
        pass over millions of rows can take seconds on a loaded machine. When the budget is
        full before the pass has finished, the new frame keeps an even subsample of what fits
        (`points_skipped` counts the rest: the view's loss only; the session store keeps every
        point)."""
        budget = self.point_budget
        if self.background:
            self._finish_job(wait=False)
            if self.count + n > budget:           # full: a finished pass is applied even if held
                self._finish_job(wait=False, held_too=True)
            if self._job is None and self.count + n > HIGH_WATER * budget:
                self._start_job()
            if self.count + n <= budget:
                return n
            if self._job is not None:
                return max(0, min(n, budget - self.count))
        if self.count + n <= budget:
            return n
        self.thinning_passes += 1
        recent = int(budget * RECENT_FRACTION)
        self._thin_aged(max(self.thinned, self.count - recent))
        while self.thinned > budget * OLD_FRACTION or self.count + n > budget:
            if self.thinned > 0.02 * budget or self.thinned == self.count:
                self._coarsen()
            else:   # budget lowered below the recent window: thin more of it
                self._thin_aged(max(self.thinned, self.count - recent // 2))
                recent //= 2
        return n

    def _aged_args(self, r0: int) -> tuple:
        t = self.thinned
        if self.voxel is None:
            self.voxel = self._initial_voxel(t, r0)
        v = slice(t, r0)
        return (self.positions[v], self.keyframe[v], self.segment[v], self.conf[v], t, r0, self.voxel, self._vkeys)

    def _coarsen_args(self) -> tuple:
        v = slice(0, self.thinned)
        return (self.positions[v], self.keyframe[v], self.segment[v], self.conf[v], 0, self.thinned,
                (self.voxel or 1e-3) * 2.0, None)

    def _thin_aged(self, r0: int) -> None:
        """Reduce rows [thinned, r0) to one point per voxel not yet held by the thinned part;
        move the tail [r0, count) down behind them."""
        if r0 > self.thinned:
            self._apply(_plan(*self._aged_args(r0)))

    def _coarsen(self) -> None:
        """Double the grid and re-grid the whole thinned part."""
        self._apply(_plan(*self._coarsen_args()))

    def _apply(self, p: "_Plan") -> None:
        if p.level_delta is None:             # synchronous pass: gather here
            self._gather(p)
        self._move_tail(p.lo + len(p.rows), p.tail, p.lo)
        self.level_counts += p.level_delta
        self.rows_rewritten += len(p.rows)
        self._vkeys = p.vkeys
        self.thinned = p.lo + len(p.rows)
        if p.lo == 0 and self.voxel is not None and p.voxel != self.voxel:
            self.coarsenings += 1
        self.voxel = p.voxel

    # A background pass computes its plan (hashing, sorting: the expensive part) on a thread
    # from views of rows that appends never touch ([0, r0) while only one pass runs); the GUI
    # thread applies it (moves rows) at a later frame. clear() bumps the generation so a pass
    # of an old run is dropped.
    def _start_job(self) -> None:
        budget = self.point_budget
        if self.thinned > OLD_FRACTION * budget:
            args = self._coarsen_args()
        else:
            r0 = max(self.thinned, self.count - int(budget * RECENT_FRACTION))
            if r0 <= self.thinned:
                return
            args = self._aged_args(r0)
        self.thinning_passes += 1
        if self._pool is None:      # one long-lived thread: its malloc arena is reused, not one per pass
            from concurrent.futures import ThreadPoolExecutor
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="scene-thinning")
        self._job = {"future": self._pool.submit(self._background_pass, args, self._generation),
                     "generation": self._generation}

    def _background_pass(self, args: tuple, generation: int) -> "_Plan":
        """On the pass's thread: the plan, then the gathers of its region."""
        p = _plan(*args)
        if generation == self._generation:
            self._gather(p, generation)
        return p

    def _finish_job(self, wait: bool, held_too: bool = False) -> None:
        job = self._job
        if job is None or (not wait and ((self.hold_passes and not held_too) or not job["future"].done())):
            return
        self._job = None
        plan = job["future"].result()         # re-raises an error of the pass here
        if job["generation"] == self._generation:
            self._apply(plan)

    def wait(self) -> None:
        """Apply a background thinning pass still running (tests, screenshots)."""
        self._finish_job(wait=True)

    def _initial_voxel(self, lo: int, hi: int) -> float:
        p = self.positions[lo:hi:max(1, (hi - lo) // 20000)]
        ext = float(np.linalg.norm(np.percentile(p, 95, axis=0) - np.percentile(p, 5, axis=0)))
        return max(ext, 1e-6) / 1024.0

    _ROW_ARRAYS = ("positions", "colors", "conf", "depth", "segment", "frame", "keyframe", "level")

    def _gather(self, p: "_Plan", generation: Optional[int] = None) -> None:
        """Move the kept rows of [p.lo, p.tail) to p.lo.. (with their voxels' best confidence)
        and note the change of the per-level counts in p.level_delta. Only rows of the pass's
        region are touched -- rows that appends never touch -- so a background pass does this
        on its thread (the expensive gathers); it stops early if the scene was cleared."""
        lo, rows, k = p.lo, p.rows, len(p.rows)
        removed = np.bincount(self.level[lo:p.tail], minlength=LOD_LEVELS)
        self.conf[rows] = p.best
        c = PASS_CHUNK                # in chunks: scratch of one chunk, not of every row moved
        for name in self._ROW_ARRAYS:
            a = getattr(self, name)
            # rows are sorted and rows[j] >= lo + j: a chunk never overwrites a later chunk's source
            for j in range(0, k, c):
                if generation is not None and generation != self._generation:
                    return
                a[lo + j:lo + min(k, j + c)] = a[rows[j:j + c]]      # fancy indexing copies
        p.level_delta = np.bincount(self.level[lo:lo + k], minlength=LOD_LEVELS) - removed

    def _move_tail(self, dst: int, tail: int, changed_from: int) -> None:
        """Move the rows [tail, count) down to dst (what the caller's thread does of a pass:
        O(rows after the pass's region), plain memory moves)."""
        m = self.count - tail
        c = PASS_CHUNK
        for name in self._ROW_ARRAYS:
            a = getattr(self, name)
            for j in range(0, m, c):  # moving down (dst <= tail): front to back is safe
                e = min(m, j + c)
                a[dst + j:dst + e] = a[tail + j:tail + e]     # numpy handles the overlap
        self.count = dst + m
        self.rows_rewritten += m
        self._dirty_points = min(self._dirty_points, changed_from)

    # -- queries ------------------------------------------------------------------------------
    def world_positions(self, rows: slice = slice(None)) -> np.ndarray:
        """Positions of rows (default all) with their frames' transforms applied."""
        return self._transformed(self.positions[: self.count][rows], self.frame[: self.count][rows])

    def sample(self, max_points: int = 20000) -> np.ndarray:
        """About `max_points` world positions spread over the scene (for framing the view)."""
        step = max(1, self.count // max(1, max_points))
        return self.world_positions(slice(None, None, step))

    def camera_centers(self) -> np.ndarray:
        """World positions of the cameras kept (their frames' transforms applied)."""
        return self._transformed(self.cam_center[: self.camera_count], self.cam_frame[: self.camera_count])

    def framing(self, max_points: int = 4096) -> Optional[tuple[np.ndarray, float]]:
        """(centre, extent) that frames the cloud (5-95 % of a sample) and the camera path;
        None for an empty scene."""
        if not self.count and not self.camera_count:
            return None
        parts = []
        if self.count:
            p = self.sample(max_points)
            parts += [np.percentile(p, 5, axis=0), np.percentile(p, 95, axis=0)]
        if self.camera_count:     # keep the camera path in view too, not only the cloud
            path = self.camera_centers()
            parts += [path.min(axis=0), path.max(axis=0)]
        pts = np.stack(parts)
        lo, hi = pts.min(axis=0), pts.max(axis=0)
        return (lo + hi) / 2, float(np.linalg.norm(hi - lo))


def chase_view(c2w, look_at, median_depth: float, segment_matrix=None) -> dict:
    """A turntable view (up = -y: azimuth 0 deg looks along +x, 90 deg along +z, elevation > 0
    looks down) orbiting what the camera `c2w` looks at, from just behind it and a little above,
    looking the way it looks. `segment_matrix` places the camera's segment in the world."""
    m = np.eye(4) if segment_matrix is None else np.asarray(segment_matrix, np.float64)
    centre = m[:3, :3] @ np.asarray(look_at, np.float64) + m[:3, 3]
    fwd = m[:3, :3] @ np.asarray(c2w, np.float64)[:3, 2]
    scale = float(np.cbrt(abs(np.linalg.det(m[:3, :3])))) or 1.0
    n = float(np.linalg.norm(fwd)) or 1.0
    return {"azimuth": float(np.degrees(np.arctan2(fwd[2], fwd[0]))),
            "elevation": float(np.clip(np.degrees(np.arcsin(np.clip(fwd[1] / n, -1, 1))) + 15.0, -80, 80)),
            "center": tuple(float(v) for v in centre),
            "distance": 2.0 * float(median_depth) * scale}


@dataclass
class _Plan:
    """A thinning pass's result: keep `rows` (sorted, absolute) of [lo, tail) with confidences
    `best`, then the rows from `tail` on; `vkeys` = sorted voxel hashes of the thinned part."""
    lo: int
    tail: int
    rows: np.ndarray
    best: np.ndarray
    vkeys: np.ndarray
    voxel: float
    level_delta: Optional[np.ndarray] = None    # set once the kept rows are gathered (_gather)


def _voxel_hash(pos, kf, seg, voxel: float) -> np.ndarray:
    """_HASH_BITS-bit hash of (voxel of each point, segment, keyframe)."""
    inv = np.where(kf, np.float32(1.0 / (voxel * KEYFRAME_VOXEL_RATIO)), np.float32(1.0 / voxel))
    key = np.zeros(len(kf), np.int64)
    for axis in range(3):                     # per column: fewer and smaller temporaries
        q = pos[:, axis] * inv
        np.floor(q, out=q)
        key |= (q.astype(np.int64) & _MASK20) << (20 * axis)
    tag = (seg.astype(np.int64) * 2 + kf).view(np.uint64) + np.uint64(1)
    key = key.view(np.uint64)
    with np.errstate(over="ignore"):
        tag *= _GOLDEN
        key ^= tag
        key *= _GOLDEN
    key >>= np.uint64(64 - _HASH_BITS)
    return key


def _plan(pos, kf, seg, conf, lo: int, tail: int, voxel: float, vkeys, chunk: int = None) -> _Plan:
    """One point per voxel of rows [lo, tail) (given as views pos/kf/seg/conf): the earliest row
    of each voxel, carrying the voxel's highest confidence. With `vkeys` (an aged pass), voxels
    already in the thinned part are dropped and the new ones merged into it; without (a
    coarsening), the result is the whole thinned part.

    Memory: one sort key (8 B) and one confidence (4 B) per row plus per-chunk scratch (hashing
    and gathers run `chunk` rows at a time; the sort is in place) -- a pass that held ~45 B per
    row made a large part of the RSS swing of a soak run (docs/benchmarks_gui.md)."""
    n = len(pos)
    chunk = int(chunk or PASS_CHUNK)
    ib = np.uint64(_INDEX_BITS)
    mask = np.uint64((1 << _INDEX_BITS) - 1)
    s = np.empty(n, np.uint64)
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        v = s[a:b]
        v[:] = _voxel_hash(pos[a:b], kf[a:b], seg[a:b], voxel)
        v <<= ib
        v |= np.arange(a, b, dtype=np.uint64)
    s.sort()                                  # by voxel, then by row (keys are unique: in place)
    starts, cv = [], np.empty(n, np.float32)
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        h = s[max(0, a - 1):b] >> ib
        st = np.flatnonzero(h[1:] != h[:-1]) + a + (0 if a else 1)
        starts.append(st if a else np.r_[0, st])
        cv[a:b] = conf[(s[a:b] & mask).astype(np.intp)]
    start = np.concatenate(starts) if n else np.zeros(0, np.int64)
    del starts
    best = np.maximum.reduceat(cv, start) if n else np.zeros(0, np.float32)
    del cv
    rows = s[start]
    del s, start
    keys = rows >> ib
    rows &= mask                              # in place: the row index (< 2^27)
    rows = rows.view(np.int64)
    if vkeys is not None and len(vkeys):
        pos_ = np.minimum(np.searchsorted(vkeys, keys), len(vkeys) - 1)
        new = vkeys[pos_] != keys
        keys, rows, best = keys[new], rows[new], best[new]
    order = np.argsort(rows)                  # keep the time order of the kept rows
    vk = keys if vkeys is None else np.insert(vkeys, np.searchsorted(vkeys, keys), keys)
    return _Plan(lo, tail, rows[order] + lo, best[order], vk, voxel)


def _inside(spans: list, lo: int, hi: int) -> bool:
    """Whether [lo, hi] lies inside one of the sorted, disjoint, merged integer spans."""
    import bisect
    i = bisect.bisect_right(spans, [lo, float("inf")]) - 1
    return i >= 0 and spans[i][0] <= lo and hi <= spans[i][1]


def _insert(spans: list, lo: int, hi: int) -> None:
    """Add [lo, hi] to the sorted disjoint spans, merging overlapping and adjacent ones."""
    import bisect
    i = bisect.bisect_left(spans, [lo, lo])
    if i > 0 and spans[i - 1][1] >= lo - 1:
        i -= 1
    j = i
    while j < len(spans) and spans[j][0] <= hi + 1:
        lo, hi = min(lo, spans[j][0]), max(hi, spans[j][1])
        j += 1
    spans[i:j] = [[lo, hi]]


def _rows(a, sl):
    """a[sl] for an optional per-point array (None stays None)."""
    return None if a is None else np.asarray(a)[sl]


def _clamp_budget(n) -> int:
    return int(min(MAX_POINT_BUDGET, max(MIN_POINT_BUDGET, int(n))))
