"""Append and thinning cost of the viewer's scene model (engine/scene.py; docs/benchmarks_gui.md,
docs/gui.md): what the GUI thread pays per frame and per loop closure. Prints figures.

    python -m benchmarks.scene_bench [--budget N] [--frames F] [--points P] [--background] [--fps R] [--realign K]
"""
from __future__ import annotations

import numpy as np

from engine.scene import DEFAULT_POINT_BUDGET, SceneModel


def bench(budget: int, frames: int, points: int, background: bool, fps: float, realign: int = 0) -> None:
    """Synthetic frames of P points on a cylinder wall seen
    by a turning camera, 1 keyframe in 5, offered at R frames/s (0 = back to back); times every
    add_frame + take_changes (what the GUI thread pays). With --realign K, then K loop closures
    are applied, each one frame-range "realign" event per keyframe stretch (as
    engine/geometric/session.py sends them), timing what the GUI thread pays per closure."""
    import platform
    import time
    from types import SimpleNamespace
    rng = np.random.default_rng(0)
    m = SceneModel(budget, background=background)
    times = []
    for i in range(frames):
        u = rng.random((points, 2))
        a = 0.01 * i + 0.8 * u[:, 0]
        pts = np.stack([3 * np.cos(a), 2.5 * u[:, 1], 3 * np.sin(a)], 1).astype(np.float32)
        f = SimpleNamespace(index=i, segment=0, is_keyframe=i % 5 == 0, points=pts,
                            colors=rng.integers(0, 255, (points, 3), dtype=np.uint8),
                            conf=rng.random(points).astype(np.float32), depth=np.full(points, 2.0, np.float32),
                            c2w=np.eye(4), frustum=np.zeros((5, 3), np.float32))
        t0 = time.perf_counter()
        m.add_frame(f)
        m.take_changes()
        dt = time.perf_counter() - t0
        times.append(dt * 1e3)
        assert m.count <= budget
        if fps > 0 and dt < 1.0 / fps:
            time.sleep(1.0 / fps - dt)
    t = np.asarray(times)
    print(f"machine: {platform.machine()} {platform.processor()}, numpy {np.__version__}")
    print(f"budget {budget:,} points, {frames} frames x {points:,} points ({m.points_added:,} offered), "
          f"{'background' if background else 'synchronous'} passes, offered at "
          f"{f'{fps:g} frames/s' if fps > 0 else 'full speed'}")
    print(f"points kept {m.count:,} (thinned part {m.thinned:,}, voxel {m.voxel or 0:.4f}), "
          f"host arrays {m.host_bytes / 2**20:.0f} MiB")
    print(f"thinning passes {m.thinning_passes} ({m.coarsenings} coarsenings), rows rewritten / points "
          f"appended {m.rows_rewritten / m.points_added:.2f}")
    print(f"add_frame on the calling thread: median {np.median(t):.1f} ms, p99 {np.percentile(t, 99):.0f} ms, "
          f"max {t.max():.0f} ms, total {t.sum() / 1e3:.1f} s")
    if realign:
        bench_realign(m, frames, realign)


def bench_realign(m: SceneModel, frames: int, closures: int) -> None:
    import time
    kfs = list(range(0, frames, 5))
    m.wait()
    m.take_changes()
    for c in range(closures):
        t0 = time.perf_counter()
        for k, first in enumerate(kfs):        # what the viewer's apply_realign does per event
            last = kfs[k + 1] - 1 if k + 1 < len(kfs) else frames - 1
            T = np.eye(4)
            T[:3, 3] = (0.001 * (c + 1) * k, 0.0, 0.0)
            m.add_realign(0, T, frames=(first, last))
        t1 = time.perf_counter()
        ch = m.take_changes()                   # resolves the closure's events (next draw)
        mats = m.frame_matrices(ch.transforms_from, ch.frames)
        t2 = time.perf_counter()
        print(f"closure {c + 1}: {len(kfs)} frame-range events over {frames} frames ({m.count:,} points): "
              f"queue {1e3 * (t1 - t0):.1f} ms, resolve + per-frame matrices {1e3 * (t2 - t1):.1f} ms, "
              f"texture upload {ch.frames - ch.transforms_from} frames = {len(mats) * 64 / 2**10:.0f} KiB, "
              f"point rows re-uploaded {ch.points_from and m.count - ch.points_from}")
    from types import SimpleNamespace as NS
    t0 = time.perf_counter()
    for i in range(frames, frames + 100):       # frames after the closures: looked up among all events
        m.add_frame(NS(index=i, segment=0, is_keyframe=False, points=np.zeros((0, 3), np.float32),
                       colors=np.zeros((0, 3), np.uint8), conf=np.zeros(0, np.float32),
                       depth=np.zeros(0, np.float32), c2w=np.eye(4), frustum=np.zeros((5, 3), np.float32)))
    print(f"a frame added after them ({len(m.events):,} events kept): "
          f"{1e3 * (time.perf_counter() - t0) / 100:.2f} ms of transform lookup + camera")
    t0 = time.perf_counter()
    m.framing()
    print(f"framing() (auto-fit, per batch; 20k sampled points + {m.camera_count:,} cameras under "
          f"{len(m.events):,} transforms): {1e3 * (time.perf_counter() - t0):.1f} ms")
    t0 = time.perf_counter()
    w = m.world_positions()
    print(f"for comparison, re-transforming every point on the CPU (world_positions, {len(w):,} points): "
          f"{1e3 * (time.perf_counter() - t0):.0f} ms, and re-uploading them {len(w) * 28 / 2**20:.0f} MiB")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="SceneModel append/thinning benchmark")
    ap.add_argument("--budget", type=int, default=DEFAULT_POINT_BUDGET)
    ap.add_argument("--frames", type=int, default=700)
    ap.add_argument("--points", type=int, default=50_000)
    ap.add_argument("--background", action="store_true", help="passes computed on a thread (as the viewer)")
    ap.add_argument("--fps", type=float, default=0.0, help="offer frames at this rate (0 = back to back)")
    ap.add_argument("--realign", type=int, default=0, help="then apply this many loop closures")
    a = ap.parse_args()
    bench(a.budget, a.frames, a.points, a.background, a.fps, a.realign)
