"""Monocular visual odometry on feature tracks (no images in here, so it can be tested on
synthetic observations).

Per frame the caller passes the ids and pixel positions of the live tracks. The tracker
- initialises a map from an essential matrix once the tracks show enough parallax (frames seen
  before that wait and are posed by PnP against the new map, so no frame is skipped),
- tracks each frame by PnP + RANSAC against the map (seeded with a constant-velocity guess),
- makes keyframes on parallax / tracked-ratio rules, triangulates new points at keyframes and
  runs a sliding-window bundle adjustment,
- reuses map points (with a `matcher` from the caller, which sees the images): at a keyframe the
  points of the kept keyframes that are no longer tracked are projected into it and matched again;
  the matches become observations before its bundle adjustment and live tracks after it,
- on tracking loss (too few inliers, an implausible jump) starts a new segment: the map is
  dropped and re-initialised; the new segment starts at the last good pose with the last known
  scene depth, so the client sees a continuation it must treat as unlinked.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import cv2
import numpy as np

from .bundle import bundle_adjust
from .geometry import c2w_from_rt, camera_center, project, rt_from_c2w, slerp_pose, triangulate


@dataclass
class TrackerParams:
    px: float = 1.0                    # pixel scale relative to 640-wide images
    min_init_parallax_px: float = 12.0
    min_init_angle_deg: float = 1.0    # median triangulation angle to accept an initial map
    min_init_points: int = 40
    max_init_frames: int = 300         # frames held waiting for initialisation (memory bound) before the oldest are given up
    min_tri_angle_deg: float = 1.0
    ransac_px: float = 2.0
    min_inliers: int = 15
    kf_max_gap: int = 20
    kf_baseline_ratio: float = 0.06    # camera moved this fraction of the median scene depth
    kf_tracked_ratio: float = 0.65     # tracked map points fell below this fraction of the last keyframe's
    kf_min_points: int = 60
    ba_window: int = 7
    ba_fixed: int = 2
    ba_max_nfev: int = 20
    ba_method: str = "schur"           # "schur" (own LM) | "scipy" (least_squares, sparse Jacobian)
    ba_lsmr_iters: int = 0             # scipy path: 0 = default (exact inner solves)
    ba_lsmr_tol: float = 1e-8
    keep_keyframes: int = 30
    max_jump_ratio: float = 0.6        # centre jump beyond prediction, relative to median depth → lost
    # rotation-aided tracking: when PnP finds too few inliers (fast turns leave few triangulated
    # points in view, and turning creates little parallax for new ones), the rotation since the
    # last frame is fitted to all live tracks and only the translation to the map points left
    rotation_aided: bool = True
    rot_min_tracks: int = 30           # tracks shared with the last frame to fit the rotation
    rot_inlier_ratio: float = 0.6      # of those, consistent with a pure rotation (low parallax)
    rot_min_points: int = 6            # map points that must agree with the translation
    # map-point reuse (needs a `matcher`, see MonoTracker.matcher): at each keyframe, map points
    # no longer tracked are projected into it and matched again, so the bundle adjustment ties the
    # new keyframe to old points instead of re-triangulating the same scene at a drifted scale
    reuse_points: bool = False
    reuse_max: int = 300               # candidates per keyframe (nearest to the image centre first)
    reuse_max_angle_deg: float = 30.0  # viewing direction against the source keyframe's
    reuse_max_scale: float = 1.5       # distance ratio to the point against the source keyframe's


@dataclass
class PosedFrame:
    fid: int
    c2w: np.ndarray
    is_keyframe: bool
    segment: int


@dataclass
class Keyframe:
    fid: int
    R: np.ndarray
    t: np.ndarray
    obs: dict = field(default_factory=dict)    # point id → uv
    median_depth: float = 1.0


@dataclass
class StepResult:
    posed: list = field(default_factory=list)       # PosedFrame, in frame order
    untracked: list = field(default_factory=list)   # frame ids that will never get a pose
    keyframe: bool = False                          # this frame became a keyframe
    need_features: bool = False                     # detect new tracks in this frame
    reset_tracks: bool = False                      # drop all live tracks before detecting
    drop_ids: list = field(default_factory=list)    # tracks to forget (outliers)
    events: list = field(default_factory=list)      # (kind, segment, message)
    revived_ids: list = field(default_factory=list)  # map points matched again at this keyframe:
    revived_uv: list = field(default_factory=list)   # the caller tracks them on from these pixels


def _kabsch(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Rotation R minimising Σ |b_i − R a_i|² (rows of unit vectors)."""
    U, _, Vt = np.linalg.svd(b.T @ a)
    d = np.sign(np.linalg.det(U @ Vt)) or 1.0
    return U @ np.diag([1.0, 1.0, d]) @ Vt


class MonoTracker:
    def __init__(self, K: np.ndarray, params: Optional[TrackerParams] = None):
        self.K = np.asarray(K, np.float64)
        self.p = params or TrackerParams()
        self.segment = 0
        self.origin = np.eye(4)            # c2w of the first frame of the segment
        self.target_depth = 1.0            # median scene depth the initial map is scaled to
        self.base_depth = 1.0              # the first map's (moves with transform_world)
        self.lost_count = 0
        self.world_scale = 1.0             # product of the scales of every re-anchoring (transform_world)
        self.ever_initialised = False
        self.untracked_total = 0           # frames given up (never posed) over the session
        # map-point reuse: matcher(fid, R, t, ids, X, src_fid, src_uv, pred_uv) → (ids, uv) finds
        # map points (world X, last seen at src_uv in keyframe src_fid, predicted at pred_uv) in
        # frame fid (pose R, t); it sees images, the tracker does not
        self.matcher = None
        self.reused_total = 0              # observations added by reuse over the session
        # points last seen before this frame are not reused: the session sets it when a loop
        # correction moves the map (older keyframes then sit where the latest correction put them,
        # not where the pose graph did, so their points would join two worlds)
        self.reuse_from = -1
        self.rotation_aided_total = 0      # frames posed by rotation-aided tracking over the session
        self._reset_map()

    # --- state -------------------------------------------------------------------------------
    def _reset_map(self):
        self.initialised = False
        self.points: dict[int, np.ndarray] = {}
        self.first_obs: dict[int, tuple[int, np.ndarray]] = {}    # untriangulated track → (fid, uv)
        self.keyframes: list[Keyframe] = []
        self.poses: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # fid → (R, t) world-to-camera
        self.ref: Optional[tuple[int, dict]] = None                # init reference frame and its obs
        self.pending: list[tuple[int, np.ndarray, np.ndarray]] = []
        self.last_fids: list[int] = []
        self.last_obs: Optional[tuple[int, dict]] = None            # last posed frame: (fid, id → uv)
        self.median_depth = self.target_depth
        self.revived: set = set()          # live tracks that are reused map points
        self._asked_for_motion = False
        self._warned_window = False

    @property
    def n_points(self) -> int:
        return len(self.points)

    def keyframe_pose(self, fid: int) -> Optional[np.ndarray]:
        for kf in reversed(self.keyframes):
            if kf.fid == fid:
                return c2w_from_rt(kf.R, kf.t)
        return None

    def visible_points(self, fid: int):
        """(uv, depth) of the map points observed in keyframe `fid` (for depth range / checks)."""
        for kf in reversed(self.keyframes):
            if kf.fid == fid:
                ids = [i for i in kf.obs if i in self.points]
                if not ids:
                    break
                X = np.array([self.points[i] for i in ids])
                uv = np.array([kf.obs[i] for i in ids])
                _, z = project(self.K, kf.R, kf.t, X)
                return uv, z
        return np.zeros((0, 2)), np.zeros(0)

    def keyframe_data(self, fid: int):
        """(uv N×2, points in the keyframe's camera frame N×3, {other keyframe fid: shared points})
        of keyframe `fid` (for loop closure), or None if it is no longer in the map."""
        for kf in reversed(self.keyframes):
            if kf.fid == fid:
                ids = [i for i in kf.obs if i in self.points]
                if not ids:
                    return np.zeros((0, 2)), np.zeros((0, 3)), {}
                X = np.array([self.points[i] for i in ids])
                idset = set(ids)
                cov = {k.fid: sum(1 for i in k.obs if i in idset) for k in self.keyframes if k.fid != fid}
                return np.array([kf.obs[i] for i in ids]), X @ kf.R.T + kf.t, cov
        return None

    def transform_world(self, S: np.ndarray) -> None:
        """Re-anchor the whole map (keyframes, points, frame poses, segment origin) by the
        similarity S (x → s·R·x + t), e.g. after a loop-closure correction: tracking goes on in
        the corrected world and the scale of the map follows."""
        S = np.asarray(S, np.float64)
        A = S[:3, :3]
        s = float(np.cbrt(np.linalg.det(A)))
        Rs, ts = A / s, S[:3, 3]

        def move(R, t):
            c2w = c2w_from_rt(R, t)
            c2w[:3, 3] = s * Rs @ c2w[:3, 3] + ts
            c2w[:3, :3] = Rs @ c2w[:3, :3]
            return rt_from_c2w(c2w)

        for kf in self.keyframes:
            kf.R, kf.t = move(kf.R, kf.t)
            kf.median_depth *= s
        self.poses = {f: move(R, t) for f, (R, t) in self.poses.items()}
        self.points = {i: s * Rs @ x + ts for i, x in self.points.items()}
        R0, t0 = move(*rt_from_c2w(self.origin))
        self.origin = c2w_from_rt(R0, t0)
        self.median_depth *= s
        self.target_depth *= s
        self.base_depth *= s
        self.world_scale *= s

    def add_tracks(self, fid: int, ids, uv) -> None:
        """Register new tracks first seen in frame `fid` (detected after `process`)."""
        if self.last_obs is not None and self.last_obs[0] == fid:
            self.last_obs[1].update((int(i), q) for i, q in zip(np.asarray(ids).tolist(), np.asarray(uv, np.float64)))
        for i, p in zip(np.asarray(ids).tolist(), np.asarray(uv, np.float64)):
            if self.ref is not None and self.ref[0] == fid and not self.initialised:
                self.ref[1][i] = p
            elif i not in self.points:
                self.first_obs[i] = (fid, p)
        if self.pending and self.pending[-1][0] == fid:
            f, pid, puv = self.pending[-1]
            self.pending[-1] = (f, np.concatenate([pid, np.asarray(ids, np.int64)]),
                                np.concatenate([puv, np.asarray(uv, np.float64).reshape(-1, 2)]))

    # --- main entry --------------------------------------------------------------------------
    def process(self, fid: int, ids: np.ndarray, uv: np.ndarray) -> StepResult:
        ids = np.asarray(ids, np.int64)
        uv = np.asarray(uv, np.float64).reshape(-1, 2)
        out = StepResult()
        if not self.initialised:
            self._initialise(fid, ids, uv, out)
        else:
            self._track(fid, ids, uv, out)
        self.untracked_total += len(out.untracked)
        return out

    def finish(self) -> StepResult:
        """End of stream: frames still waiting for initialisation never get a pose. The warning
        counts every frame of the session that got none, and says why when nothing was posed."""
        out = StepResult()
        if not self.initialised and self.pending:
            out.untracked = [f for f, _, _ in self.pending]
            if self.ref is not None and len(self.ref[1]) < self.p.min_init_points:
                why = "the images have too little texture to track (blank, dark or blurred frames?)"
            else:
                why = "the camera did not move enough to start tracking (monocular tracking needs sideways motion)"
            total = self.untracked_total + len(out.untracked)
            if not self.ever_initialised:
                out.events.append(("warning", self.segment, (
                    f"No frame could be posed: the tracker never started ({total} frame(s) without a pose): "
                    f"{why}. Try a clip with more sideways camera motion, exact intrinsics, or a longer "
                    f"start-up window (init_max_frames, now {self.p.max_init_frames})")))
            else:
                out.events.append(("warning", self.segment, (
                    f"{len(out.untracked)} frame(s) at the end got no pose ({total} in the whole run): {why}")))
            self.pending = []
        return out

    # --- initialisation ----------------------------------------------------------------------
    def _new_reference(self, fid, ids, uv, out: StepResult):
        out.untracked += [f for f, _, _ in self.pending]
        self.ref = (fid, {int(i): p for i, p in zip(ids.tolist(), uv)})
        self.pending = [(fid, ids, uv)]
        out.need_features = True

    def _initialise(self, fid, ids, uv, out: StepResult):
        p = self.p
        if self.ref is None:
            self._new_reference(fid, ids, uv, out)
            return
        ref_fid, ref_obs = self.ref
        self.pending.append((fid, ids, uv))
        common = [k for k, i in enumerate(ids.tolist()) if i in ref_obs]
        if len(common) < max(p.min_init_points, 0.3 * len(ref_obs)):
            # the reference is leaving the view: a last try with whatever parallax there is (a slow
            # motion may never reach the flow gate), else start over here
            if len(common) >= p.min_init_points and len(self.pending) > 2 \
                    and self._attempt_init(fid, ids, uv, common, out, check_flow=False):
                return
            self.pending.pop()
            self._new_reference(fid, ids, uv, out)
            out.reset_tracks = True
            return
        if len(self.pending) > p.max_init_frames:
            # waiting frames are held in memory: beyond the start-up window the oldest are given up
            if not self._warned_window:
                self._warned_window = True
                out.events.append(("warning", self.segment, (
                    f"No start after {p.max_init_frames} frames: the camera has not moved sideways enough "
                    "to measure depth; the oldest waiting frames are given up from now on (raise the "
                    "start-up window, init_max_frames, for slow motions)")))
            out.untracked.append(self.pending.pop(0)[0])
            nf, nids, nuv = self.pending[0]
            self.ref = (nf, {int(i): q for i, q in zip(nids.tolist(), nuv)})
            return
        if len(self.pending) >= 45 and not self._asked_for_motion:
            self._asked_for_motion = True
            out.events.append(("info", self.segment, "Waiting to start tracking: move the camera sideways "
                                                     "(a monocular camera needs parallax to measure depth)"))
        self._attempt_init(fid, ids, uv, common, out)

    def _attempt_init(self, fid, ids, uv, common, out: StepResult, check_flow: bool = True) -> bool:
        """Try to build the initial map from the reference and frame `fid` (the last pending one)."""
        p = self.p
        ref_fid, ref_obs = self.ref
        c_ids = ids[common]
        p1 = uv[common]
        p0 = np.array([ref_obs[i] for i in c_ids.tolist()])
        if check_flow and np.median(np.linalg.norm(p1 - p0, axis=1)) < p.min_init_parallax_px * p.px:
            return False
        E, mask = cv2.findEssentialMat(p0, p1, self.K, method=cv2.RANSAC, prob=0.999,
                                       threshold=p.ransac_px * p.px * 0.5)
        if E is None or E.shape != (3, 3):
            return False
        inl = mask.ravel() > 0
        # recoverPose only picks the (R, t) of the four; its own mask also drops points beyond
        # 50 baselines, i.e. nearly all of them at the small baselines we start from
        _, R, t, _ = cv2.recoverPose(E, p0, p1, self.K, mask=mask.copy())
        t = t.ravel()
        X, ang = triangulate(self.K, np.eye(3), np.zeros(3), p0, R, t, p1)
        uv0, z0 = project(self.K, np.eye(3), np.zeros(3), X)
        uv1, z1 = project(self.K, R, t, X)
        err = np.maximum(np.linalg.norm(uv0 - p0, axis=1), np.linalg.norm(uv1 - p1, axis=1))
        good = inl & (z0 > 0) & (z1 > 0) & (err < 2 * p.ransac_px * p.px) & (ang > 0.25 * p.min_init_angle_deg)
        if good.sum() < p.min_init_points or np.median(ang[good]) < p.min_init_angle_deg:
            return False
        # scale: median depth of the initial map = target depth; place the reference at the origin
        s = self.target_depth / np.median(z0[good])
        R0, t0 = rt_from_c2w(self.origin)
        # reference camera frame → world: x_w = origin @ x_ref
        Xw = X[good] * s @ self.origin[:3, :3].T + self.origin[:3, 3]
        R1 = R @ R0
        t1 = R @ t0 + s * t
        good_ids = c_ids[good]
        kf0 = Keyframe(ref_fid, R0, t0, {int(i): ref_obs[int(i)] for i in good_ids})
        kf1 = Keyframe(fid, R1, t1, {int(i): q for i, q in zip(good_ids.tolist(), p1[good])})
        self.points = {int(i): x for i, x in zip(good_ids.tolist(), Xw)}
        self.keyframes = [kf0, kf1]
        out.drop_ids += c_ids[~inl].tolist()
        # remaining reference tracks keep their reference observation for later triangulation
        self.first_obs = {i: (ref_fid, q) for i, q in ref_obs.items() if i not in self.points}
        self._local_ba(init=True)
        if sum(1 for i in kf0.obs if i in self.points) < max(10, p.min_init_points // 2):
            # the bundle adjustment rejected most of the map (seen after many re-initialisations
            # under heavy drift: it emptied the map and the rescale below failed): not a start
            self.points, self.keyframes = {}, []
            return False
        self._rescale_initial_map()
        kf0, kf1 = self.keyframes
        self.poses = {ref_fid: (kf0.R, kf0.t), fid: (kf1.R, kf1.t)}
        self.initialised = True
        # pose the frames between reference and current by PnP against the new map
        mids = self.pending[1:-1]
        for f, fids, fuv in mids:
            pose = self._pnp(fids, fuv, guess=None)
            if pose is not None:
                self.poses[f] = pose[:2]
        T0, T1 = c2w_from_rt(kf0.R, kf0.t), c2w_from_rt(kf1.R, kf1.t)
        span = max(fid - ref_fid, 1)
        for f, _, _ in self.pending:
            if f not in self.poses:   # PnP failed: interpolate between the two keyframes
                self.poses[f] = rt_from_c2w(slerp_pose(T0, T1, (f - ref_fid) / span))
            out.posed.append(PosedFrame(f, c2w_from_rt(*self.poses[f]), f in (ref_fid, fid), self.segment))
        self.last_fids = [f for f, _, _ in self.pending][-2:]
        self.pending = []
        self.ref = None
        self.median_depth = self._median_depth(kf1, list(kf1.obs))
        kf1.median_depth = kf0.median_depth = self.median_depth
        out.keyframe = True
        out.need_features = True
        self.ever_initialised = True
        return True

    def _rescale_initial_map(self):
        kf0, kf1 = self.keyframes
        ids = list(kf0.obs)
        X = np.array([self.points[i] for i in ids])
        _, z = project(self.K, kf0.R, kf0.t, X)
        s = self.target_depth / max(np.median(z), 1e-9)
        c0 = camera_center(kf0.R, kf0.t)
        for i, x in zip(ids, X):
            self.points[i] = c0 + s * (x - c0)
        c1 = c0 + s * (camera_center(kf1.R, kf1.t) - c0)
        kf1.t = -kf1.R @ c1

    # --- tracking ----------------------------------------------------------------------------
    def _median_depth(self, kf: Keyframe, ids) -> float:
        ids = [i for i in ids if i in self.points]
        if not ids:
            return self.median_depth
        _, z = project(self.K, kf.R, kf.t, np.array([self.points[i] for i in ids]))
        z = z[z > 0]
        return float(np.median(z)) if len(z) else self.median_depth

    def _pnp(self, ids, uv, guess):
        p = self.p
        known = [k for k, i in enumerate(ids.tolist()) if i in self.points]
        if len(known) < p.min_inliers:
            return None
        X = np.array([self.points[int(ids[k])] for k in known])
        x = uv[known]
        if guess is not None:
            rvec0, _ = cv2.Rodrigues(guess[0])
            ok, rvec, tvec, inl = cv2.solvePnPRansac(X, x, self.K, None, rvec0.copy(), guess[1].reshape(3, 1).copy(),
                                                     useExtrinsicGuess=True, iterationsCount=100,
                                                     reprojectionError=p.ransac_px * p.px, confidence=0.999,
                                                     flags=cv2.SOLVEPNP_ITERATIVE)
        else:
            ok, rvec, tvec, inl = cv2.solvePnPRansac(X, x, self.K, None, iterationsCount=200,
                                                     reprojectionError=p.ransac_px * p.px, confidence=0.999,
                                                     flags=cv2.SOLVEPNP_EPNP)
        if not ok or inl is None or len(inl) < max(p.min_inliers, 0.25 * len(known)):
            return None
        inl = inl.ravel()
        rvec, tvec = cv2.solvePnPRefineLM(X[inl], x[inl], self.K, None, rvec, tvec)
        R, _ = cv2.Rodrigues(rvec)
        t = tvec.ravel()
        err = np.linalg.norm(project(self.K, R, t, X)[0] - x, axis=1)
        inlier = err < p.ransac_px * p.px * 1.5
        known_ids = ids[known]
        return R, t, known_ids[inlier], known_ids[~inlier]

    def _rotation_aided(self, ids, uv):
        """Pose from (1) the rotation since the last posed frame, fitted by RANSAC to every track
        the two frames share as a pure rotation of viewing rays (a turn moves all of them alike,
        while the map points that PnP needs may be few), and (2) the translation alone, fitted to
        the map points in view with that rotation fixed (two equations a point, linear). Returns
        PnP's (R, t, inlier ids, outlier ids), or None when the tracks do not look like a rotation
        (too much parallax, too few tracks) or too few map points agree."""
        p = self.p
        if self.last_obs is None or self.last_obs[0] not in self.poses:
            return None
        f0, obs0 = self.last_obs
        common = [k for k, i in enumerate(ids.tolist()) if i in obs0]
        if len(common) < p.rot_min_tracks:
            return None
        Kinv = np.linalg.inv(self.K)

        def rays(x):
            b = np.c_[x, np.ones(len(x))] @ Kinv.T
            return b / np.linalg.norm(b, axis=1, keepdims=True)
        b0 = rays(np.array([obs0[int(ids[k])] for k in common]))
        b1 = rays(uv[common])
        thr = 2.0 * p.ransac_px * p.px / self.K[0, 0]          # angle ≈ pixels / focal length
        rng = np.random.default_rng(len(common))
        best = None
        for _ in range(64):
            pick = rng.choice(len(common), 2, replace=False)
            Rr = _kabsch(b0[pick], b1[pick])
            inl = np.linalg.norm(b0 @ Rr.T - b1, axis=1) < thr
            if best is None or inl.sum() > best.sum():
                best = inl
        if best.sum() < max(p.rot_min_tracks, p.rot_inlier_ratio * len(common)):
            return None
        Rr = _kabsch(b0[best], b1[best])
        R0, t0 = self.poses[f0]
        R = Rr @ R0
        # translation with R fixed: for each map point in view, x̂ (r3·X + tz) = r1·X + tx (and y)
        known = [k for k, i in enumerate(ids.tolist()) if i in self.points]
        if len(known) < p.rot_min_points:
            return None
        X = np.array([self.points[int(ids[k])] for k in known])
        xn = (np.c_[uv[known], np.ones(len(known))] @ Kinv.T)[:, :2]
        RX = X @ R.T
        A = np.zeros((2 * len(known), 3))
        A[0::2, 0], A[1::2, 1] = 1.0, 1.0
        A[0::2, 2], A[1::2, 2] = -xn[:, 0], -xn[:, 1]
        b = np.empty(2 * len(known))
        b[0::2] = xn[:, 0] * RX[:, 2] - RX[:, 0]
        b[1::2] = xn[:, 1] * RX[:, 2] - RX[:, 1]
        tol = p.ransac_px * p.px * 1.5

        def fit(sel):
            rows = np.repeat(sel, 2) * 2 + np.tile([0, 1], len(sel))
            return np.linalg.lstsq(A[rows], b[rows], rcond=None)[0]

        def inliers(t):
            pr, z = project(self.K, R, t, X)
            return (np.linalg.norm(pr - uv[known], axis=1) < tol) & (z > 0)
        best_in = None
        for _ in range(48):
            t = fit(rng.choice(len(known), 2, replace=False))
            inl = inliers(t)
            if best_in is None or inl.sum() > best_in.sum():
                best_in = inl
        if best_in.sum() < max(p.rot_min_points, 0.5 * len(known)):
            return None
        t = fit(np.flatnonzero(best_in))
        inl = inliers(t)
        if inl.sum() < max(p.rot_min_points, 0.5 * len(known)):
            return None
        known_ids = ids[known]
        return R, t, known_ids[inl], known_ids[~inl]

    def recover(self, fid: int, reason: str) -> StepResult:
        """Start a new segment after an unexpected failure inside the tracker (a safety net: the
        session reports it and carries on instead of crashing)."""
        out = StepResult()
        self._lose(fid, None, None, reason, out)
        self.untracked_total += len(out.untracked)
        return out

    def _lose(self, fid, ids, uv, reason, out: StepResult):
        last = self.last_fids[-1] if self.last_fids else None
        if last is not None and last in self.poses:
            self.origin = c2w_from_rt(*self.poses[last])
        # the new map continues at the last scene depth, within a factor 4 of the first map's: a
        # clip that ends closer to the scene than it starts, replayed in a loop, would otherwise
        # shrink the world by that ratio on every replay until the numbers break down (ICL: ×0.83
        # per replay, keyframes on every frame after ~28 replays)
        self.target_depth = float(np.clip(self.median_depth, 0.25 * self.base_depth, 4.0 * self.base_depth))
        self.segment += 1
        self.lost_count += 1
        out.events.append(("segment", self.segment,
                           f"Tracking lost at frame {fid} ({reason}); re-initialising as segment "
                           f"{self.segment} (placed in the existing map if the camera returns to a known place)"))
        self._reset_map()
        out.reset_tracks = True
        self._new_reference(fid, np.zeros(0, np.int64), np.zeros((0, 2)), out)

    def _track(self, fid, ids, uv, out: StepResult):
        p = self.p
        for i, q in zip(ids.tolist(), uv):
            if i not in self.points and i not in self.first_obs:
                self.first_obs[i] = (fid, q)
        # constant-velocity guess from the last two poses
        Ra, ta = self.poses[self.last_fids[-1]]
        if len(self.last_fids) >= 2:
            Rb, tb = self.poses[self.last_fids[-2]]
            dR = Ra @ Rb.T
            guess = (dR @ Ra, dR @ ta + (ta - dR @ tb))
        else:
            guess = (Ra, ta)
        res = self._pnp(ids, uv, guess)
        if res is None:   # the motion model may be what failed: try once more without it
            res = self._pnp(ids, uv, None)
        if res is None and p.rotation_aided:
            res = self._rotation_aided(ids, uv)
            self.rotation_aided_total += res is not None
        if res is None:
            self._lose(fid, ids, uv, "too few map points matched", out)
            return
        R, t, inl_ids, out_ids = res
        jump = np.linalg.norm(camera_center(R, t) - camera_center(*guess))
        if jump > p.max_jump_ratio * self.median_depth:
            self._lose(fid, ids, uv, "implausible camera jump", out)
            return
        out.drop_ids += out_ids.tolist()
        for i in out_ids.tolist():
            if i in self.revived:   # a re-matched track went astray: the old point stays
                self.revived.discard(i)
            else:
                self.points.pop(i, None)
        self.poses[fid] = (R, t)
        self.last_fids = (self.last_fids + [fid])[-2:]
        self.last_obs = (fid, {int(i): q for i, q in zip(ids.tolist(), uv)})
        if len(self.poses) > 400:
            for f in sorted(self.poses)[:100]:
                self.poses.pop(f)
        # keyframe decision
        kf = self.keyframes[-1]
        inl_set = set(inl_ids.tolist())
        n_tracked = sum(1 for i in kf.obs if i in inl_set)
        base = np.linalg.norm(camera_center(R, t) - camera_center(kf.R, kf.t))
        gap = fid - kf.fid
        is_kf = gap >= 1 and (gap >= p.kf_max_gap or base > p.kf_baseline_ratio * self.median_depth
                              or n_tracked < p.kf_tracked_ratio * len(kf.obs) or len(inl_ids) < p.kf_min_points)
        if is_kf:
            self._make_keyframe(fid, R, t, ids, uv, inl_ids, out)
            R, t = self.poses[fid]
        out.posed.append(PosedFrame(fid, c2w_from_rt(R, t), is_kf, self.segment))

    def _make_keyframe(self, fid, R, t, ids, uv, inl_ids, out: StepResult):
        p = self.p
        uv_of = {int(i): q for i, q in zip(ids.tolist(), uv)}
        kf = Keyframe(fid, R, t, {int(i): uv_of[int(i)] for i in inl_ids.tolist()})
        self.keyframes.append(kf)
        kf_fids = {k.fid: k for k in self.keyframes}
        if p.reuse_points and self.matcher is not None:
            self.revived &= set(ids.tolist())
            self._reuse(fid, kf, set(ids.tolist()), out)
        # triangulate tracks that have parallax now
        cand = [i for i in ids.tolist() if i in self.first_obs and self.first_obs[i][0] in self.poses
                and self.first_obs[i][0] != fid]
        if cand:
            f0 = [self.first_obs[i][0] for i in cand]
            uv0 = np.array([self.first_obs[i][1] for i in cand])
            uv1 = np.array([uv_of[i] for i in cand])
            R0 = np.array([self.poses[f][0] for f in f0])
            t0 = np.array([self.poses[f][1] for f in f0])
            X, ang = triangulate(self.K, R0, t0, uv0, R, t, uv1)
            pr1, z1 = project(self.K, R, t, X)
            Xc0 = np.einsum("nij,nj->ni", R0, X) + t0
            z0 = Xc0[:, 2]
            pr0 = np.stack([self.K[0, 0] * Xc0[:, 0] / np.maximum(z0, 1e-9) + self.K[0, 2],
                            self.K[1, 1] * Xc0[:, 1] / np.maximum(z0, 1e-9) + self.K[1, 2]], 1)
            err = np.maximum(np.linalg.norm(pr0 - uv0, axis=1), np.linalg.norm(pr1 - uv1, axis=1))
            ok = (ang > p.min_tri_angle_deg) & (z0 > 0) & (z1 > 0) & (err < 2 * p.ransac_px * p.px) \
                & (z1 < 30 * self.median_depth)
            bad = (z0 <= 0) | (z1 <= 0) | (err > 6 * p.ransac_px * p.px)
            for k in np.flatnonzero(ok):
                i = cand[k]
                self.points[i] = X[k]
                kf.obs[i] = uv1[k]
                src = kf_fids.get(f0[k])
                if src is not None:
                    src.obs[i] = uv0[k]
                del self.first_obs[i]
            drop = [cand[k] for k in np.flatnonzero(bad & ~ok)]
            for i in drop:
                self.first_obs.pop(i, None)
            out.drop_ids += drop
        self._local_ba()
        kf.median_depth = self.median_depth = self._median_depth(kf, list(kf.obs))
        self.poses[fid] = (kf.R, kf.t)
        # forget keyframes (and points only they saw) beyond the memory horizon
        if len(self.keyframes) > p.keep_keyframes:
            self.keyframes = self.keyframes[-p.keep_keyframes:]
            live = set(ids.tolist()) | set(out.revived_ids)
            seen = set()
            # with reuse every kept keyframe's points may be matched again; without, only the
            # bundle-adjustment window's are ever used
            for k in self.keyframes if p.reuse_points else self.keyframes[-p.ba_window:]:
                seen.update(k.obs)
            for i in [i for i in self.points if i not in live and i not in seen]:
                del self.points[i]
            self.revived &= self.points.keys()
        stale = [i for i, (f, _) in self.first_obs.items() if f not in self.poses]
        for i in stale:
            del self.first_obs[i]
        out.keyframe = True
        out.need_features = True

    # --- map-point reuse ---------------------------------------------------------------------
    def _reuse(self, fid, kf: Keyframe, live: set, out: StepResult):
        """Match map points that are no longer tracked in the new keyframe `kf` (before its
        triangulation and bundle adjustment): each match becomes an observation of the old point
        (the adjustment then ties this keyframe to the keyframes that saw it) and a live track."""
        p = self.p
        src = {}                      # point id → (latest keyframe that observed it, uv there)
        for k in reversed(self.keyframes[:-1]):
            if k.fid < self.reuse_from:
                break
            for i, q in k.obs.items():
                if i not in src and i not in live and i in self.points:
                    src[i] = (k, q)
        if not src:
            return
        cand = np.fromiter(src.keys(), np.int64, len(src))
        X = np.array([self.points[i] for i in cand.tolist()])
        pred, z = project(self.K, kf.R, kf.t, X)
        c_new = camera_center(kf.R, kf.t)
        c_src = np.array([camera_center(src[i][0].R, src[i][0].t) for i in cand.tolist()])
        r_new, r_src = X - c_new, X - c_src
        d_new, d_src = np.linalg.norm(r_new, axis=1), np.linalg.norm(r_src, axis=1)
        cosang = np.sum(r_new * r_src, 1) / np.maximum(d_new * d_src, 1e-12)
        ratio = d_new / np.maximum(d_src, 1e-12)
        w, h = 2 * self.K[0, 2], 2 * self.K[1, 2]
        ok = (z > 0) & (pred[:, 0] >= 0) & (pred[:, 1] >= 0) & (pred[:, 0] < w) & (pred[:, 1] < h) \
            & (cosang > np.cos(np.radians(p.reuse_max_angle_deg))) \
            & (ratio < p.reuse_max_scale) & (ratio > 1.0 / p.reuse_max_scale)
        if not ok.any():
            return
        sel = np.flatnonzero(ok)
        if len(sel) > p.reuse_max:    # spread over the image: the nearest to the centre first
            sel = sel[np.argsort(np.linalg.norm(pred[sel] - [w / 2, h / 2], axis=1), kind="stable")[:p.reuse_max]]
        m_ids, m_uv = self.matcher(fid, kf.R, kf.t, cand[sel], X[sel],
                                   np.array([src[i][0].fid for i in cand[sel].tolist()]),
                                   np.array([src[i][1] for i in cand[sel].tolist()]), pred[sel])
        m_ids = np.asarray(m_ids, np.int64)
        if not len(m_ids):
            return
        m_uv = np.asarray(m_uv, np.float64).reshape(-1, 2)
        # keep what agrees with the keyframe's pose (the matcher gates around the prediction too)
        proj, _ = project(self.K, kf.R, kf.t, np.array([self.points[i] for i in m_ids.tolist()]))
        good = np.linalg.norm(proj - m_uv, axis=1) < 3 * p.ransac_px * p.px
        for i, q in zip(m_ids[good].tolist(), m_uv[good]):
            kf.obs[i] = q
            self.revived.add(i)
            out.revived_ids.append(i)
            out.revived_uv.append(q)
        self.reused_total += int(good.sum())

    # --- focal self-calibration ---------------------------------------------------------------
    def refine_focal(self, max_rel_sigma: float = 0.01):
        """Bundle adjustment over every keyframe of the map with the focal length free (the first
        keyframe fixed; bundle.refine_focal). Accepted when its spread is below `max_rel_sigma`:
        the map, the keyframe poses and K take the solution. Returns (focal, sigma) or None."""
        from .bundle import refine_focal
        kfs = self.keyframes
        pids = sorted({i for k in kfs for i in k.obs if i in self.points})
        slot = {i: j for j, i in enumerate(pids)}
        obs = [(c, slot[i], q) for c, k in enumerate(kfs) for i, q in k.obs.items() if i in slot]
        if len(kfs) < 3 or len(obs) < 50:
            return None
        cam_idx = np.array([o[0] for o in obs])
        pt_idx = np.array([o[1] for o in obs])
        uvs = np.array([o[2] for o in obs])
        keep = np.bincount(pt_idx, minlength=len(pids)) >= 2
        remap = np.cumsum(keep) - 1
        ko = keep[pt_idx]
        cam_idx, pt_idx, uvs = cam_idx[ko], remap[pt_idx[ko]], uvs[ko]
        pids = [i for i, k in zip(pids, keep) if k]
        fixed = np.zeros(len(kfs), bool)
        fixed[0] = True
        K2, R, t, X, err, sigma = refine_focal(self.K, np.array([k.R for k in kfs]), np.array([k.t for k in kfs]),
                                               fixed, np.array([self.points[i] for i in pids]),
                                               cam_idx, pt_idx, uvs, f_scale=1.0 * self.p.px)
        if not np.isfinite(sigma) or sigma > max_rel_sigma or np.median(err) > 2 * self.p.ransac_px * self.p.px:
            return None
        # the first keyframe is fixed but the scale is free: keep the map's scale (the mean distance
        # of the keyframes from the first), so frames tracked from here on continue the trajectory
        c0 = camera_center(kfs[0].R, kfs[0].t)
        old = np.array([camera_center(k.R, k.t) for k in kfs]) - c0
        new = np.einsum("nji,nj->ni", R, -t) - c0
        s = np.linalg.norm(old, axis=1).sum() / max(np.linalg.norm(new, axis=1).sum(), 1e-12)
        X = c0 + s * (X - c0)
        t = -np.einsum("nij,nj->ni", R, c0 + s * new)
        self.K = K2
        for c, k in enumerate(kfs):
            k.R, k.t = R[c], t[c]
            if k.fid in self.poses:
                self.poses[k.fid] = (k.R, k.t)
        for j, i in enumerate(pids):
            self.points[i] = X[j]
        return float(K2[0, 0]), float(sigma * K2[0, 0])

    # --- bundle adjustment -------------------------------------------------------------------
    def _local_ba(self, init: bool = False):
        p = self.p
        window = self.keyframes[-p.ba_window:]
        n_fixed = 1 if init else min(p.ba_fixed, max(len(window) - 1, 1))
        if len(self.keyframes) <= 2 and not init:
            n_fixed = len(window)
        pids = sorted({i for k in window for i in k.obs if i in self.points})
        if not pids:
            return
        pid_slot = {i: s for s, i in enumerate(pids)}
        cams = list(window)
        fixed = [j < n_fixed for j in range(len(window))]
        # older keyframes that also see these points constrain them with fixed poses
        for k in self.keyframes[:-p.ba_window] if len(self.keyframes) > p.ba_window else []:
            if any(i in pid_slot for i in k.obs):
                cams.append(k)
                fixed.append(True)
        cam_idx, pt_idx, uvs = [], [], []
        for c, k in enumerate(cams):
            for i, q in k.obs.items():
                s = pid_slot.get(i)
                if s is not None:
                    cam_idx.append(c)
                    pt_idx.append(s)
                    uvs.append(q)
        cam_idx = np.array(cam_idx)
        pt_idx = np.array(pt_idx)
        uvs = np.array(uvs)
        counts = np.bincount(pt_idx, minlength=len(pids))
        if (counts >= 2).sum() < 10:
            return
        # a point seen once is unconstrained: leave it out of the problem
        keep_pt = counts >= 2
        remap = np.cumsum(keep_pt) - 1
        keep_obs = keep_pt[pt_idx]
        cam_idx, pt_idx, uvs = cam_idx[keep_obs], remap[pt_idx[keep_obs]], uvs[keep_obs]
        pids = [i for i, k in zip(pids, keep_pt) if k]
        X0 = np.array([self.points[i] for i in pids])
        Rs = np.array([k.R for k in cams])
        ts = np.array([k.t for k in cams])
        R, t, X, err = bundle_adjust(self.K, Rs, ts, fixed, X0, cam_idx, pt_idx, uvs,
                                     f_scale=1.0 * p.px, max_nfev=p.ba_max_nfev,
                                     method=p.ba_method,
                                     tr_options={"atol": p.ba_lsmr_tol, "btol": p.ba_lsmr_tol,
                                                 **({"maxiter": p.ba_lsmr_iters} if p.ba_lsmr_iters else {})})
        for c, k in enumerate(cams):
            if not fixed[c]:
                k.R, k.t = R[c], t[c]
                if k.fid in self.poses:
                    self.poses[k.fid] = (k.R, k.t)
        for s, i in enumerate(pids):
            self.points[i] = X[s]
        # drop outlying observations; points left with no support go
        bad = err > 3 * p.ransac_px * p.px
        for o in np.flatnonzero(bad):
            cams[cam_idx[o]].obs.pop(pids[pt_idx[o]], None)
        if bad.any():
            for s in np.unique(pt_idx[bad]):
                i = pids[s]
                if sum(1 for k in window if i in k.obs) == 0:
                    self.points.pop(i, None)
