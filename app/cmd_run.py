"""`reconstudio run INPUT`: reconstruct a video, an image folder or a webcam headless.

Frames go through the chosen engine with a progress bar; every result is written to a session
folder as it arrives (crash-safe, reopenable in the GUI), and at the end the requested exports
(PLY, NPZ, TUM trajectory) are written from that folder with re-alignments applied. Bad input
is one line on stderr and exit code 2; Ctrl-C or SIGTERM stops after the current frame, keeps and
exports what was done, marks the session as cut short (exit 130). The loop is engine.run_driver's.

INPUT may also be a saved session folder: its results are exported again (e.g. with another
confidence threshold or stride) without running an engine.

Module level imports nothing heavy (no torch, cv2 or Qt): the parser is built for every command.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from app.config_flags import add_session_flags, given_settings

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


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
    i.add_argument("--resize", type=int, default=None, metavar="PX",
                   help="downscale input frames so their longer side is at most PX")
    o = p.add_argument_group("output")
    o.add_argument("--ply", metavar="OUT", help="write the point cloud (binary PLY)")
    o.add_argument("--npz", metavar="OUT", help="write poses, intrinsics, depth, confidence and points (NPZ)")
    o.add_argument("--trajectory", metavar="OUT", help="write the camera trajectory (TUM format)")
    o.add_argument("--colmap", metavar="DIR",
                   help="write a COLMAP model (DIR/images + DIR/sparse/0, text and binary) for COLMAP, "
                        "nerfstudio, gsplat")
    o.add_argument("--glb", metavar="OUT", help="write a GLB scene: point cloud, trajectory and camera frustums")
    o.add_argument("--keyframes-only", action="store_true",
                   help="export keyframes only (default: every frame)")
    o.add_argument("--no-frustums", action="store_true", help="GLB without camera frustums")
    o.add_argument("--max-points", type=int, default=None, metavar="N",
                   help="thin the exported points evenly to at most N (e.g. a COLMAP model from a dense session)")
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


def _export(loaded, args, outputs: dict) -> dict:
    """All requested exports through engine.io.export.export_results (the GUI's function too);
    an export that keeps almost nothing is still written (the user asked for it), with a warning
    printed before the files are written."""
    from engine.io.export import export_results, plan_export

    opts = dict(conf_threshold=args.conf_threshold, stride=args.stride, keyframes_only=args.keyframes_only)
    if set(outputs) - {"trajectory"}:
        plan = plan_export(loaded, **opts)
        if plan["warning"]:
            print(f"warning: {plan['warning']}", file=sys.stderr)
    out = export_results(loaded, {("tum" if k == "trajectory" else k): v for k, v in outputs.items()},
                         frustums=not args.no_frustums, max_points=args.max_points, **opts)
    if out.get("cut_short"):
        print(f"warning: this session was cut short ({out['cut_short']}): the export holds only "
              "what was done", file=sys.stderr)
    return out


def _export_only(args, outputs: dict) -> int:
    """INPUT is a saved session folder: export it again (other threshold / stride), no engine."""
    from engine.io.export import export_session
    from engine.io.store import load_session

    if not outputs:
        raise _BadInput(f"{args.input} is a saved session: give --ply, --npz, --trajectory, --colmap "
                        "and/or --glb to export it")
    loaded = load_session(args.input)
    for problem in loaded.problems:
        print(f"warning: {problem}", file=sys.stderr)
    if not loaded.results:
        raise _BadInput(f"session {args.input} holds no frames")
    out = _export(loaded, args, outputs)
    if not args.quiet:
        for f in out["files"]:
            print(f"wrote {f}", file=sys.stderr)
        print(f"{out['frames']} frames, {out['points']} points exported from session {loaded.folder} "
              f"(confidence >= {args.conf_threshold:g}, stride {args.stride})", file=sys.stderr)
    return 0


def main(args) -> int:
    from engine.api import EngineError

    try:
        if getattr(args, "more_inputs", None):
            from app.cmd_run_multi import run_many
            return run_many(args, [args.input, *args.more_inputs])
        return _run(args)
    except (EngineError, _BadInput) as exc:
        print(f"reconstudio run: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:     # a second Ctrl-C: aborted at once (the store keeps what it wrote)
        print("reconstudio run: aborted; the session folder keeps the frames written so far", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(args) -> int:
    from tqdm import tqdm

    from engine.memory import bound_heap
    bound_heap()                    # long runs: RSS follows what is held (engine/memory.py)

    from engine.api import open_session
    from engine.io.sources import open_source
    from engine.io.store import SessionStore, default_session_root, load_session, new_session_folder
    from engine.run_driver import CallbackSink, RunDriver, StoreSink

    outputs = {flag: _check_output(getattr(args, flag), f"--{flag}")
               for flag in ("ply", "npz", "trajectory", "glb") if getattr(args, flag)}
    if args.colmap:
        outputs["colmap"] = _check_output_dir(args.colmap, "--colmap")
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
    source = open_source(args.input, fps=args.fps, max_side=args.resize, loop=args.loop)
    session = store = driver = None
    last_warning: list = []               # the engine's last warning, repeated with a "no results" error
    try:
        if args.start:
            source.seek(args.start)
        cfg, intr_note = _build_config(args, source)
        session = open_session(cfg)
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
        with _stop_on_signals(driver, log):
            summary = driver.run()
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
    out = {}
    if outputs:
        out = _export(load_session(folder), args, outputs)
    if not args.quiet:
        fps = summary.stats.get("fps")
        elapsed = summary.wall_s
        dropped = f", {summary.dropped} live frames dropped" if summary.dropped else ""
        print(f"{summary.frames_in} frames → {summary.results} results in {elapsed:.1f} s "
              f"({summary.frames_in / max(elapsed, 1e-9):.1f} frames/s overall"
              f"{f', engine {fps:.1f} fps' if fps else ''}{dropped}); session: {folder}", file=sys.stderr)
        for f in out.get("files", []):
            print(f"wrote {f}", file=sys.stderr)
        if outputs:
            print(f"{out['points']} points exported (confidence >= {args.conf_threshold:g}, "
                  f"stride {args.stride})", file=sys.stderr)
    return EXIT_INTERRUPTED if interrupted else 0


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
def _stop_on_signals(driver, log):
    """Ctrl-C / SIGTERM end the run cleanly: the driver stops after the current frame, the engine
    is flushed into the store, the session is marked cut short and the exports are written from
    what was done. A second Ctrl-C aborts at once (the store still keeps every frame written)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    names = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}

    def handler(signum, frame):
        if driver.stopping:
            raise KeyboardInterrupt
        log(f"{names.get(signum, signum)}: stopping after the current frame, keeping and exporting "
            "what was done (press Ctrl-C again to abort)")
        driver.stop(names.get(signum, str(signum)))

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
