"""Benchmark of the geometric engine: accuracy, speed and robustness on a shared sequence.

    python -m benchmarks.geometric_bench /work/shared/data/icl_livingroom_kt3 [--max-side 640] [--json]
    python -m benchmarks.geometric_bench SEQ --robustness      # blank-stretch and jump-cut clips
    python -m benchmarks.geometric_bench SEQ --soak 12000      # memory over the clip looped (headless)

Frames are decoded before timing starts, so the figures are the engine's own: tracking FPS
(input → pose, wall clock and CPU time of the tracking thread), overall push FPS, keyframe rate
and depth throughput of the worker thread, and how long `push` ever waited for depth. The load
average of the machine is printed beside them (the CPU-time figures do not depend on it).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np


def _frames(seq, n):
    import cv2
    return [cv2.cvtColor(cv2.imread(str(f)), cv2.COLOR_BGR2RGB) for f in seq.frames[:n]]


def _rolled(img, deg):
    import cv2
    h, w = img.shape[:2]
    M = cv2.getRotationMatrix2D(((w - 1) / 2, (h - 1) / 2), deg, 1.0)
    return cv2.warpAffine(img, M, (w, h))


def _run(seq, frames, order, cfg, roll=None):
    """Push frames[order[k]] (black where order[k] < 0), rolled by roll[k] degrees if given."""
    from engine.api import open_session
    from engine.run_driver import CollectSink, RunDriver, SequenceSource

    def image(k):
        i = order[k]
        img = np.zeros_like(frames[0]) if i < 0 else frames[i]
        return _rolled(img, roll[k]) if roll is not None and roll[k] else img

    s = open_session(cfg)
    out = CollectSink()          # the one run loop (engine.run_driver); frames already decoded
    summary = RunDriver(SequenceSource(range(len(order)), [k / 30.0 for k in range(len(order))], load=image),
                        s, [out], stats_hz=0).run()
    st = summary.stats
    s.close()
    return out.results, st, out.events, summary.wall_s


def speed_and_accuracy(seq, frames, cfg) -> dict:
    from engine.metrics import ate
    import time
    n = len(frames)
    c0 = time.process_time()
    res, st, ev, wall = _run(seq, frames, list(range(n)), cfg)
    cpu_ms = 1e3 * (time.process_time() - c0) / n      # every thread: tracking, depth, loop closure
    idx = [r.index for r in res]
    a = ate(np.array([r.c2w for r in res]), seq.gt_c2w[idx]) if len(res) >= 3 else None
    kfs = [r for r in res if r.is_keyframe]
    return {
        "frames": n, "posed": len(res), "segments": st["segments"], "keyframes": len(kfs),
        "keyframes_with_depth": sum(r.depth is not None for r in kfs),
        "ate_cm": 100 * a["rmse"] if a else None,
        "push_fps": n / wall, "tracking_fps_recent": st["tracking_fps"],
        "tracking_cpu_ms_per_frame": st["tracking_cpu_ms"],
        # all the process's threads per frame, and the rate two idle cores could sustain by CPU time:
        # the tracking thread is serial, the depth and loop workers fill the second core
        "process_cpu_ms_per_frame": cpu_ms,
        "cpu_bound_fps_2_cores": 1e3 / max(cpu_ms / 2.0, st["tracking_cpu_ms"] or 0.0),
        "depth_maps_per_s": st["depth_fps"], "depth_cpu_ms_per_keyframe": st["depth_cpu_ms"],
        "keyframes_per_s_at_30fps_input": 30.0 * len(kfs) / n,
        "push_waited_for_depth_s": st["depth_wait_s"],
        "loop_cpu_ms_per_keyframe": st.get("loop_cpu_ms"), "loops_closed": st.get("loops_closed"),
        "loops_consistent": st.get("loops_consistent"), "push_waited_for_loops_s": st.get("loop_wait_s"),
        "latency_p50_ms": st["latency_p50_ms"], "latency_p95_ms": st["latency_p95_ms"],
        "resolution": st["resolution"], "load_avg_1min": os.getloadavg()[0],
        "focal_px": st.get("focal_px"), "focal_sigma_px": st.get("focal_sigma_px"),
        "focal_source": st.get("focal_source"),
    }


def robustness(seq, frames, cfg) -> list:
    """Clips made from the real frames: a black stretch, a jump cut (a whip pan), and a fast roll
    (the image turns 20° per frame up to 60° and stays there)."""
    from engine.metrics import ate
    n = len(frames)
    cut = min(100, n // 2)
    clips = {
        "blank stretch (15 black frames)": list(range(cut)) + [-1] * 15 + list(range(cut, n)),
        "jump cut (skips 70 frames)": list(range(cut)) + list(range(min(cut + 70, n - 30), n)),
    }
    clips["fast roll (20°/frame to 60°)"] = list(range(n))
    rolls = {"fast roll (20°/frame to 60°)": [0 if k < cut else min(20 * (k - cut + 1), 60) for k in range(n)]}
    out = []
    for name, order in clips.items():
        res, st, ev, _ = _run(seq, frames, order, cfg, rolls.get(name))
        segs = []
        for sg in sorted({r.segment for r in res}):
            rr = [r for r in res if r.segment == sg]
            gi = [order[r.index] for r in rr]
            e = ate(np.array([r.c2w for r in rr]), seq.gt_c2w[gi])["rmse"] if len(rr) >= 3 else None
            segs.append({"segment": sg, "frames": len(rr), "ate_cm": None if e is None else 100 * e})
        out.append({"clip": name, "input": len(order), "posed": len(res), "segments": segs,
                    "events": [e.message for e in ev if e.kind == "segment"]})
    return out


def soak(seq, cfg, n_frames: int, every: int = 1000, marks=(2000, 6000, 12000), use_tracemalloc=False) -> list:
    """The sequence's video (or frames) replayed in a loop for `n_frames` frames, headless, as fast
    as possible, through the run driver (as `reconstudio run ... --loop`, with the same bounded
    heap). Every `every` frames and at `marks`: process RSS, the engine's structure sizes
    (`GeometricSession.memory()`), optionally the Python heap traced by tracemalloc."""
    import time
    import tracemalloc
    from engine.api import open_session
    from engine.io.sources import open_source
    from engine.memory import bound_heap
    from engine.run_driver import RunDriver, Sink
    from engine.stats_csv import rss_mb
    bound_heap()
    video = seq.root / "video.mp4"
    src = open_source(str(video if video.exists() else seq.root / "rgb"), loop=True)
    s = open_session(cfg)
    rows = []
    if use_tracemalloc:
        tracemalloc.start()
    t0 = time.perf_counter()

    class Probe(Sink):
        n = 0
        peak = 0.0    # highest RSS sampled (every 50 frames) since the last row

        def on_results(self, results):
            for _ in results:
                self.n += 1
                if self.n % 50 == 0:
                    self.peak = max(self.peak, rss_mb() or 0.0)
                if self.n % every == 0 or self.n in marks:
                    row = {"frames": self.n, "t_s": round(time.perf_counter() - t0, 1), "rss_mb": rss_mb(),
                           "rss_peak_mb": self.peak, "load_avg_1min": os.getloadavg()[0], **s.memory(settle=True)}
                    self.peak = 0.0
                    if use_tracemalloc:
                        row["traced_mb"] = tracemalloc.get_traced_memory()[0] / 1e6
                    rows.append(row)
                    print("  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                          flush=True)

    try:
        RunDriver(src, s, [Probe()], max_frames=n_frames, stats_hz=0).run()
    finally:
        s.close()
        src.close()
    return rows


def _settings(pairs):
    """--set KEY=VALUE pairs → (SessionConfig fields, extra knobs); values are JSON where they parse."""
    import dataclasses
    from engine.api import SessionConfig
    names = {f.name for f in dataclasses.fields(SessionConfig)}
    fields, extra = {}, {}
    for kv in pairs:
        k, _, v = kv.partition("=")
        try:
            val = json.loads(v)
        except ValueError:
            val = v
        (fields if k in names else extra)[k] = val
    return fields, extra


def main(argv=None) -> int:
    from engine.api import SessionConfig
    from engine.evaluate import load_sequence
    p = argparse.ArgumentParser(prog="python -m benchmarks.geometric_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("sequence")
    p.add_argument("--max-frames", type=int, default=None)
    p.add_argument("--max-side", type=int, default=640)
    p.add_argument("--no-depth", action="store_true")
    p.add_argument("--no-intrinsics", action="store_true",
                   help="ignore the sequence's intrinsics: the engine self-calibrates its focal length")
    p.add_argument("--robustness", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--soak", type=int, default=0, metavar="N",
                   help="replay the clip in a loop for N frames and print RSS / structure sizes")
    p.add_argument("--tracemalloc", action="store_true", help="(with --soak) also trace the Python heap")
    p.add_argument("--loop-max-keyframes", type=int, default=1000)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a SessionConfig field (e.g. map_point_reuse=false) or a developer knob "
                        "(tracker_* / loop_*, passed in SessionConfig.extra)")
    a = p.parse_args(argv)
    fields, extra = _settings(a.set)
    seq = load_sequence(a.sequence)
    if a.soak:
        cfg = SessionConfig(engine="geometric", intrinsics=seq.intrinsics.as_tuple() if seq.intrinsics and not a.no_intrinsics else None,
                            max_side=a.max_side, depth=not a.no_depth, loop_max_keyframes=a.loop_max_keyframes,
                            extra=extra, **fields)
        rows = soak(seq, cfg, a.soak, use_tracemalloc=a.tracemalloc)
        if a.json:
            print(json.dumps(rows, indent=2))
        return 0
    frames = _frames(seq, a.max_frames or len(seq))
    cfg = SessionConfig(engine="geometric", intrinsics=seq.intrinsics.as_tuple() if seq.intrinsics and not a.no_intrinsics else None,
                        max_side=a.max_side, depth=not a.no_depth, extra=extra, **fields)
    rep = robustness(seq, frames, cfg) if a.robustness else speed_and_accuracy(seq, frames, cfg)
    if a.json:
        print(json.dumps(rep, indent=2))
    elif a.robustness:
        for c in rep:
            print(f"{c['clip']}: {c['posed']}/{c['input']} frames posed, segments "
                  + ", ".join(f"#{s['segment']} {s['frames']} frames ATE "
                              + ("n/a" if s["ate_cm"] is None else f"{s['ate_cm']:.2f} cm") for s in c["segments"]))
            for m in c["events"]:
                print(f"    event: {m}")
    else:
        for k, v in rep.items():
            print(f"{k:34s} {v:.3f}" if isinstance(v, float) else f"{k:34s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
