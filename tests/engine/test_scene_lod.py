"""The scene model's draw order (level of detail): any level prefix is a spatially even
subsample, ranking new points costs O(new points), thinning keeps the per-level counts."""
from types import SimpleNamespace

import numpy as np

from engine.scene import LOD_LEVELS, SceneModel


def _frame(i, pts, seg=0, kf=False):
    n = len(pts)
    return SimpleNamespace(index=i, segment=seg, is_keyframe=kf, points=pts.astype(np.float32),
                           colors=np.zeros((n, 3), np.uint8), conf=np.ones(n, np.float32),
                           depth=np.ones(n, np.float32), c2w=np.eye(4), frustum=np.zeros((5, 3)))


def _wall(rng, n, x0=0.0):
    """Points on a wall (a surface, as reconstructions are), denser on one side."""
    u = rng.random((n, 2)) ** np.array([2.0, 1.0])
    return np.stack([x0 + 4.0 * u[:, 0], 2.0 * u[:, 1], np.zeros(n)], 1)


def test_level_prefix_is_spatially_even():
    rng = np.random.default_rng(1)
    m = SceneModel(2_000_000)
    for i in range(12):
        m.add_frame(_frame(i, _wall(rng, 8000, x0=0.05 * i)))
    pos = m.positions[: m.count]
    vox = np.floor(pos / m.lod_voxel).astype(np.int64)
    _, voxel_of, per_voxel = np.unique(vox, axis=0, return_inverse=True, return_counts=True)
    voxel_of = voxel_of.ravel()
    nvox = len(per_voxel)
    assert per_voxel.max() > 20 and nvox > 200           # dense and sparse voxels both present
    level = m.level[: m.count]
    # every occupied voxel is in the first two levels (a shared rank counter, ~never, may push
    # a voxel's first point to level 1), and in level 0 all but a few
    assert len(np.unique(voxel_of[level <= 1])) == nvox
    assert len(np.unique(voxel_of[level == 0])) >= 0.99 * nvox
    for j in range(4):
        # the prefix of levels <= j holds min(n, 2^(j+1) - 1) points of a voxel of n points
        got = np.bincount(voxel_of[level <= j], minlength=nvox)
        want = np.minimum(per_voxel, 2 ** (j + 1) - 1)
        assert np.mean(got == want) >= 0.99
        assert len(m.draw_prefix(j)) <= (2 ** (j + 1) - 1) * nvox
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
