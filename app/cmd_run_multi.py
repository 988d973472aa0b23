"""`reconstudio run A B ...`: several inputs at once through the stream scheduler (engine/scheduler.py).

All inputs share one loaded LingBot-Map model; their streamed frames are batched into one forward
per round. Each input gets its own session folder (under --session-dir, one sub-folder per input,
or the default session root) and its own exports: an output name gets the input's name appended
(`--ply out.ply` -> out-<name>.ply), or put `{name}` in it. An input whose caches would not fit
is refused with the scheduler's message and the others run. Ctrl-C stops all inputs, keeps and
exports what was done (exit 130). Engine settings are shared by every input. `--stats-json`
is written per input (the same name rule): that stream's last engine stats, its frame counts and
the scheduler's round statistics; `--stats-csv` (per-frame driver rows) takes one input.

Called by app/cmd_run.py when more than one INPUT is given; imports nothing heavy at module level.
"""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path


def _per_input(path: Path, name: str) -> Path:
    """out.ply -> out-<name>.ply; a `{name}` placeholder is filled instead."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "input"
    s = str(path)
    if "{name}" in s:
        return Path(s.replace("{name}", safe))
    return path.with_name(f"{path.stem}-{safe}{path.suffix}")


def run_many(args, inputs: list) -> int:
    from app import cmd_run as base
    from engine.api import EngineError
    from engine.io.sources import open_source
    from engine.io.store import SessionStore, default_session_root, new_session_folder
    from engine.scheduler import AdmissionError, StreamScheduler

    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    for spec in inputs:
        if base._is_session_folder(spec):
            raise base._BadInput(f"{spec} is a saved session: re-export saved sessions one at a time")
    if args.stride < 1:
        raise base._BadInput(f"--stride must be at least 1, got {args.stride}")
    if args.max_frames is not None and args.max_frames < 1:
        raise base._BadInput(f"--max-frames must be at least 1, got {args.max_frames}")
    if getattr(args, "loop", False):
        raise base._BadInput("--loop runs one input; give a single INPUT")
    if getattr(args, "stats_csv", None):
        raise base._BadInput("--stats-csv records one input's per-frame run; give a single INPUT "
                             "(--stats-json is written per input)")
    stats_json = base._check_output(args.stats_json, "--stats-json") if getattr(args, "stats_json", None) else None
    flags = [f for f in ("ply", "npz", "trajectory", "glb") if getattr(args, f, None)]

    sources, runs = [], []
    sched = model = None
    interrupted = False
    t0 = time.perf_counter()
    try:
        for spec in inputs:
            src = open_source(spec, fps=args.fps, max_side=args.resize)
            sources.append(src)
            if args.start:
                src.seek(args.start)
        cfgs = [base._build_config(args, src) for src in sources]
        cfg0 = cfgs[0][0]
        if cfg0.engine != "lingbot-map":
            raise base._BadInput(f"several inputs run through the stream scheduler, which batches LingBot-Map "
                                 f"streams; use --engine lingbot-map, or run the inputs one at a time "
                                 f"(engine {cfg0.engine})")
        import torch

        from engine.lingbot.session import _DTYPES, _device, load_lingbot_map
        model = load_lingbot_map(cfg0, _device(cfg0), _DTYPES[cfg0.dtype])
        # throughput: results of a round come with the next step (no host wait per round)
        sched = StreamScheduler(model, max_batch=len(inputs), pipeline=True)
        root = Path(args.session_dir).expanduser() if args.session_dir else None
        if root is None:
            base._retention(default_session_root(), log)
        for i, (spec, src, (cfg, note)) in enumerate(zip(inputs, sources, cfgs)):
            first = src.read()
            if first is None:
                log(f"input {src.name}: no frames; skipped")
                continue
            h, w = first.image.shape[:2]
            name = f"{i}-{src.name}"
            try:
                stream = sched.open_stream(cfg, name=name, frame_size=(w, h))
            except AdmissionError as exc:
                log(f"input {src.name}: refused: {exc}")
                continue
            folder = root / name if root is not None else new_session_folder(src.name)
            store = SessionStore(folder, cfg, str(spec),
                                 meta={"kind": src.kind, "name": src.name, "fps": src.fps, "frames": len(src),
                                       "start": args.start, "intrinsics": note, "scheduler_streams": len(inputs)})
            sched.submit(stream, first.image, first.timestamp)
            runs.append({"src": src, "stream": stream, "store": store, "frames_in": 1, "results": 0,
                         "done": False, "name": name})
            log(f"{src.kind} {src.name}: {len(src) or 'unknown number of'} frames; session folder {store.folder}")
        if not runs:
            raise base._BadInput("no input could be started (see the messages above)")
        log(f"{len(runs)} streams of {cfg0.engine} on {cfg0.device} ({cfg0.dtype}), batched by the scheduler")

        def close(r):
            """The stream's remaining results; its engine's final stats kept for --stats-json."""
            results = sched.close_stream(r["stream"])
            try:
                r["stats"] = r["stream"].session.stats()
            except Exception as exc:       # stats are a report: never the reason a run fails
                r["stats"] = {"error": f"stats unavailable: {exc}"}
            return results

        def deliver(stream, results):
            run = next(r for r in runs if r["stream"] is stream)
            for res in results:
                run["store"].write(res)
            run["results"] += len(results)
            for e in stream.session.poll_events():
                run["store"].write_event(e)
                if e.kind in ("warning", "segment") and e.message:
                    log(f"{run['name']}: {e.kind}: {e.message}")

        try:
            while any(not r["done"] for r in runs):
                for r in runs:
                    if r["done"]:
                        continue
                    frame = None
                    if not args.max_frames or r["frames_in"] < args.max_frames:
                        frame = r["src"].read()
                    if frame is None:
                        r["done"] = True
                        deliver(r["stream"], close(r))
                        continue
                    sched.submit(r["stream"], frame.image, frame.timestamp)
                    r["frames_in"] += 1
                for stream, results in sched.step():
                    deliver(stream, results)
                for r in runs:
                    if r["stream"].error and not r["done"]:
                        log(f"{r['name']}: stopped: {r['stream'].error}")
                        r["done"] = True
                        deliver(r["stream"], close(r))   # its frames done before
        except KeyboardInterrupt:
            interrupted = True
            log("interrupted: keeping and exporting the frames done so far")
            for r in runs:
                if not r["stream"].closed:
                    r["stream"].queue.clear()
                    try:
                        deliver(r["stream"], close(r))
                    except EngineError:
                        pass
    finally:
        for r in runs:
            try:
                if interrupted and hasattr(r["store"], "mark_cut_short"):
                    r["store"].mark_cut_short("interrupted", frames_in=r["frames_in"])
                r["store"].close()
            except Exception:     # closing must not hide the run's own error
                pass
        for src in sources:
            try:
                src.close()
            except Exception:
                pass
    elapsed = time.perf_counter() - t0
    total = sum(r["results"] for r in runs)
    export_failed = False
    for r in runs:
        outputs = {f: _per_input(base._check_output(getattr(args, f), f"--{f}"), r["name"]) for f in flags}
        if getattr(args, "colmap", None):
            outputs["colmap"] = _per_input(Path(args.colmap).expanduser(), r["name"])
        dropped = r["stream"].stats()["dropped"]
        note = f", {dropped} dropped" if dropped else ""
        log(f"{r['name']}: {r['frames_in']} frames -> {r['results']} results{note}; session {r['store'].folder}")
        if outputs and r["results"]:
            out, error = base._export(r["store"].folder, args, outputs)
            for f in out.get("files", []):
                log(f"wrote {f}")
            if error:
                print(f"reconstudio run: error: {r['name']}: {error}", file=sys.stderr)
                export_failed = True
    s = sched.stats() if sched is not None else {}
    if stats_json:
        for r in runs:
            out = _per_input(stats_json, r["name"])
            base._write_stats_json(out, r.get("stats") or {}, {
                "frames_in": r["frames_in"], "results": r["results"], "elapsed_s": elapsed,
                "stream": r["stream"].stats(), "scheduler": {k: v for k, v in s.items() if k != "streams"}})
            log(f"wrote {out}")
    log(f"{len(runs)} streams: {total} results in {elapsed:.1f} s ({total / max(elapsed, 1e-9):.1f} results/s "
        f"together; {s.get('rounds', 0)} rounds, largest batch {s.get('largest_batch', 0)})")
    if total == 0:
        return base.EXIT_INTERRUPTED if interrupted else base.EXIT_BAD_INPUT
    return base.EXIT_INTERRUPTED if interrupted else (base.EXIT_EMPTY_EXPORT if export_failed else 0)
