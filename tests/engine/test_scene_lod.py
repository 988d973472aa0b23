"""The scene model's draw order (level of detail): any level prefix is a spatially even
subsample, ranking new points costs O(new points), thinning keeps the per-level counts."""
from types import SimpleNamespace

import numpy as np

from engine.scene import LOD_COARSE, LOD_LEVELS, SceneModel


def _frame(i, pts, seg=0, kf=False):
    n = len(pts)
    return SimpleNamespace(index=i, segment=seg, is_keyframe=kf, points=pts.astype(np.float32),
                           colors=np.zeros((n, 3), np.uint8), conf=np.ones(n, np.float32),
                           depth=np.ones(n, np.float32), c2w=np.eye(4), frustum=np.zeros((5, 3)))


def _wall(rng, n, x0=0.0):
    """Points on a wall (a surface, as reconstructions are), denser on one side."""
    u = rng.random((n, 2)) ** np.array([2.0, 1.0])
    return np.stack([x0 + 4.0 * u[:, 0], 2.0 * u[:, 1], np.zeros(n)], 1)


def _voxels(m, factor):
    """Voxel number of every row on the LOD grid `factor` x the fine one (as the model floors)."""
    pos = m.positions[: m.count]
    vox = np.floor(pos * np.float32(1.0 / (m.lod_voxel * factor))).astype(np.int64)
    _, voxel_of, per_voxel = np.unique(vox, axis=0, return_inverse=True, return_counts=True)
    return voxel_of.ravel(), per_voxel


def test_level_prefix_is_spatially_even():
    rng = np.random.default_rng(1)
    m = SceneModel(2_000_000)
    for i in range(12):
        m.add_frame(_frame(i, _wall(rng, 8000, x0=0.05 * i)))
    level = m.level[: m.count]
    ncoarse = len(LOD_COARSE)
    # levels <= g hold one point of every occupied voxel of coarse grid g (coarsest first); a
    # shared rank counter (~never) may push a voxel's first point one level down
    for g, factor in enumerate(LOD_COARSE + (1,)):
        voxel_of, per_voxel = _voxels(m, factor)
        nvox = len(per_voxel)
        got = np.bincount(voxel_of[level <= g], minlength=nvox)
        assert np.mean(got == 1 if g < ncoarse else got >= 1) >= 0.99
        assert len(np.unique(voxel_of[level <= g + 1])) == nvox
    voxel_of, per_voxel = _voxels(m, 1)
    nvox = len(per_voxel)
    assert per_voxel.max() > 20 and nvox > 200           # dense and sparse voxels both present
    for k in range(4):
        # levels <= 2 + k hold min(n, 2^(k+1) - 1) points of a fine voxel of n points
        got = np.bincount(voxel_of[level <= ncoarse + k], minlength=nvox)
        want = np.minimum(per_voxel, 2 ** (k + 1) - 1)
        assert np.mean(got == want) >= 0.99
        assert len(m.draw_prefix(ncoarse + k)) <= (2 ** (k + 1) - 1) * nvox
    sizes = np.bincount(level, minlength=LOD_LEVELS)
    assert 0 < sizes[0] < sizes[0] + sizes[1] < len(m.draw_prefix(ncoarse)) < m.count
    # a prefix is not the oldest rows: level 0 reaches into the newest frame's new ground
    assert m.frame[: m.count][level == 0].max() == 11


def test_ranking_costs_only_the_new_points_and_thinning_keeps_counts():
    rng = np.random.default_rng(2)
    m = SceneModel(100_000)                     # the minimum budget: many thinning passes
    for i in range(60):
        before = m.lod_ranked
        n = 3000 + 100 * (i % 7)
        m.add_frame(_frame(i, _wall(rng, n, x0=0.1 * i), kf=i % 5 == 0))
        assert m.lod_ranked - before == n       # work: the new points, not the scene
        assert np.array_equal(m.level_counts, np.bincount(m.level[: m.count], minlength=LOD_LEVELS))
    assert m.thinning_passes >= 3 and m.count <= 100_000


def test_levels_are_seeded():
    a, b, c = SceneModel(), SceneModel(), SceneModel(lod_seed=7)
    for m in (a, b, c):
        rng = np.random.default_rng(3)
        for i in range(3):
            m.add_frame(_frame(i, _wall(rng, 5000)))
    assert np.array_equal(a.level[: a.count], b.level[: b.count])
    assert not np.array_equal(a.level[: a.count], c.level[: c.count])


def test_choose_detail_fits_the_budget_and_keeps_the_live_rows():
    rng = np.random.default_rng(4)
    m = SceneModel(2_000_000)
    for i in range(10):
        m.add_frame(_frame(i, _wall(rng, 6000, x0=0.05 * i)))
    live = m.first_row_of_frame(m.frames_added - 2)
    assert np.all(m.frame[live: m.count] >= 8) and m.frame[live - 1] == 7
    assert m.choose_detail(m.count, live) == (LOD_LEVELS - 1, m.count)     # all fits: all
    lvl0 = len(m.draw_prefix(0, live)) + (m.count - live)
    assert m.choose_detail(10, live) == (0, lvl0)                          # never under level 0
    last = 0
    for budget in (lvl0, 2 * lvl0, 4 * lvl0, 8 * lvl0):
        j, drawn = m.choose_detail(budget, live)
        assert drawn <= budget and drawn >= last
        assert drawn == len(m.draw_prefix(j, live)) + (m.count - live)
        if j + 1 < LOD_LEVELS:                  # the next level would not fit
            assert len(m.draw_prefix(j + 1, live)) + (m.count - live) > budget
        last = drawn


def test_background_pass_never_makes_the_caller_wait(monkeypatch):
    """With the budget full before the background pass has finished, add_frame keeps an even
    subsample of what fits instead of waiting (the caller is the GUI thread); once the pass is
    done the next frames go in whole again."""
    import threading

    import engine.scene as scene_mod
    release = threading.Event()
    plan = scene_mod._plan

    def slow_plan(*a, **kw):
        release.wait(30)
        return plan(*a, **kw)
    monkeypatch.setattr(scene_mod, "_plan", slow_plan)
    rng = np.random.default_rng(3)
    m = SceneModel(100_000, background=True)
    try:
        i = 0
        while m.thinning_passes == 0:              # up to the high-water mark: a pass starts
            m.add_frame(_frame(i, _wall(rng, 5000, x0=0.05 * i)))
            i += 1
        for _ in range(6):                         # it cannot finish: the budget fills
            m.add_frame(_frame(i, _wall(rng, 5000, x0=0.05 * i)))
            i += 1
        assert m.count <= m.point_budget and m.points_skipped > 0
        assert m.frames_added == i                 # every frame (and camera) was taken
        rows = m.frame[: m.count]
        kept_last = int((rows == i - 1).sum())
        assert kept_last < 5000                    # the frame that did not fit: a subsample
        if kept_last:                              # ... spread over the frame, not its first rows
            p = m.positions[: m.count][rows == i - 1]
            assert np.ptp(p[:, 0]) > 0.5 * 4.0 * (1 - 1 / kept_last)
        release.set()
        whole = False
        for _ in range(4):                         # passes catch up (one may not be enough)
            m.wait()
            skipped = m.points_skipped
            m.add_frame(_frame(i, _wall(rng, 5000, x0=0.05 * i)))
            i += 1
            assert m.count <= m.point_budget
            if m.points_skipped == skipped:
                whole = int((m.frame[: m.count] == i - 1).sum()) == 5000
                break
        assert whole
    finally:
        release.set()
        m.wait()
