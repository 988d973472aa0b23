"""I/O benchmark (figures, not tests): frame decoding, session-store writes, reload, exports.

    python -m benchmarks.io_bench [--data ../shared/data] [--frames 200] [--json OUT] [--density]
    python -m benchmarks.io_bench --writers 1,2,3     (only: what a background store sustains)
    python -m benchmarks.io_bench --formats [SESSION ...] (only: store format 2 against 3, per frame)

Uses the real ICL-NUIM clip and frames for decoding, and real 7-Scenes depth maps (with the
matching colour frames) as dense engine results for the store and the exporters.
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from engine.api import FrameResult, SessionConfig


def _timeit(fn, repeat=1):
    t = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    return (time.perf_counter() - t) / repeat, out


def _dense_results(data: Path, n: int, size) -> list:
    import cv2
    seq = data / "7scenes_redkitchen_150_199"
    rgb = sorted((seq / "rgb").glob("*.jpg"))
    dep = sorted((seq / "depth").glob("*.png"))
    w, h = size
    K = np.array([[585.0 * w / 640, 0, (319.5 + 0.5) * w / 640 - 0.5],
                  [0, 585.0 * h / 480, (239.5 + 0.5) * h / 480 - 0.5], [0, 0, 1]])
    out = []
    for i in range(n):
        j = i % len(rgb)
        img = cv2.cvtColor(cv2.imread(str(rgb[j])), cv2.COLOR_BGR2RGB)
        d = cv2.imread(str(dep[j]), cv2.IMREAD_UNCHANGED).astype(np.float32) / 1000.0
        img = cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)
        d = cv2.resize(d, (w, h), interpolation=cv2.INTER_NEAREST)
        conf = (1.0 + np.exp(-np.abs(np.gradient(d)[0]) * 20)).astype(np.float32)
        c2w = np.eye(4)
        c2w[0, 3] = 0.01 * i
        out.append(FrameResult(i, i / 30, True, c2w, K, img, d, conf, np.zeros(9, np.float32)))
    return out


def run(data: Path, frames: int) -> dict:
    from engine.io.export import export_npz, export_ply, export_tum
    from engine.geometry import collect_points
    from engine.io.sources import open_source
    from engine.io.store import SessionStore, load_session

    res: dict = {"machine": f"{platform.machine()} {platform.processor() or ''} {platform.node()}".strip(),
                 "frames": frames}
    clip = data / "icl_livingroom_kt3" / "video.mp4"
    for name, spec, kw in (("decode_video_640x480", clip, {}),
                           ("decode_video_max518", clip, {"max_side": 518}),
                           ("decode_folder_jpg_640x480", data / "icl_livingroom_kt3" / "rgb", {})):
        src = open_source(spec, **kw)
        t, n = _timeit(lambda: sum(1 for _ in src))
        src.close()
        res[name + "_fps"] = round(n / t, 1)

    for label, size in (("518x378", (518, 378)), ("640x480", (640, 480))):
        rs = _dense_results(data, frames, size)
        with tempfile.TemporaryDirectory() as tmp:
            for comp, bg in ((True, False), (False, False), (True, True)):
                folder = Path(tmp) / f"s{int(comp)}{int(bg)}"
                store = SessionStore(folder, SessionConfig(), "bench", compress=comp, background=bg)
                # time the caller pays inside write(); with a 30 ms engine step between frames
                # (sleep, which releases the GIL like a GPU wait) for the background writer
                t = 0.0
                for r in rs:
                    if bg:
                        time.sleep(0.03)
                    t0 = time.perf_counter()
                    store.write(r)
                    t += time.perf_counter() - t0
                t_all, _ = _timeit(store.close)
                kb = sum(p.stat().st_size for p in (folder / "frames").glob("*.npz")) / len(rs) / 1024
                key = f"store_{label}_{'deflate1' if comp else 'raw'}{'_background' if bg else ''}"
                res[key + "_ms_per_frame"] = round(1000 * t / len(rs), 2)
                if bg:
                    res[key + "_drain_ms"] = round(1000 * t_all, 1)
                else:
                    res[key + "_kb_per_frame"] = round(kb, 1)
            folder = Path(tmp) / "s10"
            t, loaded = _timeit(lambda: load_session(folder))
            res[f"load_session_{label}_ms"] = round(1000 * t, 1)
            if label == "640x480":
                for stride in (1, 2):
                    t, (pts, cols, conf) = _timeit(lambda: collect_points(loaded.results, 0.0, stride))
                    res[f"collect_points_stride{stride}_ms"] = round(1000 * t, 1)
                    res[f"points_stride{stride}"] = len(pts)
                    t, _ = _timeit(lambda: export_ply(Path(tmp) / "a.ply", pts, cols, conf))
                    res[f"export_ply_stride{stride}_ms"] = round(1000 * t, 1)
                t, _ = _timeit(lambda: export_npz(Path(tmp) / "a.npz", loaded.results, pts, cols))
                res["export_npz_stride2_ms"] = round(1000 * t, 1)
                import scipy.spatial.transform  # noqa: F401  (time the export, not the import)
                t, _ = _timeit(lambda: export_tum(Path(tmp) / "a.txt", loaded.results))
                res["export_tum_ms"] = round(1000 * t, 1)
    return res


def density(data: Path, frames: int) -> dict:
    """Store size against export density: every layout of the session store, on dense engine
    results (every frame with depth, as a neural engine gives), points exported at stride 2 of the
    RESULT resolution against the points the viewer draws from the live results (stride 2)."""
    from engine.geometry import collect_points
    from engine.io.export import plan_export
    from engine.io.store import SessionStore, load_session

    res: dict = {}
    for label, size in (("518x378", (518, 378)), ("640x480", (640, 480))):
        rs = _dense_results(data, frames, size)
        live = len(collect_points(rs, 0.0, 2)[0])
        res[f"density_{label}_live_points_stride2"] = live
        layouts = (("v1_256px_f32_raw", dict(max_side=256, depth_dtype="float32", image_codec="raw")),
                   ("full_f32_raw", dict(depth_dtype="float32", image_codec="raw")),
                   ("full_f16_raw", dict(image_codec="raw")),
                   ("full_f16_jpeg_default", dict()))
        with tempfile.TemporaryDirectory() as tmp:
            for name, kw in layouts:
                folder = Path(tmp) / name
                store = SessionStore(folder, SessionConfig(), "bench", **kw)
                t, _ = _timeit(lambda: [store.write(r) for r in rs])
                store.close()
                kb = sum(p.stat().st_size for p in (folder / "frames").glob("*.npz")) / len(rs) / 1024
                tl, loaded = _timeit(lambda: load_session(folder))
                plan = plan_export(loaded, stride=2, result_width=size[0])
                key = f"density_{label}_{name}"
                res[key + "_kb_per_frame"] = round(kb, 1)
                res[key + "_write_ms_per_frame"] = round(1000 * t / len(rs), 2)
                res[key + "_load_ms"] = round(1000 * tl, 1)
                res[key + "_export_points_pct_of_live"] = round(100.0 * plan["points"] / max(live, 1), 1)
    return res


def writer_capacity(data: Path, frames: int, counts) -> dict:
    """Frames per second a background store (default encoding) sustains with each writer count:
    results written back to back (no engine between them), timed to the end of `close` (all on
    disk). A run's engine can go no faster than this for long (the queue fills)."""
    import os
    from engine.io.store import SessionStore
    res: dict = {"cpu_count": os.cpu_count()}
    rs = _dense_results(data, frames, (518, 392))
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            store = SessionStore(Path(tmp) / f"w{n}", SessionConfig(), "bench", background=True,
                                 queue_size=4, writers=n)
            t0 = time.perf_counter()
            for r in rs:
                store.write(r)
            store.close()
            res[f"store_518x392_writers{n}_fps"] = round(len(rs) / (time.perf_counter() - t0), 1)
    return res


def _format2_bytes(r: FrameResult) -> bytes:
    """A frame file as store format 2 wrote it (the baseline of `formats`): float16 depth and
    confidence deflated as they are, the JPEG member deflated too."""
    import io
    import zipfile
    from .store import _encode_jpeg, _to_f16
    arrays = {"c2w": np.asarray(r.c2w, np.float64), "K": np.asarray(r.K, np.float64),
              "timestamp": np.float64(r.timestamp), "index": np.int64(r.index),
              "is_keyframe": np.bool_(r.is_keyframe), "segment": np.int64(r.segment),
              "image_jpeg": _encode_jpeg(np.ascontiguousarray(r.image, np.uint8))}
    for name in ("depth", "conf"):
        if getattr(r, name) is not None:
            arrays[name] = _to_f16(getattr(r, name))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for name, a in arrays.items():
            with z.open(f"{name}.npy", "w", force_zip64=True) as out:
                np.lib.format.write_array(out, a, allow_pickle=False)
    return buf.getvalue()


def _format3_bytes(r: FrameResult) -> bytes:
    """A frame file as the store writes it now."""
    import io
    from .store import _result_arrays, _save_npz
    buf = io.BytesIO()
    _save_npz(buf, _result_arrays(r), compress=True)
    return buf.getvalue()


def _planes2(r: FrameResult) -> int:
    """Deflated bytes of depth + confidence as format 2 stored them (interleaved float16)."""
    import zlib
    from .store import _to_f16
    return sum(len(zlib.compress(_to_f16(a).tobytes(), 1)) for a in (r.depth, r.conf) if a is not None)


def _planes3(r: FrameResult) -> int:
    """Deflated bytes of depth + confidence as format 3 stores them (byte-shuffled planes)."""
    import zlib
    from .store import shuffle_f16
    return sum(len(zlib.compress(shuffle_f16(a).tobytes(), 1)) for a in (r.depth, r.conf) if a is not None)


def formats(data: Path, frames: int, sessions, repeat: int = 5) -> dict:
    """Store format 2 against 3 on the same results: bytes per frame file, the CPU cost of encoding a
    whole frame file (JPEG + planes + deflate into memory; the disk write itself excluded) and of
    the depth + confidence planes alone (the part format 3 changed). Each frame is encoded both
    ways in turn, `repeat` times, keeping the fastest: a loaded machine slows both alike.
    Results: the frames of saved sessions (any format), else 7-Scenes dense results at 518x392."""
    from .store import load_session
    res: dict = {}
    for spec in sessions or [None]:
        if spec is None:
            label, rs = "7scenes_dense_518x392", _dense_results(data, frames, (518, 392))
        else:
            label = Path(spec).name
            loaded = load_session(spec)
            rs = loaded.results[:frames]
            files = sorted((Path(spec) / "frames").glob("*.npz"))
            res[f"{label}_stored_format"] = loaded.info.get("version")
            res[f"{label}_stored_kb_per_frame"] = round(sum(p.stat().st_size for p in files) / max(len(files), 1) / 1024, 1)
            dense = [r for r in rs if r.depth is not None]
            res[f"{label}_depth_size"] = "x".join(map(str, dense[0].depth.shape[::-1])) if dense else "-"
            res[f"{label}_frames_with_depth"] = len(dense)
        res[f"{label}_frames"] = len(rs)
        coders = {"format2": _format2_bytes, "format3": _format3_bytes,
                  "format2_planes": _planes2, "format3_planes": _planes3}
        size = dict.fromkeys(coders, 0)
        spent = dict.fromkeys(coders, 0.0)
        for r in rs:
            best, n = dict.fromkeys(coders, float("inf")), {}
            for _ in range(repeat):
                for name, enc in coders.items():
                    t0 = time.thread_time()       # CPU time: other processes' load does not count
                    out = enc(r)
                    best[name] = min(best[name], time.thread_time() - t0)
                    n[name] = out if isinstance(out, int) else len(out)
            for name in coders:
                size[name] += n[name]
                spent[name] += best[name]
        for name in coders:
            res[f"{label}_{name}_kb_per_frame"] = round(size[name] / max(len(rs), 1) / 1024, 1)
            res[f"{label}_{name}_encode_cpu_ms_per_frame"] = round(1000 * spent[name] / max(len(rs), 1), 2)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[3] / "shared" / "data"))
    p.add_argument("--frames", type=int, default=200)
    p.add_argument("--json", help="also write the figures to this JSON file")
    p.add_argument("--density", action="store_true",
                   help="only the store size vs export density table (every store layout)")
    p.add_argument("--writers", default=None,
                   help="only the background store's capacity with these writer counts (e.g. 1,2,3)")
    p.add_argument("--formats", nargs="*", default=None, metavar="SESSION",
                   help="only store format 2 against 3 (bytes, encoding ms per frame) on these saved "
                        "sessions' frames, or on 7-Scenes dense results when none is given")
    args = p.parse_args(argv)
    if args.formats is not None:
        res = formats(Path(args.data), args.frames, args.formats)
    elif args.writers:
        res = writer_capacity(Path(args.data), args.frames, [int(x) for x in args.writers.split(",")])
    elif args.density:
        res = density(Path(args.data), args.frames)
    else:
        res = run(Path(args.data), args.frames)
    for k, v in res.items():
        print(f"{k:45s} {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
