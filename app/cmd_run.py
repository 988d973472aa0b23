"""`reconstudio run INPUT`: reconstruct a video, an image folder or a webcam headless.

Frames go through the chosen engine with a progress bar; every result is written to a session
folder as it arrives (crash-safe, reopenable in the GUI), and at the end the requested exports
(PLY, NPZ, TUM trajectory, COLMAP, nerfstudio, OBJ, GLB, rerun .rrd, MP4 video) are written from
that folder with re-alignments applied. Bad input
is one line on stderr and exit code 2; Ctrl-C or SIGTERM stops after the current frame, keeps and
exports what was done, marks the session as cut short (exit 130). A full disk ends the run the same
way, with "disk full" and exit 74 (the exports still written where they fit). The run path is the
GUI's: the session comes from the stream layer (engine/shared_streams.py `StreamHubs`) and
engine.run_driver's `RunDriver` drives it. Exports stream from the session folder, small ones
first (trajectory, COLMAP, PLY, GLB, NPZ); one that would hold no point (no pose) is not written
and the run exits 1 saying why; a signal during the exports aborts the one being written (whole
or absent, no temp file) and exits 130.

INPUT may also be a saved session folder: its results are exported again (e.g. with another
confidence threshold or stride) without running an engine. Several INPUTs run together, one
RunDriver thread each over sessions of one shared model, their frames batched by the stream
scheduler (`run_many`, at the end of this module).

Module level imports nothing heavy (no torch, cv2 or Qt): the parser is built for every command.
"""
from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from pathlib import Path

from app.config_flags import add_session_flags, given_settings

EXIT_EMPTY_EXPORT = 1             # an export would hold no point / no pose (the others are written)
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_DISK_FULL = 74               # sysexits' EX_IOERR: the session's disk filled during the run


def _defaults() -> dict:
    try:
        from resources import default_settings
        return default_settings()
    except Exception:  # a broken resources folder must not break the CLI's --help
        return {}


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = _defaults()
    export = d.get("export", {})
    p.add_argument("input", metavar="INPUT",
                   help="video file, image folder (jpg/jpeg/png, sorted by name), webcam:N, or a saved "
                        "session folder (then only the exports are written, no engine runs)")
    p.add_argument("more_inputs", nargs="*", metavar="INPUT",
                   help="more inputs: run together through the stream scheduler (LingBot-Map, one shared "
                        "model, batched steps; outputs get each input's name appended)")
    # every engine setting (--engine, --checkpoint, --window, --kv-dtype, --intrinsics, ...) from
    # the SessionConfig metadata; --fps also times image folders
    add_session_flags(p, defaults={"engine": d.get("engine", "geometric"), "device": "auto",
                                   "dtype": "bf16 on cuda, fp32 on cpu",
                                   "intrinsics": "intrinsics.txt beside the input, else the assumed FOV"})
    i = p.add_argument_group("input")
    i.add_argument("--max-frames", type=int, default=None, metavar="N", help="stop after N input frames")
    i.add_argument("--start", type=int, default=0, metavar="N", help="start at input frame N (files)")
    i.add_argument("--loop", action="store_true",
                   help="files: start again at the end (stop with --max-frames, Ctrl-C or SIGTERM)")
    i.add_argument("--speed", type=float, default=0.0, metavar="X",
                   help="replay pacing: 0 = as fast as possible (default), 1 = real time, X = X times real time")
    i.add_argument("--prefetch", type=int, default=3, metavar="N",
                   help="files: decode and preprocess up to N frames ahead on a reader thread, overlapping "
                        "the engine (default 3; 0 = read on the engine's thread)")
    # the old name of --decode-max-side (the SessionConfig setting the GUI uses too)
    i.add_argument("--resize", type=int, dest="decode_max_side", metavar="PX", help=argparse.SUPPRESS)
    o = p.add_argument_group("output")
    o.add_argument("--ply", metavar="OUT", help="write the point cloud (binary PLY)")
    o.add_argument("--npz", metavar="OUT", help="write poses, intrinsics, depth, confidence and points (NPZ)")
    o.add_argument("--trajectory", metavar="OUT", help="write the camera trajectory (TUM format)")
    o.add_argument("--colmap", metavar="DIR",
                   help="write a COLMAP model (DIR/images + DIR/sparse/0, text and binary) for COLMAP, "
                        "nerfstudio, gsplat")
    o.add_argument("--glb", metavar="OUT", help="write a GLB scene: point cloud, trajectory and camera frustums")
    o.add_argument("--nerfstudio", metavar="DIR",
                   help="write nerfstudio data (DIR/transforms.json + images/ + sparse_pc.ply) for ns-train, "
                        "splatfacto, gsplat")
    o.add_argument("--obj", metavar="OUT", help="write the point cloud as OBJ vertices with colours (Blender)")
    o.add_argument("--rrd", metavar="OUT",
                   help="write a rerun recording (points, cameras, images, depth per frame; needs rerun-sdk)")
    o.add_argument("--video", metavar="OUT", help="render the camera path to an MP4 (offscreen)")
    o.add_argument("--video-orbit", action="store_true", help="--video: an orbit around the scene instead")
    o.add_argument("--video-size", default="1280x720", metavar="WxH", help="--video frame size (default %(default)s)")
    o.add_argument("--video-fps", type=float, default=30.0, metavar="N", help="--video frame rate (default %(default)s)")
    o.add_argument("--keyframes-only", action="store_true",
                   help="export keyframes only (default: every frame)")
    o.add_argument("--no-frustums", action="store_true", help="GLB without camera frustums")
    o.add_argument("--max-points", type=int, default=None, metavar="N",
                   help="thin the exported points evenly to at most N (e.g. a COLMAP model from a dense session)")
    # session edits (engine/io/edits.py): a saved session's own edits.json applies by default
    o.add_argument("--crop", metavar="FILE",
                   help="apply the edits (crop, outlier removal, floor, metric scale) of this edits.json "
                        "to the exports instead of the session's own")
    o.add_argument("--no-edits", action="store_true",
                   help="export the raw session, ignoring the edits saved with it in the viewer")
    o.add_argument("--session-dir", metavar="DIR",
                   help="write the session store into DIR (must be new or empty; default: a new "
                        "folder under ~/.local/share/reconstudio/sessions or $RECONSTUDIO_SESSIONS)")
    o.add_argument("--conf-threshold", type=float, default=float(export.get("conf_threshold", 0.0)),
                   metavar="X", help="export only points with confidence >= X, in the engine's absolute "
                                     "units as the GUI's Min confidence (default %(default)s)")
    o.add_argument("--stride", type=int, default=int(export.get("stride", 2)), metavar="N",
                   help="export every N-th pixel of each frame's depth map at the engine's result "
                        "resolution, as the GUI's Subsample (default %(default)s)")
    o.add_argument("--stats-csv", metavar="FILE",
                   help="write one row of run statistics per second (frames, engine_fps, rss_mb, "
                        "gpu_allocated_mb, dropped, ...)")
    o.add_argument("--stats-json", metavar="FILE",
                   help="write the engine's statistics at the end of the run (attention paths, CUDA "
                        "graph replays, kernel fallbacks, timing) and the driver's per-frame times")
    o.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


class _BadInput(Exception):
    pass


def _check_output(path: str, flag: str) -> Path:
    """Fail before the run, not after it, if an output cannot be written."""
    import os
    p = Path(path).expanduser()
    if p.is_dir():
        raise _BadInput(f"{flag} {path}: is a folder; give a file name")
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise _BadInput(f"{flag} {path}: cannot write into {parent}")
    return p


def decode_max_side(args):
    """The decode size of the input (SessionConfig.decode_max_side: --decode-max-side, else its
    default), the same the GUI decodes at, so both see the same frames; None (0) = the input's size."""
    from engine.api import SessionConfig
    v = getattr(args, "decode_max_side", None)
    if v is not None and v < 0:
        raise _BadInput(f"--decode-max-side must be 0 (the input's size) or positive, got {v}")
    return (SessionConfig().decode_max_side if v is None else int(v)) or None


def _build_config(args, source):
    from engine.api import SessionConfig, engine_capabilities, setting_problems

    try:
        given = given_settings(args)
    except ValueError as exc:
        raise _BadInput(str(exc)) from None
    engine = given.get("engine") or _defaults().get("engine", "geometric")
    caps = engine_capabilities(engine)      # EngineError for an unknown engine
    checkpoint = given.get("checkpoint")
    if caps.get("needs_checkpoint") and not checkpoint:
        raise _BadInput(f"engine {engine} needs weights: pass --checkpoint PATH")
    if checkpoint and not Path(checkpoint).expanduser().is_file():
        raise _BadInput(f"checkpoint not found: {checkpoint}")
    device = given.get("device") or "auto"
    if device == "auto":
        device = "cpu"
        if "cuda" in (caps.get("devices") or []):
            import torch
            device = "cuda" if torch.cuda.is_available() else "cpu"
    given.update(engine=engine, device=device,
                 dtype=given.get("dtype") or ("bf16" if device.startswith("cuda") else "fp32"))
    cfg = SessionConfig(**given)
    problems = setting_problems(cfg)
    if problems:
        raise _BadInput("; ".join(problems))
    cfg.fps = float(source.fps)
    from engine.intrinsics import attach_found_intrinsics, read_intrinsics
    if cfg.intrinsics_file:
        read_intrinsics(cfg.intrinsics_file)      # a bad file fails now, not at the first frame
    return cfg, attach_found_intrinsics(cfg, getattr(source, "path", None))


def _is_session_folder(spec: str) -> bool:
    p = Path(str(spec)).expanduser()
    return p.is_dir() and (p / "config.json").is_file() and (p / "frames").is_dir()


def _check_output_dir(path: str, flag: str) -> Path:
    """A folder output (COLMAP): new, or an existing folder we can write into."""
    import os
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise _BadInput(f"{flag} {path}: is a file; give a folder")
    parent = p
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not os.access(parent, os.W_OK):
        raise _BadInput(f"{flag} {path}: cannot write into {parent}")
    return p


def _export(source, args, outputs: dict) -> tuple[dict, str]:
    """All requested exports through engine.io.export.export_results (the GUI's function too),
    streamed from the session folder `source`, small ones first, with a progress bar. Returns
    (summary, error): error is "" or why an export was not written (it would hold no point / no
    pose); the others are written all the same. An export that keeps almost nothing is written
    with a warning. Ctrl-C / SIGTERM meanwhile abort the export being written (whole or absent:
    no temp file left) and skip the rest."""
    from engine.io.export import EmptyExportError, export_results

    opts = dict(conf_threshold=args.conf_threshold, stride=args.stride, keyframes_only=args.keyframes_only)
    source = _with_edits(source, args)
    if "video" in outputs:
        from ui.video_render import OffscreenRenderer     # vispy offscreen (EGL), no Qt
        opts.update(video_size=_video_size(args), video_fps=args.video_fps, video_orbit=args.video_orbit,
                    video_renderer=OffscreenRenderer)
    error = ""
    with _abort_on_signals():
        try:
            out = export_results(source, {("tum" if k == "trajectory" else k): v for k, v in outputs.items()},
                                 frustums=not args.no_frustums, max_points=args.max_points,
                                 progress=not args.quiet, **opts)
        except EmptyExportError as exc:
            out = {"files": exc.files, "frames": 0, "points": 0, "warning": None, "cut_short": ""}
            error = str(exc)
        except KeyboardInterrupt:
            print("reconstudio run: exports stopped: those finished are whole, the one being written "
                  "was removed, the rest were not written", file=sys.stderr)
            raise
    if out.get("warning"):
        print(f"warning: {out['warning']}", file=sys.stderr)
    if out.get("cut_short"):
        print(f"warning: this session was cut short ({out['cut_short']}): the export holds only "
              "what was done", file=sys.stderr)
    return out, error


def _with_edits(source, args):
    """`source` (a session folder or a FrameReader) with the edits --crop / --no-edits ask for;
    unchanged (the session's own edits) without them."""
    crop, raw = getattr(args, "crop", None), getattr(args, "no_edits", False)
    if not crop and not raw:
        return source
    from engine.io.edits import read_edits_file
    from engine.io.session_reader import read_session
    edits = None if raw else read_edits_file(crop)
    if isinstance(source, (str, Path)):
        return read_session(source, progress=not args.quiet, edits=edits)
    source.set_edits(edits)
    return source


@contextlib.contextmanager
def _abort_on_signals():
    """During the exports Ctrl-C and SIGTERM raise KeyboardInterrupt: the export being written
    removes its temp file (engine.io.atomic) and the exports not yet started are skipped, so a
    stop signal (e.g. a second one after the run was stopped) never leaves a half-written file."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _report_export(out: dict, error: str, args, what: str, outputs: dict) -> int:
    """The files written, the summary line, the error of an empty export (exit 1)."""
    if not args.quiet:
        for f in out.get("files", []):
            print(f"wrote {f}", file=sys.stderr)
        if not error and set(outputs) - {"trajectory"}:
            print(f"{out['frames']} frames, {out['points']:,} points exported {what}(confidence >= "
                  f"{args.conf_threshold:g}, stride {args.stride})", file=sys.stderr)
        elif not error:
            print(f"{out['frames']} poses exported {what}".rstrip(), file=sys.stderr)
    if error:
        print(f"reconstudio run: error: {error}", file=sys.stderr)
        return EXIT_EMPTY_EXPORT
    return 0


FILE_OUTPUTS = ("ply", "npz", "trajectory", "glb", "obj", "rrd", "video")
DIR_OUTPUTS = ("colmap", "nerfstudio")


def _video_size(args) -> tuple:
    from engine.io.video import parse_size
    try:
        return parse_size(args.video_size)
    except ValueError as exc:
        raise _BadInput(f"--video-size: {exc}") from None


def _outputs(args) -> dict:
    """{flag: path} of the requested exports, each checked before any work."""
    outputs = {flag: _check_output(getattr(args, flag), f"--{flag}")
               for flag in FILE_OUTPUTS if getattr(args, flag, None)}
    for flag in DIR_OUTPUTS:
        if getattr(args, flag, None):
            outputs[flag] = _check_output_dir(getattr(args, flag), f"--{flag}")
    if "video" in outputs:
        _video_size(args)
        if not args.video_fps or args.video_fps <= 0:
            raise _BadInput(f"--video-fps must be positive, got {args.video_fps}")
    return outputs


def _export_only(args, outputs: dict) -> int:
    """INPUT is a saved session folder: export it again (other threshold / stride), no engine.
    Streamed: the poses are read first (small members only), frames one at a time."""
    from engine.io.session_reader import read_session

    if not outputs:
        raise _BadInput(f"{args.input} is a saved session: give --ply, --npz, --trajectory, --colmap, "
                        "--nerfstudio, --glb, --obj, --rrd and/or --video to export it")
    from engine.io.lease import hold_session
    with hold_session(args.input, role="export"):   # retention elsewhere leaves it alone meanwhile
        reader = read_session(args.input, progress=not args.quiet)
        for problem in reader.problems:
            print(f"warning: {problem}", file=sys.stderr)
        if not reader.poses:
            raise _BadInput(f"session {args.input} holds no frames")
        out, error = _export(reader, args, outputs)
    return _report_export(out, error, args, f"from session {reader.folder} ", outputs)


def main(args) -> int:
    from engine.api import EngineError

    try:
        if getattr(args, "crop", None):           # a bad edits file fails before the run, not after it
            if getattr(args, "no_edits", False):
                raise _BadInput("--crop and --no-edits contradict each other; give one")
            from engine.io.edits import read_edits_file
            read_edits_file(args.crop)
        if getattr(args, "more_inputs", None):
            return run_many(args, [args.input, *args.more_inputs])
        return _run(args)
    except (EngineError, _BadInput) as exc:
        from engine.io.store import is_disk_full
        print(f"reconstudio run: error: {exc}", file=sys.stderr)
        return EXIT_DISK_FULL if is_disk_full(exc) else EXIT_BAD_INPUT
    except KeyboardInterrupt:     # a second Ctrl-C: aborted at once (the store keeps what it wrote)
        print("reconstudio run: aborted; the session folder keeps the frames written so far", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(args) -> int:
    from tqdm import tqdm

    from engine.memory import bound_heap
    bound_heap()                    # long runs: RSS follows what is held (engine/memory.py)

    from engine.io.sources import open_source
    from engine.io.store import DiskFullError, SessionStore, default_session_root, new_session_folder
    from engine.run_driver import CallbackSink, RunDriver, StoreSink
    from engine.shared_streams import StreamHubs

    outputs = _outputs(args)
    if args.stride < 1:
        raise _BadInput(f"--stride must be at least 1, got {args.stride}")
    if args.max_points is not None and args.max_points < 1:
        raise _BadInput(f"--max-points must be at least 1, got {args.max_points}")
    if args.max_frames is not None and args.max_frames < 1:
        raise _BadInput(f"--max-frames must be at least 1, got {args.max_frames}")
    if args.fps is not None and args.fps <= 0:
        raise _BadInput(f"--fps must be positive, got {args.fps}")
    if args.prefetch < 0:
        raise _BadInput(f"--prefetch must be 0 or more frames, got {args.prefetch}")
    if args.speed < 0:
        raise _BadInput(f"--speed must be 0 (as fast as possible) or positive, got {args.speed}")
    stats_csv = _check_output(args.stats_csv, "--stats-csv") if args.stats_csv else None
    stats_json = _check_output(args.stats_json, "--stats-json") if args.stats_json else None

    if _is_session_folder(args.input):
        return _export_only(args, outputs)
    source = open_source(args.input, fps=args.fps, max_side=decode_max_side(args), loop=args.loop)
    session = store = driver = disk_full = None
    last_warning: list = []               # the engine's last warning, repeated with a "no results" error
    try:
        if args.start:
            source.seek(args.start)
        cfg, intr_note = _build_config(args, source)
        session = StreamHubs().open_session(cfg, source)    # the stream layer, as the GUI's runs
        log = (lambda msg: None) if args.quiet else (lambda msg: tqdm.write(msg, file=sys.stderr))
        if args.session_dir:
            folder = Path(args.session_dir).expanduser()
        else:
            _retention(default_session_root(), log)
            folder = new_session_folder(source.name)
        # the bounded background writer: compression overlaps the engine, a slow disk makes it wait
        store = SessionStore(folder, cfg, str(args.input), background=True, queue_size=4,
                             meta={"kind": source.kind, "name": source.name, "fps": source.fps,
                                   "frames": len(source), "start": args.start, "intrinsics": intr_note})
        total = len(source) - args.start if len(source) and not args.loop else None
        if args.max_frames:
            total = min(total, args.max_frames) if total else args.max_frames
        log(f"{source.kind} {source.name}: {len(source) or 'unknown number of'} frames at {source.fps:g} fps; "
            f"engine {cfg.engine} on {cfg.device}; intrinsics: {intr_note}")
        log(f"session folder: {store.folder}")
        bar = tqdm(total=total, unit="frame", file=sys.stderr, disable=args.quiet, dynamic_ncols=True)

        def on_stats(st):
            bar.n = st.get("frames_in", bar.n)
            fps = st.get("fps")
            bar.set_postfix(results=st.get("results_total"), fps=f"{fps:.1f}" if fps else "-",
                            **({"dropped": st["dropped"]} if st.get("dropped") else {}), refresh=False)
            bar.refresh()

        def on_event(e):
            if e.kind == "warning" and e.message:
                last_warning[:] = [e.message]    # said again with a "no results" error, even with --quiet
            if e.kind in ("warning", "segment") and e.message:
                log(f"{e.kind}: {e.message}")

        sinks = [StoreSink(store), CallbackSink(event=on_event, message=lambda m: log(f"warning: {m}"),
                                               stats=on_stats)]
        if stats_csv:
            from engine.stats_csv import StatsCsvSink
            sinks.append(StatsCsvSink(stats_csv))
        driver = RunDriver(source, session, sinks, speed=args.speed, max_frames=args.max_frames,
                           prefetch=args.prefetch)
        with _stop_on_signals([driver], log):
            try:
                summary = driver.run()
            except DiskFullError as exc:      # the store closed itself: export what it holds
                disk_full, summary = exc, driver.summary
        bar.close()
        store = None                          # closed (and marked when cut short) by its sink
    finally:
        for obj in (session, store, source):
            if obj is not None:
                try:
                    obj.close()
                except Exception:   # closing must not hide the run's own error
                    pass
    if driver is None:
        return EXIT_BAD_INPUT
    if stats_json:
        _write_stats_json(stats_json, summary.stats, driver.run_stats())
    interrupted = bool(summary.interrupted)
    folder = driver.sinks[0].store.folder
    if summary.results == 0:
        why = f": {last_warning[0]}" if last_warning else ""
        print(f"reconstudio run: error: the engine produced no results from {summary.frames_in} frames "
              f"(no session was kept){why}", file=sys.stderr)
        return EXIT_INTERRUPTED if interrupted else EXIT_BAD_INPUT
    if interrupted:
        print(f"interrupted ({summary.interrupted}): the session keeps the {summary.results} results done; "
              + ("writing the requested exports from them" if outputs else "no exports were requested"),
              file=sys.stderr)
    if disk_full is not None:
        print(f"reconstudio run: error: {disk_full}" + ("; writing the requested exports from it" if outputs
                                                       else ""), file=sys.stderr)
    if not args.quiet:
        fps = summary.stats.get("fps")
        elapsed = summary.wall_s
        dropped = f", {summary.dropped} live frames dropped" if summary.dropped else ""
        print(f"{summary.frames_in} frames → {summary.results} results in {elapsed:.1f} s "
              f"({summary.frames_in / max(elapsed, 1e-9):.1f} frames/s overall"
              f"{f', engine {fps:.1f} fps' if fps else ''}{dropped}); session: {folder}", file=sys.stderr)
        if summary.stats.get("focal_source") not in (None, "stated"):   # the engine's own focal length
            print(f"intrinsics: {summary.stats.get('intrinsics')}", file=sys.stderr)
    code = 0
    if outputs:
        from engine.io.lease import hold_session
        with hold_session(folder, role="export"):
            out, error = _export(folder, args, outputs)
        code = _report_export(out, error, args, "", outputs)
    if disk_full is not None:
        return EXIT_DISK_FULL
    return EXIT_INTERRUPTED if interrupted else code


def _write_stats_json(path: Path, stats: dict, run: dict) -> None:
    """The session's last stats() (without the per-page map) and the driver's timing as JSON."""
    import json

    import numpy as np

    def plain(v):
        if isinstance(v, np.generic):
            return v.item()
        if isinstance(v, np.ndarray):
            return v.tolist()
        return str(v)
    body = {"engine": {k: v for k, v in stats.items() if k != "kv_page_map"}, "driver": run}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=1, default=plain))


@contextlib.contextmanager
def _stop_on_signals(drivers: list, log):
    """Ctrl-C / SIGTERM end the run cleanly: every driver stops after its current frame, the engine
    is flushed into the store, the session is marked cut short and the exports are written from
    what was done. A second Ctrl-C aborts at once (the store still keeps every frame written)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    names = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}

    def handler(signum, frame):
        if any(d.stopping for d in drivers):
            raise KeyboardInterrupt
        log(f"{names.get(signum, signum)}: stopping after the current frame, keeping and exporting "
            "what was done (press Ctrl-C again to abort)")
        for d in drivers:
            d.stop(names.get(signum, str(signum)))

    old = {s: signal.signal(s, handler) for s in names}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _retention(root: Path, log) -> None:
    """Apply the session size / age limits of the app settings before a new session starts."""
    from engine.io.retention import apply_retention, format_bytes, list_sessions

    try:
        from app.settings import retention_limits
        max_gb, max_days = retention_limits()
    except Exception:                   # settings unreadable: the shipped defaults
        from engine.io.retention import DEFAULT_MAX_AGE_DAYS, DEFAULT_MAX_GB
        max_gb, max_days = DEFAULT_MAX_GB, DEFAULT_MAX_AGE_DAYS
    before = {e.folder: e.bytes for e in list_sessions(root)}
    deleted = apply_retention(root, max_gb=max_gb, max_age_days=max_days)
    if deleted:
        freed = sum(before.get(p, 0) for p in deleted)
        log(f"removed {len(deleted)} old session(s) ({format_bytes(freed)}) from {root} to stay within "
            f"{max_gb:g} GB / {max_days:g} days (settings: sessions retention)")


# --- several inputs -------------------------------------------------------------------------
# `reconstudio run A B ...`: several inputs at once, each driven by its own RunDriver (one thread
# per input) over a session of the stream layer (engine/shared_streams.py), exactly as the GUI runs
# a second source beside the first.
#
# All inputs share one loaded LingBot-Map model; their streamed frames are batched into one forward
# per round. Each input gets its own session folder (under --session-dir, one sub-folder per input,
# or the default session root) and its own exports: an output name gets the input's name appended
# (`--ply out.ply` -> out-<name>.ply), or put `{name}` in it. An input whose caches would not fit
# is refused with the scheduler's message and the others run; an input that fails mid-run ends
# alone. Ctrl-C stops all inputs, keeps and exports what was done (exit 130). Engine settings are
# shared by every input. `--stats-json` is written per input (the same name rule): that stream's
# last engine stats, its driver's run statistics, its stream statistics and the scheduler's round
# statistics; `--stats-csv` (per-frame driver rows) takes one input.

def _per_input(path: Path, name: str) -> Path:
    """out.ply -> out-<name>.ply; a `{name}` placeholder is filled instead."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "input"
    s = str(path)
    if "{name}" in s:
        return Path(s.replace("{name}", safe))
    return path.with_name(f"{path.stem}-{safe}{path.suffix}")


class _Peeked:
    """A source whose first frame was read ahead (its size makes the scheduler's admission
    estimate exact): `read` hands that frame out first, then reads on; the rest is the source's."""

    def __init__(self, source):
        self._source = source
        self.first = source.read()

    def read(self):
        f, self.first = self.first, None
        return f if f is not None else self._source.read()

    def seek(self, index: int) -> None:
        self.first = None
        self._source.seek(index)

    def __len__(self) -> int:
        return len(self._source)

    def __getattr__(self, name: str):
        return getattr(self._source, name)


def _drive_all(drivers: list) -> list:
    """Each driver's run on a thread of its own (their frames meet in the stream layer's rounds),
    joined; returns the exception each run ended on (None where it finished)."""
    import threading

    errors: list = [None] * len(drivers)

    def work(i, driver):
        try:
            driver.run()
        except BaseException as exc:      # reported per input; the others run on
            errors[i] = exc

    threads = [threading.Thread(target=work, args=(i, d), name=f"reconstudio-run-{i}", daemon=True)
               for i, d in enumerate(drivers)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)                   # short joins: the signal handlers run meanwhile
    return errors


def run_many(args, inputs: list) -> int:
    from engine.io.sources import open_source
    from engine.io.store import SessionStore, default_session_root, is_disk_full, new_session_folder
    from engine.run_driver import CallbackSink, RunDriver, StoreSink
    from engine.scheduler import AdmissionError
    from engine.shared_streams import StreamHubs, shares_model

    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    for spec in inputs:
        if _is_session_folder(spec):
            raise _BadInput(f"{spec} is a saved session: re-export saved sessions one at a time")
    if args.stride < 1:
        raise _BadInput(f"--stride must be at least 1, got {args.stride}")
    if args.max_frames is not None and args.max_frames < 1:
        raise _BadInput(f"--max-frames must be at least 1, got {args.max_frames}")
    if args.prefetch < 0:
        raise _BadInput(f"--prefetch must be 0 or more frames, got {args.prefetch}")
    if args.speed < 0:
        raise _BadInput(f"--speed must be 0 (as fast as possible) or positive, got {args.speed}")
    if getattr(args, "loop", False):
        raise _BadInput("--loop runs one input; give a single INPUT")
    if getattr(args, "stats_csv", None):
        raise _BadInput("--stats-csv records one input's per-frame run; give a single INPUT "
                             "(--stats-json is written per input)")
    stats_json = _check_output(args.stats_json, "--stats-json") if getattr(args, "stats_json", None) else None
    flags = [f for f in FILE_OUTPUTS if getattr(args, f, None)]

    sources, runs = [], []
    hubs = StreamHubs(max_batch=len(inputs))
    errors: list = []
    t0 = time.perf_counter()
    try:
        for spec in inputs:
            src = open_source(spec, fps=args.fps, max_side=decode_max_side(args))
            sources.append(src)
            if args.start:
                src.seek(args.start)
        cfgs = [_build_config(args, src) for src in sources]
        cfg0 = cfgs[0][0]
        if not shares_model(cfg0):
            raise _BadInput(f"several inputs run through the stream scheduler, which batches LingBot-Map "
                                 f"streams; use --engine lingbot-map, or run the inputs one at a time "
                                 f"(engine {cfg0.engine})")
        root = Path(args.session_dir).expanduser() if args.session_dir else None
        if root is None:
            _retention(default_session_root(), log)
        for i, (spec, src, (cfg, note)) in enumerate(zip(inputs, sources, cfgs)):
            src = _Peeked(src)
            if src.first is None:
                log(f"input {src.name}: no frames; skipped")
                continue
            h, w = src.first.image.shape[:2]
            name = f"{i}-{src.name}"
            try:
                session = hubs.open_session(cfg, src, name=name, frame_size=(w, h))
            except AdmissionError as exc:
                log(f"input {src.name}: refused: {exc}")
                continue
            folder = root / name if root is not None else new_session_folder(src.name)
            try:
                # the bounded background writer, as a single run's: a slow disk makes its stream wait
                store = SessionStore(folder, cfg, str(spec), background=True, queue_size=4,
                                     meta={"kind": src.kind, "name": src.name, "fps": src.fps, "frames": len(src),
                                           "start": args.start, "intrinsics": note, "scheduler_streams": len(inputs)})
            except BaseException:
                session.close()
                raise

            def on_event(e, name=name):
                if e.kind in ("warning", "segment") and e.message:
                    log(f"{name}: {e.kind}: {e.message}")

            sink = CallbackSink(event=on_event, message=lambda m, name=name: log(f"{name}: warning: {m}"))
            driver = RunDriver(src, session, [StoreSink(store), sink], speed=args.speed,
                               max_frames=args.max_frames, prefetch=args.prefetch, stats_hz=0)
            runs.append({"name": name, "session": session, "store": store, "driver": driver})
            log(f"{src.kind} {src.name}: {len(src) or 'unknown number of'} frames; session folder {store.folder}")
        if not runs:
            raise _BadInput("no input could be started (see the messages above)")
        log(f"{len(runs)} streams of {cfg0.engine} on {cfg0.device} ({cfg0.dtype}), batched by the scheduler")
        with _stop_on_signals([r["driver"] for r in runs], log):
            errors = _drive_all([r["driver"] for r in runs])
    finally:
        for r in runs:                    # each store sink closed its store; a run never started did not
            for obj in (r["session"], r["store"]):
                try:
                    obj.close()
                except Exception:         # closing must not hide the run's own error
                    pass
        for src in sources:
            try:
                src.close()
            except Exception:
                pass
    elapsed = time.perf_counter() - t0
    summaries = [r["driver"].summary for r in runs]
    interrupted = any(s.interrupted for s in summaries)
    if interrupted:
        log("interrupted: keeping and exporting the frames done so far")
    disk_full = False
    for r, exc in zip(runs, errors):
        if exc is not None:
            disk_full = disk_full or is_disk_full(exc)
            log(f"{r['name']}: stopped: {r['driver'].summary.error or exc}")
    total = sum(s.results for s in summaries)
    export_failed = False
    for r, summary in zip(runs, summaries):
        outputs = {f: _per_input(_check_output(getattr(args, f), f"--{f}"), r["name"]) for f in flags}
        for flag in DIR_OUTPUTS:
            if getattr(args, flag, None):
                outputs[flag] = _per_input(Path(getattr(args, flag)).expanduser(), r["name"])
        note = f", {summary.dropped} dropped" if summary.dropped else ""
        log(f"{r['name']}: {summary.frames_in} frames -> {summary.results} results{note}; session {r['store'].folder}")
        if outputs and summary.results:
            out, error = _export(r["store"].folder, args, outputs)
            for f in out.get("files", []):
                log(f"wrote {f}")
            if error:
                print(f"reconstudio run: error: {r['name']}: {error}", file=sys.stderr)
                export_failed = True
    s = runs[0]["session"].hub.scheduler.stats()       # one shared scheduler
    if stats_json:
        for r, summary in zip(runs, summaries):
            out = _per_input(stats_json, r["name"])
            _write_stats_json(out, summary.stats, {
                **r["driver"].run_stats(), "stream": r["session"].stream.stats(),
                "scheduler": {k: v for k, v in s.items() if k != "streams"}})
            log(f"wrote {out}")
    log(f"{len(runs)} streams: {total} results in {elapsed:.1f} s ({total / max(elapsed, 1e-9):.1f} results/s "
        f"together; {s.get('rounds', 0)} rounds, largest batch {s.get('largest_batch', 0)})")
    if total == 0:
        return EXIT_INTERRUPTED if interrupted else EXIT_BAD_INPUT
    if disk_full:
        return EXIT_DISK_FULL
    return EXIT_INTERRUPTED if interrupted else (EXIT_EMPTY_EXPORT if export_failed else 0)
