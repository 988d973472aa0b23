"""Offscreen draw rate of the live viewer's point-cloud visual at a full point budget, without Qt
(issue 26: "viewer >= 30 draws/s at the full point budget on the GPU"; issue 29's hardware-GL figure).

    python -m benchmarks.gpu_draw_bench --points 4000000 --seconds 10 --json $OUT/draw.json
    # a check on a CPU (Mesa llvmpipe through EGL):
    python -m benchmarks.gpu_draw_bench --points 200000 --seconds 2

The GL context is an EGL vispy application (ui/video_render.py's `_scene`, never vispy's
default); a SceneCanvas of `--size` with a turntable camera holds ONE `SegmentCloud` -- the
viewer's own visual (ui/cloud_visual.py: its shaders, one vertex buffer, the frame-transform
texture) -- filled with `--points` points (a seeded wavy terrain, colours from the height,
confidences and depths, frame numbers over `--frames` frames whose transforms are the
identity) and drawn whole, as the viewer draws a standing view at full detail (one draw of
every row). The camera turns a step before each draw.

Reported: draws/s of `canvas.render()` (the draw and the framebuffer read back: what a frame
costs end to end here), the cloud's own draw time (`time_draws`: glFinish before and after
its draw calls) p50 / p95, and the GL renderer.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def terrain(n: int, frames: int, seed: int = 0) -> dict:
    """n points of a wavy 20 x 20 m terrain (positions, packed colours, conf, depth, frame)."""
    from ui.cloud_visual import pack_rgb
    rng = np.random.default_rng(seed)
    xy = rng.uniform(-10.0, 10.0, (n, 2)).astype(np.float32)
    z = (0.6 * np.sin(0.7 * xy[:, 0]) * np.cos(0.5 * xy[:, 1])).astype(np.float32)
    pos = np.column_stack([xy, z]).astype(np.float32)
    t = (z - z.min()) / max(float(np.ptp(z)), 1e-6)
    rgb = (np.column_stack([t, 1.0 - np.abs(2 * t - 1), 1.0 - t]) * 255).astype(np.uint8)
    return {"positions": pos, "colors": pack_rgb(rgb), "conf": rng.uniform(1.0, 5.0, n).astype(np.float32),
            "depth": rng.uniform(0.5, 8.0, n).astype(np.float32),
            "frame": (np.arange(n) * frames // max(n, 1)).astype(np.float32)}


def gl_renderer() -> str:
    from vispy.gloo import gl
    try:
        return f"{gl.glGetParameter(gl.GL_RENDERER)} / {gl.glGetParameter(gl.GL_VERSION)}"
    except Exception as exc:          # a figure without its renderer name is still a figure
        return f"unknown ({type(exc).__name__})"


def run(args) -> dict:
    from ui.cloud_visual import SegmentCloud
    from ui.video_render import _scene
    scene, app = _scene()
    w, h = args.size
    canvas = scene.SceneCanvas(size=(w, h), show=False, bgcolor="black", keys=None, app=app)
    view = canvas.central_widget.add_view()
    view.camera = scene.cameras.TurntableCamera(fov=45.0, distance=25.0, elevation=30.0, azimuth=0.0)
    data = terrain(args.points, args.frames, args.seed)
    cloud = SegmentCloud(mode="points", capacity=args.points, parent=view.scene)
    cloud.write_rows(0, data["positions"], data["colors"], data["conf"], data["depth"], data["frame"])
    cloud.set_count(args.points)
    cloud.set_uniform("u_size", float(args.point_size))
    t0 = time.perf_counter()
    img = canvas.render()                 # the first draw uploads the buffer and builds the program
    first_s = time.perf_counter() - t0
    canvas.set_current()
    renderer = gl_renderer()
    lit = float((img[..., :3].max(axis=2) > 0).mean())
    cloud.time_draws = True
    draws, cloud_ms = 0, []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        view.camera.azimuth = (view.camera.azimuth + 2.0) % 360.0
        canvas.render()
        draws += 1
        if cloud.last_draw_ms is not None:
            cloud_ms.append(cloud.last_draw_ms)
    wall = time.perf_counter() - t0
    canvas.close()
    return {"points": args.points, "size": list(args.size), "point_size": args.point_size,
            "renderer": renderer, "egl_platform": os.environ.get("EGL_PLATFORM"),
            "first_draw_s": first_s, "pixels_lit": lit, "draws": draws, "seconds": wall,
            "draws_per_s": draws / wall if wall > 0 else None,
            "cloud_draw_ms_p50": float(np.percentile(cloud_ms, 50)) if cloud_ms else None,
            "cloud_draw_ms_p95": float(np.percentile(cloud_ms, 95)) if cloud_ms else None}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=4_000_000, help="the viewer's default point budget")
    ap.add_argument("--frames", type=int, default=200, help="frames the points are spread over")
    ap.add_argument("--size", type=int, nargs=2, default=(1280, 800), metavar=("W", "H"))
    ap.add_argument("--point-size", type=float, default=2.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    out = run(args)
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    main()
