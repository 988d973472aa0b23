"""Loop closure for the geometric engine: place recognition over keyframes, geometric
verification, and a Sim(3) pose-graph correction of every keyframe of the segment.

One module of ~1,000 lines on purpose: the pieces below share the `LoopCloser` worker thread's
keyframe database and its locking; split, each would reach into the others' state.

Pieces (all OpenCV + numpy; the heavy part runs on a worker thread):
- **Keyframe features**: ORB (up to 800 corners) for place recognition, and ORB descriptors at the
  keyframe's own map-point observations (orientation from the intensity centroid), each tied to
  the point's position in that keyframe's camera frame — the 3-D side of verification.
- **Place recognition**: a bag of binary words. The vocabulary (256 words) is learned online by
  k-means over the bits of the first keyframes' descriptors; keyframes are tf-idf vectors scored with
  the L1 score of DBoW2. Candidates are keyframes at least `min_gap` keyframes older than the query
  whose score beats a fraction of the query's score against its immediate predecessor.
- **Verification**: descriptor matches between the two keyframes' map points (ratio test);
  PnP-RANSAC of the candidate's points in the query image gives the rigid part, the matched points' depths the scale; a Sim(3) refinement minimises the two-way
  reprojection errors plus the log depth ratios (Huber). Accepted with ≥ `min_inliers` two-way
  inliers. A loop the current estimate already satisfies within its noise is recorded as an edge
  but moves nothing. When those descriptors do not confirm a candidate (each keyframe triangulated
  its own corners, so a revisit from elsewhere shares few map points), the place-recognition ORB
  corners themselves are matched, each with a depth interpolated from its keyframe's map points
  (`_verify_keypoints`; for relocalisation only: its loops measure the scale too coarsely to
  correct a segment with). Then optical flow (`_verify_flow`).
- **Correction**: `engine.align.Sim3PoseGraph` over all keyframes of the segment: odometry edges
  between consecutive keyframes and to the few earlier keyframes sharing ≥ 100 points (from the
  poses as produced; a covisibility edge only where the earlier keyframe's corrected pose still
  agrees with the tracker's, i.e. not across a loop correction), every loop edge found so far
  (Huber kernel); the oldest keyframe is the fixed gauge.
- **Relocalisation**: a keyframe of a segment started after a tracking loss is also looked up among
  the keyframes of earlier segments; a verified match places the segment there (`SegmentLink`).
- **Bounded memory** (a long run revisiting the same places must not grow): a new keyframe whose
  verified match is an older database keyframe seen from nearly the same viewpoint (`cull_deg`,
  `cull_dist` × depth) is *redundant*: its place-recognition data (descriptors, words, 3-D points)
  is freed at once and it stays only as a pose-graph node of its live segment. The database holds
  at most `max_keyframes` keyframes (beyond: the one most similar to another keyframe goes, then
  the oldest). When a segment has ended (`end_segment`, queued by the session after its last
  detection) its pose graph and every node not in the database are dropped: nothing can move
  an ended segment again, and only database keyframes can be matched later. `memory()` reports the
  sizes.

Coordinates: node n is keyframe n's camera frame in the units of the world it was produced in;
its pose T_n (4×4 similarity, node → world) starts as the c2w the client received. Corrections
are C_n = T_n(new) · T_n(as produced)⁻¹ — what the session sends as "realign" events.

Determinism: the session waits for the worker's answer for keyframe q when frame q + `lag` is
pushed (back-pressure, as for depth), so results do not depend on the worker's speed.
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import cv2
import numpy as np

from ..align import Sim3PoseGraph, sim3_exp, sim3_inverse, sim3_log, sim3_matrix, sim3_split


@dataclass
class LoopParams:
    min_gap: int = 10             # a candidate is at least this many keyframes older than the query
    vocab_words: int = 256
    vocab_min_descriptors: int = 3000
    n_candidates: int = 3
    min_score_ratio: float = 0.6  # candidate score ≥ ratio × score(query, its predecessor)
    min_matches: int = 30
    min_inliers: int = 30
    ransac_iters: int = 200
    reproj_px: float = 4.0        # two-way reprojection threshold of verification (640-wide pixels)
    odo_information: float = 1.0
    covis_min_points: int = 100   # extra odometry edges to earlier keyframes sharing this many points ...
    covis_max_edges: int = 4      # ... the strongest few (an essential graph, as in ORB-SLAM)
    covis_agree_deg: float = 0.5  # > 0: a covisibility edge only to keyframes whose corrected pose
    covis_agree_trans: float = 0.02   # still agrees with the tracker's (rotation, translation /
    # median depth, log scale ≤ covis_agree_trans): across a loop correction (the tracker moved its
    # whole map by the latest keyframe's correction) or drift the edge would join two worlds
    loop_information: float = 1.0
    loop_huber: float = 0.5       # on the whitened loop residual (≈ rad / relative units)
    agree_deg: float = 1.0        # a verified loop the map already satisfies this well (rotation,
    agree_trans: float = 0.03     # translation / median depth, log scale) is recorded but moves
    agree_scale: float = 0.03     # nothing (closing it would only spread measurement noise)
    max_edge_deg: float = 3.0     # a solved graph may bend an odometry edge by at most this much
    max_edge_scale: float = 0.1   # (rotation, |log scale|, translation / edge length); more means
    max_edge_trans: float = 0.5   # the loop was a false match and is dropped
    depth_sigma: float = 0.05     # relative depth noise of map points, for the loop's scale
    lag: int = 30                 # frames after the query keyframe when its answer is applied
    max_keyframes: int = 1000     # place-recognition database cap (≈ 30 KB per keyframe)
    cull_deg: float = 10.0        # a new keyframe verified against a database keyframe this close
    cull_dist: float = 0.15       # (rotation; distance / its median depth) is redundant: freed
    keep_solutions: int = 20      # LoopSolutions kept for inspection (`loops`)
    max_graph_nodes: int = 300    # a live segment's pose graph is compacted beyond this many nodes ...
    keep_recent: int = 40         # ... never touching its latest nodes (the tracker's window and more)
    # image (optical-flow) verification, when the map-point descriptors do not match (blur, turns,
    # each keyframe triangulating its own corners): see `_verify_flow`
    flow_verify: bool = True
    near_candidates: int = 2      # candidates by pose besides the words: the nearest older keyframes ...
    near_dist: float = 1.0        # ... whose centre is within this × the query's median depth ...
    near_deg: float = 45.0        # ... and whose optical axis is within this angle of the query's
    flow_max_per_query: int = 3   # flow verifications per query and database (each a dense flow on the worker)
    flow_min_frames: int = 4      # ... and only for a query this many frames after the last query that
    # ran one (a fast turn can make a keyframe on every frame: the worker's time stays bounded)
    flow_min_inliers: int = 40    # candidate map points found in the query image that fit one pose
    flow_min_back: int = 15       # ... of which the query's points reproject into the candidate within reprojection px
    flow_min_ratio: float = 0.3   # ... inliers / candidate points that the flow followed
    flow_min_depth_pairs: int = 10  # corners both keyframes mapped whose depths agree (the scale)
    flow_pair_px: float = 2.5     # a flow match lands this close to the other keyframe's own corner
    # keypoint verification (`_verify_keypoints`): the place-recognition ORB corners of both
    # keyframes, each given a depth from the keyframe's own map points around it
    # (relocalisation only: the interpolated depths give a loop's scale too coarsely to correct a
    # segment with, docs/benchmarks_geometric.md "Place recognition that finds real revisits")
    kp_verify: bool = True
    kp_depth_px: float = 15.0     # map points within this radius (640-wide pixels) give a corner its depth ...
    kp_depth_agree: float = 0.15  # ... when at least two of the nearest four agree within this (relative)
    kp_reproj_px: float = 4.0     # PnP / two-way threshold (the interpolated depths are approximate)
    kp_min_inliers: int = 30      # candidate corners that fit the query's pose ...
    kp_min_back: int = 15         # ... query corners that reproject into the candidate ...
    kp_min_depth_pairs: int = 10  # ... and matches with a depth on both sides that agree (the scale)
    image_quality: int = 90       # JPEG quality of the keyframe images kept for flow verification ...
    image_width: int = 320        # ... and their width (flow verification runs at this size)


@dataclass
class KeyframeNode:
    fid: int
    segment: int
    index: int                   # keyframes of its segment added before it (gaps count in these)
    T_produced: np.ndarray       # c2w as sent to the client (rigid)
    uv: np.ndarray               # map-point observations, N×2
    P_cam: np.ndarray            # the same points in this keyframe's camera frame (produced units)
    gray: Optional[np.ndarray] = None
    desc: Optional[np.ndarray] = None         # ORB descriptors for place recognition
    a_desc: Optional[np.ndarray] = None       # ORB descriptors at the map points
    a_uv: Optional[np.ndarray] = None
    a_P: Optional[np.ndarray] = None
    m_uv: Optional[np.ndarray] = None         # every map-point observation (float32), for flow verification
    m_P: Optional[np.ndarray] = None
    kp_uv: Optional[np.ndarray] = None        # pixels of the ORB corners of `desc` (coarse image alignment)
    kp_P: Optional[np.ndarray] = None         # those corners in the camera frame (NaN: no depth), float32
    jpg: Optional[np.ndarray] = None          # the grey image, JPEG-compressed (flow verification)
    bow: Optional[np.ndarray] = None
    med_depth: float = 1.0       # median depth of its map points (produced units)
    in_db: bool = True           # in the place-recognition database (False: freed, graph node only)
    similarity: float = 0.0      # best word score against an older keyframe (eviction order)

    def free(self) -> None:
        """Drop everything place recognition / verification needs (the pose stays)."""
        self.uv, self.P_cam = _EMPTY2, _EMPTY3
        self.gray = self.desc = self.a_desc = self.a_uv = self.a_P = None
        self.m_uv = self.m_P = self.kp_uv = self.kp_P = self.jpg = None
        self.in_db = False


_EMPTY2 = np.zeros((0, 2))
_EMPTY3 = np.zeros((0, 3))


@dataclass
class Forget:
    """Keyframes the closer dropped for good (the session may forget their poses). With `segment`
    set: the answer of `end_segment`, `fids` are every keyframe of that segment not in `kept`
    (`kept`: still in the database, matched as places only)."""
    fids: list
    segment: Optional[int] = None
    kept: list = field(default_factory=list)
    segments: list = field(default_factory=list)   # (without `segment`) the segment of each of fids
    merged: list = field(default_factory=list)     # (segment, fid, into fid, R): node fid of a live
    # segment's graph now moves rigidly with node `into`, T_fid = T_into · R (pose-graph compaction)


@dataclass
class LoopSolution:
    """A closed loop: new poses for the nodes 0..query of one segment (node → world)."""
    segment: int
    query_fid: int
    match_fid: int
    inliers: int
    scale: float                 # the loop's relative scale (drift measured by the loop)
    poses: dict = field(default_factory=dict)      # fid → 4×4 similarity
    solve_s: float = 0.0


@dataclass
class SegmentLink:
    """Relocalisation: keyframe `query_fid` of segment `segment` sees the map of the earlier
    segment `target` (keyframe `match_fid`); S maps the query camera frame → the match's."""
    segment: int
    target: int
    query_fid: int
    match_fid: int
    inliers: int
    S: np.ndarray


class LoopCloser:
    """Owns the keyframe database and the pose graph of each segment. `add_keyframe` is called by
    the tracking thread; `detect(fid)` by the worker (one job at a time, in keyframe order)."""

    def __init__(self, K: np.ndarray, params: Optional[LoopParams] = None, px: float = 1.0):
        self.K = np.asarray(K, np.float64)
        self.p = params or LoopParams()
        self.px = px
        self.orb = cv2.ORB_create(800)
        self.nodes: dict[int, KeyframeNode] = {}             # fid → node
        self.by_segment: dict[int, list[int]] = {}           # segment → fids in order
        self.edges: dict[int, list] = {}                     # segment → [(fid_i, fid_j, Z, info, huber)]
        self.T_est: dict[int, np.ndarray] = {}               # worker's current pose of each node
        self._lock = threading.Lock()
        self._arrivals: list = []                            # (fid, session epoch) not yet seen by the worker
        self._corrections: list = []                         # (segment, C_last) of solutions, in order ...
        self._corr_base = 0                                  # ... from this solution index on (older ones dropped)
        self.db: dict[int, None] = {}                        # place-recognition database: fids, oldest first
        self._forgotten: list = []                           # evicted keyframes of ended segments, to report
        self._merged: list = []                              # (segment, fid, into fid, relative pose): compacted nodes
        self._n_added: dict[int, int] = {}                   # segment → keyframes added
        self.keyframes_culled = 0                            # redundant keyframes freed on arrival
        self.keyframes_evicted = 0                           # keyframes dropped by the database cap
        self._linked: dict[int, int] = {}                    # segment → the earlier segment it was placed in
        self.vocab: Optional[np.ndarray] = None              # words × 32 uint8
        self._vocab_bits: Optional[np.ndarray] = None
        self._df: Optional[np.ndarray] = None
        self._n_docs = 0
        self.loops: collections.deque = collections.deque(maxlen=self.p.keep_solutions)   # latest LoopSolutions
        self.loops_closed = 0
        self.loops_rejected = 0                              # verified loops the odometry could not follow
        self.loops_consistent = 0                            # verified loops the map already agreed with
        self.detect_cpu: collections.deque = collections.deque(maxlen=200)
        self.verified_descriptors = 0                        # verifications passed by map-point descriptors
        self.verified_flow = 0                               # ... by optical flow (`_verify_flow`)
        self.verified_keypoints = 0                          # ... by place-recognition corners (`_verify_keypoints`)
        self.flow_attempts = 0
        self._last_flow_fid = -10 ** 9                       # the last query that ran a flow verification
        self._flow_allowed = True

    # --- tracking thread ------------------------------------------------------------------------
    def add_keyframe(self, fid: int, segment: int, c2w_produced: np.ndarray, T_current_of, uv: np.ndarray,
                     P_cam: np.ndarray, gray: np.ndarray, covisible: dict, epoch: int,
                     tracker_poses: Optional[dict] = None) -> None:
        """Register a keyframe. T_current_of(fid) gives the session's current pose (node → world)
        of an earlier node; odometry / covisibility edges are taken from those poses, which are in
        the same world as this keyframe's produced pose. covisible: earlier fid → shared points.
        epoch: how many of this closer's solutions the session had applied (its world).
        tracker_poses: the tracker's current c2w of earlier keyframes (in this keyframe's world), for
        the covisibility edges' agreement check (`covis_agree_deg`).
        (Measuring those edges from the tracker's poses instead was tried: ICL fbfbf with artificial
        drift 3.3 cm after correction, against 0.75 cm with the check.)"""
        with self._lock:
            fids = self.by_segment.setdefault(segment, [])
            index = self._n_added.get(segment, 0)
            self._n_added[segment] = index + 1
            node = KeyframeNode(fid, segment, index, np.array(c2w_produced, np.float64),
                                np.asarray(uv, np.float64).reshape(-1, 2), np.asarray(P_cam, np.float64).reshape(-1, 3),
                                gray=gray)
            edges = self.edges.setdefault(segment, [])
            linked = set()
            tp = tracker_poses or {}
            if fids:
                prev = fids[-1]
                edges.append((prev, fid, sim3_inverse(T_current_of(prev)) @ node.T_produced,
                              self.p.odo_information, None))
                linked.add(prev)
            strong = sorted(((n, f) for f, n in covisible.items() if n >= self.p.covis_min_points), reverse=True)
            z = node.P_cam[:, 2]
            depth = float(np.median(z[z > 0])) if (z > 0).any() else 1.0
            n_covis = 0
            # (without the agreement check: the strongest few, as before; with it: the strongest
            # few that agree)
            for n, f in strong if self.p.covis_agree_deg > 0 else strong[: self.p.covis_max_edges]:
                if n_covis >= self.p.covis_max_edges:
                    break
                if f in linked or f not in self.nodes or self.nodes[f].segment != segment:
                    continue
                if self.p.covis_agree_deg > 0 and not self._same_world(T_current_of(f), tp.get(f), depth):
                    continue
                n_covis += 1
                w = self.p.odo_information * min(n, 150) / 100.0
                edges.append((f, fid, sim3_inverse(T_current_of(f)) @ node.T_produced, w, None))
            node.med_depth = depth
            fids.append(fid)
            self.nodes[fid] = node
            self.db[fid] = None
            self._arrivals.append((fid, epoch))

    def _same_world(self, T_corrected: np.ndarray, T_tracker: Optional[np.ndarray], depth: float) -> bool:
        """The closer's pose of a keyframe and the tracker's current one are the same (one world)."""
        if T_tracker is None:
            return False
        s, R, t = sim3_split(sim3_inverse(T_corrected) @ T_tracker)
        ang = np.degrees(np.arccos(np.clip((np.trace(R) - 1.0) / 2.0, -1.0, 1.0)))
        tol = self.p.covis_agree_trans
        return ang <= self.p.covis_agree_deg and np.linalg.norm(t) <= tol * depth and abs(np.log(s)) <= tol

    def end_segment(self, segment: int) -> Forget:
        """Worker: segment `segment` has ended (its keyframes' detections are done, queued before
        this call). Its pose graph goes, and so does every node not in the database."""
        with self._lock:
            fids = self.by_segment.pop(segment, [])
            self.edges.pop(segment, None)
            kept = [f for f in fids if self.nodes[f].in_db]
            for f in fids:
                if not self.nodes[f].in_db:
                    del self.nodes[f]
                    self.T_est.pop(f, None)
            for f in kept:
                self.nodes[f].gray = None
            if kept:
                self.by_segment[segment] = kept   # matched as a place only, never solved again
            self._linked.pop(segment, None)
            self._n_added.pop(segment, None)
        return Forget([f for f in fids if f not in set(kept)], segment, kept)

    def memory(self) -> dict:
        """Sizes of what the closer holds (for soak benchmarks and tests)."""
        with self._lock:
            nodes = list(self.nodes.values())
            n_edges = sum(len(e) for e in self.edges.values())
            n_seg = len(self.by_segment)
        arrays = sum(a.nbytes for n in nodes for a in (n.uv, n.P_cam, n.gray, n.desc, n.a_desc, n.a_uv, n.a_P, n.bow,
                                                         n.m_uv, n.m_P, n.kp_uv, n.kp_P, n.jpg)
                     if a is not None)
        return {"nodes": len(nodes), "database": len(self.db), "edges": n_edges, "segments": n_seg,
                "estimates": len(self.T_est), "corrections": len(self._corrections),
                "node_bytes": int(arrays), "culled": self.keyframes_culled, "evicted": self.keyframes_evicted}

    # --- worker ---------------------------------------------------------------------------------
    def detect(self, fid: int) -> list:
        """Features, place recognition, verification and (on a loop) the pose-graph solve for
        keyframe `fid`; returns the `SegmentLink` / `LoopSolution`s found (usually none). Runs on
        the worker thread, one call at a time, in keyframe order."""
        c0 = time.thread_time()
        try:
            return self._detect(fid)
        finally:
            self.detect_cpu.append(time.thread_time() - c0)

    def _bring_estimates(self):
        """Initial values of new nodes in the worker's world: a node produced before the session
        applied our later solutions lives in the session's older world, so it moves with the
        corrections of those solutions (only initial values: the optimum depends on the edges)."""
        with self._lock:
            arr, self._arrivals = self._arrivals, []
        for f, epoch in arr:
            T = self.nodes[f].T_produced
            for seg, C in self._corrections[max(epoch - self._corr_base, 0):]:
                if seg == self.nodes[f].segment:
                    T = C @ T
            self.T_est[f] = T
        if arr:
            # later arrivals come from a session that applied at least this many solutions
            drop = arr[-1][1] - self._corr_base
            if drop > 0:
                del self._corrections[:drop]
                self._corr_base += drop

    def _detect(self, fid: int) -> list:
        node = self.nodes[fid]
        try:
            return self._detect_node(node)
        finally:
            node.gray = None     # (kept through the verifications as the query image)

    def _detect_node(self, node: KeyframeNode) -> list:
        fid = node.fid
        self._flow_allowed = fid - self._last_flow_fid >= self.p.flow_min_frames
        self._bring_estimates()
        self._features(node)
        self._update_vocab()
        if self.vocab is None or node.bow is None:
            return []
        out = []
        with self._lock:   # the tracking thread adds keyframes meanwhile
            fids = list(self.by_segment[node.segment])
            db = [f for f in self.db if f in self.nodes]
        k = node.index
        pos = fids.index(fid)
        prev = self.nodes.get(fids[pos - 1]) if pos > 0 else None
        ref = self._score(node.bow, prev.bow) if prev is not None and prev.bow is not None else 0.0
        if prev is not None and not prev.in_db:
            prev.bow = None    # kept only for this score
        # the place in the map of an earlier segment: relocalisation while unlinked, afterwards a
        # redundancy check (a revisited place need not be stored again)
        others = [f for f in db if self.nodes[f].segment < node.segment and self.nodes[f].bow is not None]
        close = None
        best = self._best_match(node, others, ref, corners=self.p.kp_verify)
        if best is not None:
            cand, n_inl, S = best
            if node.segment not in self._linked:
                self._linked[node.segment] = cand.segment
                out.append(SegmentLink(node.segment, cand.segment, fid, cand.fid, n_inl, S))
            close = cand if self._covers(cand, S) else None
        if k > self.p.min_gap:
            older = [f for f in fids[:pos] if self.nodes[f].index < k - self.p.min_gap and f in self.db
                     and self.nodes[f].bow is not None]
            best = self._best_match(node, older, ref, near=True)
            if best is not None:
                cand, n_inl, S = best
                # S maps query camera frame → candidate camera frame: T_q ≈ T_c · S
                with self._lock:
                    self.edges[node.segment].append((cand.fid, fid, S, self.p.loop_information, self.p.loop_huber))
                if close is None and self._covers(cand, S):
                    close = cand
                if self._agrees(node, cand, S):
                    # the map already agrees with the loop (no drift to speak of): keep the edge for
                    # later solves, but do not move the map for noise
                    self.loops_consistent += 1
                else:
                    sol = self._solve(node, cand, n_inl, S)
                    if sol is not None:
                        out.append(sol)
        if close is not None:
            self._cull(node)
        else:
            self._cap()
        self._compact(node.segment)
        if self._forgotten or self._merged:
            out.append(Forget([f for f, _ in self._forgotten], segments=[g for _, g in self._forgotten],
                              merged=self._merged))
            self._forgotten, self._merged = [], []
        return out

    def _compact(self, segment: int) -> None:
        """Pose-graph compaction of a live segment longer than `max_graph_nodes`: the oldest nodes
        that left the database (redundant or evicted) are merged into the node before them — they
        move rigidly with it from now on (relative pose from the current estimates) and their edges
        are re-attached to it, loop edges included. The first node (gauge), database nodes and the
        `keep_recent` latest nodes stay."""
        with self._lock:
            fids = self.by_segment.get(segment, [])
            excess = len(fids) - self.p.max_graph_nodes
            if excess <= 0:
                return
            victims = [f for f in fids[1:-self.p.keep_recent] if not self.nodes[f].in_db][:excess]
            if not victims:
                return
            gone = set()
            parent = {}
            for f in fids:
                if f in victims:
                    p = parent.get(prev_kept, prev_kept)
                    parent[f] = p
                    gone.add(f)
                else:
                    prev_kept = f
            rel = {c: sim3_inverse(self.T_est[p]) @ self.T_est[c] for c, p in parent.items()}
            edges = []
            for i, j, Z, info, hub in self.edges.get(segment, []):
                if i in gone:
                    i, Z = parent[i], rel[i] @ Z
                if j in gone:
                    j, Z = parent[j], Z @ sim3_inverse(rel[j])
                if i != j:
                    edges.append((i, j, Z, info, hub))
            self.edges[segment] = edges
            self.by_segment[segment] = [f for f in fids if f not in gone]
            for c, p in parent.items():
                del self.nodes[c]
                self.T_est.pop(c, None)
                self._merged.append((segment, c, p, rel[c]))

    def _covers(self, cand: KeyframeNode, S: np.ndarray) -> bool:
        """Whether database keyframe `cand` sees the place from nearly the query's viewpoint
        (S: query camera frame → cand camera frame)."""
        s, R, t = sim3_split(S)
        ang = np.degrees(np.arccos(np.clip((np.trace(R) - 1.0) / 2.0, -1.0, 1.0)))
        return ang < self.p.cull_deg and float(np.linalg.norm(t)) < self.p.cull_dist * cand.med_depth

    def _cull(self, node: KeyframeNode) -> None:
        """A redundant new keyframe leaves the database (it stays a node of its segment's graph);
        its words stay until the next keyframe's reference score is taken."""
        with self._lock:
            self.db.pop(node.fid, None)
            bow = node.bow
            node.free()
            node.bow = bow
        self.keyframes_culled += 1

    def _cap(self) -> None:
        """Database over `max_keyframes`: the keyframe most similar to an older one goes (ties:
        the oldest); it keeps its pose-graph node while its segment lives."""
        while len(self.db) > self.p.max_keyframes:
            with self._lock:
                victim = max(self.db, key=lambda f: (self.nodes[f].similarity, -f))
                self.db.pop(victim)
                node = self.nodes[victim]
                node.free()
                node.bow = None
                if node.segment not in self.edges:   # an ended segment: nothing refers to it any more
                    del self.nodes[victim]
                    self.T_est.pop(victim, None)
                    rest = [f for f in self.by_segment.get(node.segment, []) if f != victim]
                    if rest:
                        self.by_segment[node.segment] = rest
                    else:
                        self.by_segment.pop(node.segment, None)
                    self._forgotten.append((victim, node.segment))
            self.keyframes_evicted += 1

    def _agrees(self, node, cand, S) -> bool:
        """Whether the current estimate already satisfies the loop edge within its noise."""
        r = sim3_log(sim3_inverse(S) @ sim3_inverse(self.T_est[cand.fid]) @ self.T_est[node.fid])
        med = node.med_depth
        return (np.degrees(np.linalg.norm(r[:3])) < self.p.agree_deg
                and np.linalg.norm(r[3:6]) < self.p.agree_trans * med and abs(r[6]) < self.p.agree_scale)

    def _best_match(self, node, fids, ref, near: bool = False, corners: bool = False):
        """The verified candidate among keyframes `fids` with the most inliers: (node, inliers, S).
        Candidates: the best `n_candidates` by words (above the score ratio) and, with `near` (same
        segment, so the worker's poses share a world), the `near_candidates` older keyframes nearest
        the query's current pose that look the same way. Each is verified by map-point descriptors
        (with `corners`, then by the place-recognition corners, `_verify_keypoints`);
        if none passes, those are tried by optical flow (`_verify_flow`), at most `flow_max_per_query`, in
        turn the nearest by pose, the best by words, the next nearest, ... (the loop worker's time
        per keyframe stays bounded when tracking makes a keyframe on every frame of a fast turn)."""
        if not fids:
            return None
        scores = np.array([self._score(node.bow, self.nodes[f].bow) for f in fids])
        node.similarity = max(node.similarity, float(scores.max()))
        cands = []
        for o in np.argsort(-scores)[: self.p.n_candidates]:
            if scores[o] < self.p.min_score_ratio * ref:
                break
            cands.append(fids[o])
        near_f = []
        if near and self.p.flow_verify and self.p.near_candidates > 0:
            near_f = [f for f in self._near(node, fids) if f not in cands][: self.p.near_candidates]
        best = None
        failed = []
        for f in cands + near_f:
            res = self._verify(node, self.nodes[f])
            if res is not None:
                self.verified_descriptors += 1
            elif corners:
                res = self._verify_keypoints(node, self.nodes[f])
                self.verified_keypoints += res is not None
            if res is not None:
                if best is None or res[1] > best[1]:
                    best = (self.nodes[f], res[1], res[0])
            else:
                failed.append(f)
        if self.p.flow_verify and failed and best is None and self._flow_allowed:
            self._last_flow_fid = node.fid
            # flow verification (costlier; only when no candidate verified by descriptors) in
            # turn: the nearest by pose, the best by words, ...
            order = []
            for pair in zip(near_f + [None] * len(cands), cands + [None] * len(near_f)):
                order += [f for f in pair if f is not None and f in failed and f not in order]
            for f in order[: self.p.flow_max_per_query]:
                res = self._verify_flow(node, self.nodes[f])
                self.verified_flow += res is not None
                if res is not None and (best is None or res[1] > best[1]):
                    best = (self.nodes[f], res[1], res[0])
        return best

    def _near(self, node, fids) -> list:
        """Keyframes of `fids` whose current pose is near the query's (centre within `near_dist` ×
        its median depth, optical axes within `near_deg`), nearest first."""
        Tq = self.T_est.get(node.fid)
        if Tq is None:
            return []
        sq = float(np.cbrt(np.linalg.det(Tq[:3, :3])))
        zq = Tq[:3, 2] / sq
        out = []
        for f in fids:
            Tc = self.T_est.get(f)
            n = self.nodes.get(f)
            if Tc is None or n is None or n.jpg is None:
                continue
            d = float(np.linalg.norm(Tc[:3, 3] - Tq[:3, 3]))
            zc = Tc[:3, 2] / float(np.cbrt(np.linalg.det(Tc[:3, :3])))
            ang = np.degrees(np.arccos(np.clip(float(zq @ zc), -1.0, 1.0)))
            if d < self.p.near_dist * node.med_depth * sq and ang < self.p.near_deg:
                out.append((d, f))
        return [f for _, f in sorted(out)]

    def _solve(self, node, cand, n_inl, S) -> Optional[LoopSolution]:
        t0 = time.perf_counter()
        seg = node.segment
        with self._lock:
            fids = [f for f in self.by_segment[seg] if self.nodes[f].index <= node.index]
            edges = list(self.edges[seg])
        slot = {f: i for i, f in enumerate(fids)}
        g = Sim3PoseGraph()
        for i, f in enumerate(fids):
            g.add_node(self.T_est[f], fixed=(i == 0))
        for fi, fj, Z, info, hub in edges:
            if fi in slot and fj in slot:
                g.add_edge(slot[fi], slot[fj], Z, information=info, huber=hub)
        g.optimize(iterations=30)
        new = {f: g.pose(i) for i, f in enumerate(fids)}
        if not self._plausible(g, edges, slot):
            # the loop bends the odometry more than drift can: a false match; forget its edge
            with self._lock:
                self.edges[seg] = [e for e in self.edges[seg] if not (e[0] == cand.fid and e[1] == node.fid)]
            self.loops_rejected += 1
            return None
        C_last = new[fids[-1]] @ sim3_inverse(self.T_est[fids[-1]])
        for f in list(self.T_est):
            if f not in new and self.nodes[f].segment == seg:   # (T_est is the worker's own)
                self.T_est[f] = C_last @ self.T_est[f]   # later nodes already handed to us
        self.T_est.update(new)
        self._corrections.append((seg, C_last))
        sol = LoopSolution(seg, node.fid, cand.fid, n_inl, sim3_split(S)[0], new, time.perf_counter() - t0)
        self.loops.append(sol)
        self.loops_closed += 1
        return sol

    def _plausible(self, g: Sim3PoseGraph, edges, slot) -> bool:
        """Whether the solved graph deforms every odometry edge (no Huber kernel) by no more than
        drift can between two keyframes: rotation, scale, and translation relative to the edge."""
        for fi, fj, Z, _info, hub in edges:
            if hub is not None or fi not in slot or fj not in slot:
                continue
            r = sim3_log(sim3_inverse(Z) @ sim3_inverse(g.pose(slot[fi])) @ g.pose(slot[fj]))
            length = max(float(np.linalg.norm(Z[:3, 3])), 1e-9)
            if (np.degrees(np.linalg.norm(r[:3])) > self.p.max_edge_deg or abs(r[6]) > self.p.max_edge_scale
                    or np.linalg.norm(r[3:6]) > self.p.max_edge_trans * length + 1e-3):
                return False
        return True

    # --- features and words ---------------------------------------------------------------------
    def _features(self, node: KeyframeNode) -> None:
        gray = node.gray
        kps, desc = self.orb.detectAndCompute(gray, None)
        node.desc = desc if desc is not None and len(desc) else None
        node.kp_uv = np.array([k.pt for k in kps], np.float32).reshape(-1, 2) if node.desc is not None else None
        if self.p.kp_verify and node.kp_uv is not None:
            node.kp_P = _corner_points(node.kp_uv, node.uv, node.P_cam, self.K, self.p.kp_depth_px * self.px,
                                       self.p.kp_depth_agree)
        if self.p.flow_verify:
            node.m_uv = node.uv.astype(np.float32)
            node.m_P = node.P_cam.astype(np.float32)
            ok, buf = cv2.imencode(".jpg", self._small(gray), [cv2.IMWRITE_JPEG_QUALITY, int(self.p.image_quality)])
            node.jpg = buf if ok else None
        if len(node.uv):
            ang = _centroid_angles(gray, node.uv)
            kp = [cv2.KeyPoint(float(u), float(v), 31, float(a)) for (u, v), a in zip(node.uv, ang)]
            idx_of = {}
            for i, q in enumerate(kp):
                idx_of[(round(q.pt[0], 3), round(q.pt[1], 3))] = i
            kp2, ad = self.orb.compute(gray, kp)
            if ad is not None and len(kp2):
                keep = [idx_of.get((round(q.pt[0], 3), round(q.pt[1], 3)), -1) for q in kp2]
                ok = np.array([k >= 0 for k in keep])
                keep = np.array(keep)[ok]
                node.a_desc = ad[ok]
                node.a_uv = node.uv[keep]
                node.a_P = node.P_cam[keep]
        node.uv, node.P_cam = _EMPTY2, _EMPTY3    # verification uses the a_* subset only
        if self.vocab is not None and node.desc is not None:
            node.bow = self._bow(node.desc)

    def _update_vocab(self):
        if self.vocab is not None:
            return
        with self._lock:
            nodes = list(self.nodes.values())
        descs = [n.desc for n in nodes if n.desc is not None]
        total = sum(len(d) for d in descs)
        if total < self.p.vocab_min_descriptors:
            return
        D = np.concatenate(descs)
        D = D[np.random.default_rng(0).permutation(len(D))[: self.p.vocab_min_descriptors]]
        bits = np.unpackbits(D, axis=1).astype(np.float32)
        crit = (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_MAX_ITER, 10, 1e-3)
        cv2.setRNGSeed(0)
        _, _, centers = cv2.kmeans(bits, self.p.vocab_words, None, crit, 1, cv2.KMEANS_PP_CENTERS)
        self.vocab = np.packbits((centers > 0.5).astype(np.uint8), axis=1)
        self._df = np.zeros(self.p.vocab_words)
        self._matcher = cv2.BFMatcher(cv2.NORM_HAMMING)
        for n in nodes:
            if n.desc is not None:
                n.bow = self._bow(n.desc)

    def _words(self, desc):
        m = self._matcher.match(desc, self.vocab)
        return np.array([x.trainIdx for x in m], int)

    def _bow(self, desc) -> np.ndarray:
        w = self._words(desc)
        tf = np.bincount(w, minlength=self.p.vocab_words).astype(np.float64)
        self._df += tf > 0
        self._n_docs += 1
        return tf

    def _score(self, a, b) -> float:
        idf = np.log((self._n_docs + 1.0) / (self._df + 1.0))
        va, vb = a * idf, b * idf
        na, nb = np.abs(va).sum(), np.abs(vb).sum()
        if na <= 0 or nb <= 0:
            return 0.0
        return float(1.0 - 0.5 * np.abs(va / na - vb / nb).sum())

    # --- verification ---------------------------------------------------------------------------
    def _verify(self, q: KeyframeNode, c: KeyframeNode):
        if q.a_desc is None or c.a_desc is None or len(q.a_desc) < self.p.min_matches or len(c.a_desc) < 2:
            return None
        knn = cv2.BFMatcher(cv2.NORM_HAMMING).knnMatch(q.a_desc, c.a_desc, k=2)
        pairs = [(m[0].queryIdx, m[0].trainIdx) for m in knn
                 if len(m) == 2 and m[0].distance < 0.8 * m[1].distance and m[0].distance < 64]
        if len(pairs) < self.p.min_matches:
            return None
        qi, ci = np.array(pairs).T
        Pq, Pc = q.a_P[qi], c.a_P[ci]
        uq, uc = q.a_uv[qi], c.a_uv[ci]
        thr = self.p.reproj_px * self.px
        # the candidate's points seen in the query image: PnP gives the rigid part precisely
        ok, rvec, tvec, inl = cv2.solvePnPRansac(Pc, uq, self.K, None, iterationsCount=self.p.ransac_iters,
                                                 reprojectionError=thr * 0.5, confidence=0.999,
                                                 flags=cv2.SOLVEPNP_EPNP)
        if not ok or inl is None or len(inl) < self.p.min_inliers:
            return None
        inl = inl.ravel()
        R_qc, _ = cv2.Rodrigues(rvec)
        t_qc = tvec.ravel()
        # scale: the same points in the query's own (drifted) units
        zq = Pq[inl, 2]
        xq = Pc[inl] @ R_qc.T + t_qc
        good = (zq > 1e-9) & (xq[:, 2] > 1e-9)
        if good.sum() < self.p.min_inliers:
            return None
        sig = float(np.median(xq[good, 2] / zq[good]))
        S = sim3_matrix(sig, R_qc.T, -R_qc.T @ t_qc)
        S = self._refine(S, Pq, Pc, uq, uc, thr)
        s, R, t = sim3_split(S)
        inl = self._two_way(s, R, t, Pq, Pc, uq, uc, thr)
        if inl.sum() < self.p.min_inliers:
            return None
        S = self._refine(S, Pq[inl], Pc[inl], uq[inl], uc[inl], thr)
        s, R, t = sim3_split(S)
        inl = self._two_way(s, R, t, Pq, Pc, uq, uc, thr)
        if inl.sum() < self.p.min_inliers:
            return None
        return S, int(inl.sum())

    def _refine(self, S, Pq, Pc, uq, uc, thr):
        """Sim(3) that minimises the two-way reprojection errors (Huber), from S: `_refine_sets`
        with the same matched points in all three sets."""
        return self._refine_sets(S, Pc, uq, Pq, uc, Pq, Pc, thr, self.K)

    def _two_way(self, s, R, t, Pq, Pc, uq, uc, thr):
        X = s * Pq @ R.T + t                       # query points in the candidate frame
        Y = (Pc - t) @ R / s                       # candidate points in the query frame
        return _reprojects(X, uc, thr, self.K) & _reprojects(Y, uq, thr, self.K)


    # --- verification by the place-recognition corners ---------------------------------------------
    def _verify_keypoints(self, q: KeyframeNode, c: KeyframeNode):
        """Verification with the ORB corners of place recognition instead of the map points: each
        keyframe triangulated its own KLT corners, so the two keyframes' map points rarely coincide
        and their descriptors rarely match, while the ORB corners of a revisited place do. A corner
        takes its depth from the keyframe's map points around it (`_corner_points`). Ratio-test
        matches; PnP-RANSAC of the candidate's corners in the query image (rigid part); the scale from
        the matches with a depth on both sides; then the Sim(3) refinement of `_refine_sets` (the
        candidate corners' reprojections in the query, the query corners' in the candidate, the log
        depth ratios). Accepted with ≥ `kp_min_inliers`, ≥ `kp_min_back` and ≥ `kp_min_depth_pairs`
        inliers. Returns (S, inliers) like `_verify`, or None."""
        p = self.p
        if q.desc is None or c.desc is None or q.kp_P is None or c.kp_P is None or len(c.desc) < 2:
            return None
        knn = cv2.BFMatcher(cv2.NORM_HAMMING).knnMatch(q.desc, c.desc, k=2)
        m = [(a.queryIdx, a.trainIdx) for a, *b in knn if b and a.distance < 0.8 * b[0].distance and a.distance < 64]
        if len(m) < p.kp_min_inliers:
            return None
        qi, ci = np.array(m).T
        has_c = np.isfinite(c.kp_P[ci, 0])
        if has_c.sum() < p.kp_min_inliers:
            return None
        thr = p.kp_reproj_px * self.px
        Pc = c.kp_P[ci[has_c]].astype(np.float64)
        uq = q.kp_uv[qi[has_c]].astype(np.float64)
        ok, rvec, tvec, inl = cv2.solvePnPRansac(Pc, uq, self.K, None, iterationsCount=self.p.ransac_iters,
                                                 reprojectionError=thr, confidence=0.999, flags=cv2.SOLVEPNP_EPNP)
        if not ok or inl is None or len(inl) < p.kp_min_inliers:
            return None
        inl = inl.ravel()
        R_qc, _ = cv2.Rodrigues(rvec)
        t_qc = tvec.ravel()
        both = has_c & np.isfinite(q.kp_P[qi, 0])
        qb, cb = qi[both], ci[both]
        Pq_d, Pc_d = q.kp_P[qb].astype(np.float64), c.kp_P[cb].astype(np.float64)
        xq = Pc_d @ R_qc.T + t_qc
        good = (xq[:, 2] > 1e-9) & (Pq_d[:, 2] > 1e-9)
        if good.sum() < p.kp_min_depth_pairs:
            return None
        # the scale from the matches PnP kept (a robust median of their depth ratios)
        kept = np.isin(np.flatnonzero(both), np.flatnonzero(has_c)[inl]) & good
        if kept.sum() < p.kp_min_depth_pairs:
            return None
        sig = float(np.median(xq[kept, 2] / Pq_d[kept, 2]))
        S = sim3_matrix(sig, R_qc.T, -R_qc.T @ t_qc)
        uc_b = c.kp_uv[cb].astype(np.float64)
        full = (Pc, uq, Pq_d, uc_b, Pq_d, Pc_d)
        ia, ib, idd = self._inliers_sets(S, *full, thr, self.K)
        for _ in range(2):
            S = self._refine_sets(S, Pc[ia], uq[ia], Pq_d[ib], uc_b[ib], Pq_d[idd], Pc_d[idd], thr, self.K)
            ia, ib, idd = self._inliers_sets(S, *full, thr, self.K)
        if ia.sum() < p.kp_min_inliers or ib.sum() < p.kp_min_back or idd.sum() < p.kp_min_depth_pairs:
            return None
        return S, int(ia.sum() + ib.sum())

    # --- image verification by optical flow -------------------------------------------------------
    def _verify_flow(self, q: KeyframeNode, c: KeyframeNode):
        """Verification without shared descriptors: the candidate's map points are followed into the
        query image by pyramidal Lucas-Kanade (forward-backward checked) after a coarse alignment of
        the two images (a homography from ORB matches, or the rotation between the two current pose
        estimates, or none), the best alignment's matches give the pose by PnP-RANSAC; the query's map
        points are followed into the candidate image the same way; corners that both keyframes
        mapped (a flow match within `flow_pair_px` of the other keyframe's own corner) give the scale
        from their depths. A Sim(3) refinement of both sets' reprojection errors and the pairs' log
        depth ratios follows (as in `_verify`). Accepted with ≥ `flow_min_inliers` candidate points
        and ≥ `flow_min_back` query points within `reproj_px`, ≥ `flow_min_ratio` of the followed
        candidate points inliers, and ≥ `flow_min_depth_pairs` pairs whose depths agree.
        Returns (S, inliers) like `_verify`, or None."""
        p = self.p
        if (q.gray is None or c.jpg is None or q.m_uv is None or c.m_uv is None
                or len(c.m_uv) < p.flow_min_inliers or len(q.m_uv) < p.flow_min_back):
            return None
        self.flow_attempts += 1
        gq = self._small(q.gray)
        gc = cv2.imdecode(c.jpg, cv2.IMREAD_GRAYSCALE)
        if gc is None or gc.shape != gq.shape:
            return None
        f = gq.shape[1] / q.gray.shape[1]              # the flow runs at `image_width`
        D = np.diag([f, f, 1.0])
        K = D @ self.K
        thr = p.reproj_px * self.px * f
        quv, cuv = q.m_uv * f, c.m_uv * f
        best = None
        for H in self._alignments(q, c):
            Hs = D @ H @ np.linalg.inv(D)               # the alignment at the flow's image size
            r = self._flow_pnp(gq, gc, Hs, cuv, c.m_P, thr, K)
            if r is not None and (best is None or r[0] > best[0]):
                best = r + (Hs,)
        if best is None or best[0] < p.flow_min_inliers:
            return None
        _, rvec, tvec, idx_a, uq_a, n_followed, H = best
        if best[0] < p.flow_min_ratio * n_followed:
            return None
        Pc_a = c.m_P[idx_a].astype(np.float64)
        uq_a = uq_a.astype(np.float64)
        # corners both keyframes mapped (a followed candidate point lands within `flow_pair_px` of
        # one of the query's own corners): 3-D on both sides, so they give the scale, and the query
        # points' reprojections in the candidate image (b)
        pairs = {}
        for i, u in zip(idx_a, uq_a):
            j = _nearest(quv, u, p.flow_pair_px * f)
            if j >= 0 and j not in pairs:
                pairs[j] = int(i)
        if len(pairs) < max(p.flow_min_depth_pairs, p.flow_min_back):
            return None
        qj = np.array(list(pairs.keys()))
        ci = np.array(list(pairs.values()))
        Pq_d, Pc_d = q.m_P[qj].astype(np.float64), c.m_P[ci].astype(np.float64)
        Pq_b, uc_b = Pq_d, cuv[ci].astype(np.float64)
        R_qc, _ = cv2.Rodrigues(rvec)
        t_qc = tvec.ravel()
        xq = Pc_d @ R_qc.T + t_qc                      # pair points in the query frame, candidate units
        good = (Pq_d[:, 2] > 1e-9) & (xq[:, 2] > 1e-9)
        if good.sum() < p.flow_min_depth_pairs:
            return None
        sig = float(np.median(xq[good, 2] / Pq_d[good, 2]))
        S = sim3_matrix(sig, R_qc.T, -R_qc.T @ t_qc)
        full = (Pc_a, uq_a, Pq_b, uc_b, Pq_d, Pc_d)
        sets = full
        for _ in range(2):
            S = self._refine_sets(S, *sets, thr, K)
            ia, ib, idd = self._inliers_sets(S, *full, thr, K)
            sets = (Pc_a[ia], uq_a[ia], Pq_b[ib], uc_b[ib], Pq_d[idd], Pc_d[idd])
        S = self._refine_sets(S, *sets, thr, K)
        ia, ib, idd = self._inliers_sets(S, *full, thr, K)
        if ia.sum() < p.flow_min_inliers or ib.sum() < p.flow_min_back or idd.sum() < p.flow_min_depth_pairs:
            return None
        return S, int(ia.sum() + ib.sum())

    def _small(self, gray: np.ndarray) -> np.ndarray:
        """The grey image at `image_width` (never enlarged)."""
        h, w = gray.shape
        if w <= self.p.image_width:
            return gray
        f = self.p.image_width / w
        return cv2.resize(gray, (self.p.image_width, max(1, int(round(h * f)))), interpolation=cv2.INTER_AREA)

    def _alignments(self, q: KeyframeNode, c: KeyframeNode) -> list:
        """Coarse image alignments (3×3, candidate pixels → query pixels) to start the flow from."""
        out = []
        if q.desc is not None and c.desc is not None and q.kp_uv is not None and c.kp_uv is not None \
                and len(c.desc) >= 2:
            knn = cv2.BFMatcher(cv2.NORM_HAMMING).knnMatch(c.desc, q.desc, k=2)
            m = [(a.queryIdx, a.trainIdx) for a, *b in knn if b and a.distance < 0.8 * b[0].distance and a.distance < 80]
            if len(m) >= 10:
                ci, qi = np.array(m).T
                H, mask = cv2.findHomography(c.kp_uv[ci], q.kp_uv[qi], cv2.RANSAC, 8.0 * self.px)
                if H is not None and mask is not None and mask.sum() >= 10 and _sane_homography(H):
                    out.append(H)
                A, mask = cv2.estimateAffinePartial2D(c.kp_uv[ci], q.kp_uv[qi], method=cv2.RANSAC,
                                                      ransacReprojThreshold=8.0 * self.px)
                if A is not None and mask is not None and mask.sum() >= 8:
                    out.append(np.vstack([A, [0.0, 0.0, 1.0]]))
        Tq, Tc = self.T_est.get(q.fid), self.T_est.get(c.fid)
        if Tq is not None and Tc is not None and q.segment == c.segment:
            _, R, _ = sim3_split(sim3_inverse(Tq) @ Tc)      # candidate camera → query camera
            out.append(self.K @ R @ np.linalg.inv(self.K))
        if not out:
            out.append(np.eye(3))
        return out

    def _follow(self, g_dst, g_src, H, uv):
        """Pixels `uv` of image g_src followed into image g_dst: g_src is warped by H (src → dst
        pixels) first, so the flow only has to bridge what the alignment left. Returns (indices of
        uv that followed, their pixels in g_dst)."""
        h, w = g_dst.shape
        warped = cv2.warpPerspective(g_src, H, (w, h), flags=cv2.INTER_LINEAR, borderValue=0)
        valid = cv2.warpPerspective(np.full(g_src.shape, 255, np.uint8), H, (w, h), flags=cv2.INTER_NEAREST)
        # brightness constancy is what the flow assumes: the warped image gets the destination's
        # mean and contrast over the part both show (without it an exposure change between the
        # visits loses most of the points the flow follows)
        both = (valid > 0) & (warped > 0) & (g_dst > 0)
        if both.sum() > 1000:
            m1, s1 = float(warped[both].mean()), float(warped[both].std())
            m2, s2 = float(g_dst[both].mean()), float(g_dst[both].std())
            warped = np.clip((warped.astype(np.float32) - m1) * (s2 / max(s1, 1.0)) + m2, 0, 255).astype(np.uint8)
        valid = cv2.erode(valid, np.ones((21, 21), np.uint8))
        p0 = cv2.perspectiveTransform(np.asarray(uv, np.float32).reshape(-1, 1, 2), H).reshape(-1, 2)
        ok = (p0[:, 0] >= 0) & (p0[:, 0] < w - 1) & (p0[:, 1] >= 0) & (p0[:, 1] < h - 1)
        ok[ok] = valid[p0[ok, 1].astype(int), p0[ok, 0].astype(int)] > 0
        idx = np.flatnonzero(ok)
        if len(idx) == 0:
            return idx, np.zeros((0, 2), np.float32)
        a = p0[idx].reshape(-1, 1, 2)
        crit = (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 30, 0.01)
        b, st, _ = cv2.calcOpticalFlowPyrLK(warped, g_dst, a, None, winSize=(21, 21), maxLevel=3, criteria=crit)
        back, st2, _ = cv2.calcOpticalFlowPyrLK(g_dst, warped, b, None, winSize=(21, 21), maxLevel=3, criteria=crit)
        b, back = b.reshape(-1, 2), back.reshape(-1, 2)
        good = (st.ravel() == 1) & (st2.ravel() == 1) & (np.linalg.norm(back - p0[idx], axis=1) < 0.75) \
            & (b[:, 0] >= 0) & (b[:, 0] < w) & (b[:, 1] >= 0) & (b[:, 1] < h)
        return idx[good], b[good]

    def _flow_pnp(self, gq, gc, H, uv_c, P_c, thr, K):
        """The candidate's points followed into the query image from alignment H, and the query's
        pose from them: (inliers, rvec, tvec, indices, query pixels, points followed) or None."""
        idx, uq = self._follow(gq, gc, H, uv_c)
        if len(idx) < self.p.flow_min_inliers:
            return None
        P = P_c[idx].astype(np.float64)
        ok, rvec, tvec, inl = cv2.solvePnPRansac(P, uq.astype(np.float64), K, None,
                                                 iterationsCount=self.p.ransac_iters, reprojectionError=thr * 0.5,
                                                 confidence=0.999, flags=cv2.SOLVEPNP_EPNP)
        if not ok or inl is None or len(inl) < self.p.flow_min_inliers:
            return None
        inl = inl.ravel()
        rvec, tvec = cv2.solvePnPRefineLM(P[inl], uq[inl].astype(np.float64), K, None, rvec, tvec)
        return len(inl), rvec, tvec, idx, uq, len(idx)

    def _refine_sets(self, S, Pc_a, uq_a, Pq_b, uc_b, Pq_d, Pc_d, thr, K):
        """Sim(3) (query camera → candidate camera) minimising the reprojection errors of the
        candidate points in the query image (a), of the query points in the candidate image (b) and
        the log depth ratios of the points both mapped (d); Huber, from S."""
        from scipy.optimize import least_squares

        def proj(X):
            z = np.maximum(X[:, 2], 1e-6)
            return np.stack([K[0, 0] * X[:, 0] / z + K[0, 2], K[1, 1] * X[:, 1] / z + K[1, 2]], 1)

        def res(x):
            s, R, t = sim3_split(S @ sim3_exp(x))
            X = s * Pq_b @ R.T + t
            Y = (Pc_a - t) @ R / s
            Xd = s * Pq_d @ R.T + t
            # depth ratios: when the two cameras nearly coincide the reprojections do not see the
            # scale at all; the points' depths do (a 5 % depth disagreement weighs like 1 px)
            zr = np.log(np.maximum(Xd[:, 2], 1e-9) / np.maximum(Pc_d[:, 2], 1e-9)) * (1.0 / self.p.depth_sigma)
            return np.concatenate([(proj(X) - uc_b).ravel(), (proj(Y) - uq_a).ravel(), zr])

        sol = least_squares(res, np.zeros(7), loss="huber", f_scale=thr / 2, max_nfev=30, method="trf")
        return S @ sim3_exp(sol.x)

    def _inliers_sets(self, S, Pc_a, uq_a, Pq_b, uc_b, Pq_d, Pc_d, thr, K):
        s, R, t = sim3_split(S)
        ia = _reprojects((Pc_a - t) @ R / s, uq_a, thr, K)
        ib = _reprojects(s * Pq_b @ R.T + t, uc_b, thr, K)
        Xd = s * Pq_d @ R.T + t
        idd = (Xd[:, 2] > 1e-9) & (np.abs(np.log(np.maximum(Xd[:, 2], 1e-9) / np.maximum(Pc_d[:, 2], 1e-9)))
                                    < 3.0 * self.p.depth_sigma)
        return ia, ib, idd


def _reprojects(X: np.ndarray, u: np.ndarray, thr: float, K: np.ndarray) -> np.ndarray:
    """Which camera-frame points X (in front of the camera) project within `thr` pixels of u."""
    z = X[:, 2]
    zz = np.maximum(z, 1e-6)
    e = np.hypot(K[0, 0] * X[:, 0] / zz + K[0, 2] - u[:, 0], K[1, 1] * X[:, 1] / zz + K[1, 2] - u[:, 1])
    return (z > 1e-6) & (e < thr)


def _corner_points(kp_uv: np.ndarray, uv: np.ndarray, P_cam: np.ndarray, K: np.ndarray, radius: float,
                   agree: float) -> np.ndarray:
    """Corners `kp_uv` in the keyframe's camera frame (float32 N×3, NaN rows: no depth): each takes
    the median depth of the map points (observed at `uv`, at `P_cam`) among its nearest four within
    `radius` pixels, when at least two are there and they agree within `agree` (relative) — a corner
    on a depth edge, or far from any map point, gets none."""
    from scipy.spatial import cKDTree

    out = np.full((len(kp_uv), 3), np.nan, np.float32)
    z = P_cam[:, 2] if len(P_cam) else np.zeros(0)
    front = z > 1e-9
    if front.sum() < 2 or not len(kp_uv):
        return out
    uv, z = uv[front], z[front]
    k = min(4, len(z))
    d, j = cKDTree(uv).query(kp_uv, k=k, distance_upper_bound=radius)
    near = np.isfinite(d)
    zz = np.where(near, z[np.minimum(j, len(z) - 1)], np.nan)
    n = near.sum(1)
    ok = n >= 2
    if not ok.any():
        return out
    zz = zz[ok]
    med = np.nanmedian(zz, axis=1)
    spread = np.nanmax(np.abs(zz / med[:, None] - 1.0), axis=1)
    idx = np.flatnonzero(ok)[spread < agree]
    med = med[spread < agree]
    ray = np.c_[kp_uv[idx], np.ones(len(idx))] @ np.linalg.inv(K).T
    out[idx] = (ray * med[:, None]).astype(np.float32)
    return out


def _nearest(uv: np.ndarray, u: np.ndarray, r: float) -> int:
    """Index of the row of uv nearest pixel u if within r pixels, else -1."""
    if len(uv) == 0:
        return -1
    d = np.hypot(uv[:, 0] - u[0], uv[:, 1] - u[1])
    j = int(np.argmin(d))
    return j if d[j] <= r else -1


def _sane_homography(H: np.ndarray) -> bool:
    """A homography that a camera turn / moderate viewpoint change can make (no mirror, no extreme
    shear or scale)."""
    A = H[:2, :2] / H[2, 2]
    det = float(np.linalg.det(A))
    return 0.25 < det < 4.0 and abs(H[2, 0] / H[2, 2]) < 2e-3 and abs(H[2, 1] / H[2, 2]) < 2e-3


def _centroid_angles(gray: np.ndarray, uv: np.ndarray, r: int = 15) -> np.ndarray:
    """ORB-style orientation (degrees) of patches around `uv` from the intensity centroid."""
    h, w = gray.shape
    yy, xx = np.mgrid[-r:r + 1, -r:r + 1]
    disk = (xx ** 2 + yy ** 2) <= r * r
    pad = cv2.copyMakeBorder(gray, r, r, r, r, cv2.BORDER_REFLECT).astype(np.float32)
    out = np.zeros(len(uv))
    for k, (u, v) in enumerate(np.round(uv).astype(int)):
        u = min(max(u, 0), w - 1)
        v = min(max(v, 0), h - 1)
        patch = pad[v:v + 2 * r + 1, u:u + 2 * r + 1] * disk
        out[k] = np.degrees(np.arctan2((patch * yy).sum(), (patch * xx).sum())) % 360.0
    return out
