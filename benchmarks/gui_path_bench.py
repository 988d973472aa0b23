"""The GUI's pipeline without Qt, against `reconstudio run`'s, in one process (issue 26 item 1).

    python -m benchmarks.gui_path_bench --device cuda --frames 600 --json $OUT/gui_path.json
    python -m benchmarks.gui_path_bench --device cpu --model lingbot-map-tiny --width 70 --frames 12   # a check

Both paths stream the same seeded uint8 frames (a decoded video's: `--input-size`, the session
preprocesses them) through the same loaded LingBot-Map network, one after the other, `--repeats`
times each (run, gui, run, gui, ...), or until two consecutive pairs' gui/run ratios agree
within `--agree`:

* **run**: `open_session` -> `RunDriver(source, session, [StoreSink(store)])`, what
  app/cmd_run.py drives;
* **gui**: the objects the GUI's engine worker drives, without Qt: `StreamHubs(preloaded=model)
  .open_session` (the shared-stream layer: `SharedStreams` over one `StreamScheduler`) ->
  `RunDriver` with the store sink and a display sink that converts results to display packets
  (`ui.display.make_display_frame`, numpy only) coalesced to `--display-hz` and handed to a
  second thread standing in for the GUI thread, which appends them to the viewer's scene model
  (`engine.scene.SceneModel`, `--point-budget`, background thinning as the viewer runs it),
  takes the changes (what the view uploads) and, with `--draw egl`, draws the scene offscreen
  with vispy (a points visual of the scene's level-of-detail prefix) at most `--display-hz`
  times a second. As the worker, the engine waits when `--max-pending` packets are not taken.

Reported per path: steady results/s (after `--warmup` results), and for gui the draws/s of the
GUI thread and the frame read -> shown latency (p50 / p95: the time the source handed a frame
to the driver until the GUI thread had it in the scene, drawn with `--draw`); plus gui/run.
"""
from __future__ import annotations

import argparse
import json
import queue
import tempfile
import threading
import time

import numpy as np
import torch

from engine import SessionConfig, open_session
from engine.bench import BenchConfig, build_bench_model
from engine.io.store import SessionStore
from engine.run_driver import RunDriver, SequenceSource, Sink, StoreSink
from engine.scene import SceneModel
from engine.shared_streams import StreamHubs


class _Clock:
    """When each input frame left the source (read) and when it was shown."""

    def __init__(self):
        self.read: dict = {}
        self.results: list = []        # perf_counter of each result's arrival at the sinks
        self.shown: dict = {}


def _source(frames: list, n: int, clock: _Clock) -> SequenceSource:
    def load(i):
        clock.read[i] = time.perf_counter()
        return frames[i % len(frames)]
    return SequenceSource(range(n), load=load, name="bench")


class _Count(Sink):
    def __init__(self, clock: _Clock):
        self.clock = clock

    def on_results(self, results):
        now = time.perf_counter()
        self.clock.results.extend([now] * len(results))


class _Display(Sink):
    """The worker's display sink without Qt: packets coalesced to the display rate, handed over
    only when the GUI thread took the previous batch; the engine waits after `max_pending`."""

    def __init__(self, gui: "_GuiThread", stride: int, hz: float, max_pending: int):
        from ui.display import make_display_frame
        self.make = make_display_frame
        self.gui, self.stride, self.period, self.max_pending = gui, stride, 1.0 / hz, max_pending
        self.pending: list = []
        self.last = 0.0
        self.frustum_depth = None
        self.driver = None

    def on_start(self, driver):
        self.driver = driver

    def on_results(self, results):
        for r in results:
            d = self.make(r, self.stride, frustum_depth=self.frustum_depth)
            if self.frustum_depth is None and len(d.depth):
                self.frustum_depth = 0.08 * d.median_depth
            self.pending.append(d)
        self.flush()
        if len(self.pending) >= self.max_pending:
            self.driver.wait_while(lambda: not self.gui.ready())
            self.flush()

    def on_idle(self):
        self.flush()

    def on_finish(self, summary):
        self.flush(force=True)

    def flush(self, force: bool = False):
        now = time.perf_counter()
        if self.pending and (force or (self.gui.ready() and now - self.last >= self.period)):
            batch, self.pending, self.last = self.pending, [], now
            self.gui.submit(batch)


class _GuiThread:
    """Stands in for the GUI thread: scene model appends, change takes and optional draws."""

    def __init__(self, clock: _Clock, budget: int, hz: float, draw: str):
        self.clock, self.period = clock, 1.0 / hz
        self.scene = SceneModel(point_budget=budget, background=True)
        self.q: queue.Queue = queue.Queue()
        self.busy = threading.Event()
        self.draws = 0
        self.draw_s: list = []
        self.canvas = _EglCanvas(budget) if draw == "egl" else None
        self.t = threading.Thread(target=self._work, name="gui", daemon=True)
        self.t.start()

    def ready(self) -> bool:
        return self.q.empty() and not self.busy.is_set()

    def submit(self, batch):
        self.busy.set()
        self.q.put(batch)

    def close(self):
        self.q.put(None)
        self.t.join()
        self.scene.wait()

    def _work(self):
        if self.canvas is not None:
            self.canvas.start()
        last = 0.0
        while True:
            batch = self.q.get()
            if batch is None:
                break
            for d in batch:
                self.scene.add_frame(d)
            self.scene.take_changes()
            if self.canvas is not None and time.perf_counter() - last >= self.period:
                t = time.perf_counter()
                self.canvas.draw(self.scene)
                self.draw_s.append(time.perf_counter() - t)
                last = time.perf_counter()
            self.draws += 1
            now = time.perf_counter()
            for d in batch:
                self.clock.shown[d.index] = now
            self.busy.clear()


class _EglCanvas:
    """The scene drawn offscreen through vispy on EGL: one points visual, the level-of-detail
    prefix the viewer draws (every level up to the budget), re-set each draw."""

    def __init__(self, budget: int):
        self.budget = budget

    def start(self):
        import vispy
        vispy.use(app="egl")
        from vispy import scene
        self.canvas = scene.SceneCanvas(size=(1280, 800), show=False)
        view = self.canvas.central_widget.add_view()
        view.camera = "turntable"
        self.markers = scene.visuals.Markers(parent=view.scene)
        self.view = view

    def draw(self, sc: SceneModel):
        n = sc.n_points if hasattr(sc, "n_points") else None
        pos = sc.world_positions()
        if n is not None:
            pos = pos[:n]
        if len(pos) == 0:
            return
        self.markers.set_data(pos.astype(np.float32), size=2, edge_width=0)
        self.canvas.render()


def _frames(args) -> list:
    rng = np.random.default_rng(args.seed)
    w, h = args.input_size
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(16)]


def _fps(times: list, warmup: int):
    t = times[warmup:]
    return (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else None


def _pct(xs, q):
    return float(np.percentile(xs, q)) if len(xs) else None


def run_path(args, model, frames) -> dict:
    clock = _Clock()
    cfg = _config(args)
    with tempfile.TemporaryDirectory() as tmp:
        session = open_session(cfg, model=model)
        store = SessionStore(f"{tmp}/run", cfg, "bench", background=True, queue_size=4)
        RunDriver(_source(frames, args.frames, clock), session, [StoreSink(store), _Count(clock)]).run()
        session.close()
    return {"path": "run", "results": len(clock.results), "fps_steady": _fps(clock.results, args.warmup)}


def gui_path(args, model, frames) -> dict:
    clock = _Clock()
    cfg = _config(args)
    gui = _GuiThread(clock, args.point_budget, args.display_hz, args.draw)
    hubs = StreamHubs(preloaded=model)
    with tempfile.TemporaryDirectory() as tmp:
        src = _source(frames, args.frames, clock)
        session = hubs.open_session(cfg, src)
        store = SessionStore(f"{tmp}/gui", cfg, "bench", background=True, queue_size=4)
        display = _Display(gui, args.display_stride, args.display_hz, args.max_pending)
        t0 = time.perf_counter()
        RunDriver(src, session, [StoreSink(store), display, _Count(clock)], stats_hz=4.0).run()
        gui.close()
        t1 = time.perf_counter()
        session.close()
    lat = [clock.shown[i] - clock.read[i] for i in sorted(clock.shown) if i in clock.read][args.warmup:]
    return {"path": "gui", "results": len(clock.results), "fps_steady": _fps(clock.results, args.warmup),
            "gui_updates_per_s": gui.draws / (t1 - t0), "draws": bool(gui.canvas),
            "draw_ms_p50": _pct(np.asarray(gui.draw_s) * 1e3, 50), "draw_ms_p95": _pct(np.asarray(gui.draw_s) * 1e3, 95),
            "scene_points": int(gui.scene.world_positions().shape[0]),
            "read_to_shown_ms_p50": _pct(np.asarray(lat) * 1e3, 50),
            "read_to_shown_ms_p95": _pct(np.asarray(lat) * 1e3, 95)}


def _config(args) -> SessionConfig:
    return SessionConfig(engine="lingbot-map", model=args.model, device=args.device, dtype=args.dtype,
                         image_width=args.width)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="lingbot-map")
    ap.add_argument("--weights", default="random")
    ap.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--width", type=int, default=518)
    ap.add_argument("--input-size", type=int, nargs=2, default=(640, 480), metavar=("W", "H"))
    ap.add_argument("--frames", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=2, help="pairs (run, gui) at most")
    ap.add_argument("--agree", type=float, default=0.0,
                    help="stop once two consecutive pairs' gui/run ratios agree within this fraction (0: run all)")
    ap.add_argument("--point-budget", type=int, default=4_000_000)
    ap.add_argument("--display-stride", type=int, default=2)
    ap.add_argument("--display-hz", type=float, default=30.0)
    ap.add_argument("--max-pending", type=int, default=32)
    ap.add_argument("--draw", choices=("none", "egl"), default="none")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    model = build_bench_model(BenchConfig(model=args.model, weights=args.weights, device=args.device, seed=args.seed))
    frames = _frames(args)
    rows, ratios, settled = [], [], None
    for rep in range(args.repeats):
        for fn in (run_path, gui_path):
            r = fn(args, model, frames)
            r["repeat"] = rep
            rows.append(r)
            print(json.dumps(r), flush=True)
        run_fps, gui_fps = rows[-2]["fps_steady"], rows[-1]["fps_steady"]
        ratios.append(gui_fps / run_fps if run_fps and gui_fps else float("nan"))
        if args.agree and len(ratios) >= 2 and abs(ratios[-1] - ratios[-2]) <= args.agree * ratios[-2]:
            settled = [rep - 1, rep]         # two consecutive pairs agree: stop
            break
    med = {p: float(np.median([r["fps_steady"] for r in rows if r["path"] == p and r["fps_steady"]] or [np.nan]))
           for p in ("run", "gui")}
    out = {"rows": rows, "fps_steady_median": med, "gui_over_run": med["gui"] / med["run"],
           "pair_ratios": ratios, "settled_pairs": settled,
           "device_name": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
           "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()}}
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    main()
