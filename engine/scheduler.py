"""Several LingBot-Map streams on one model: a batching scheduler with fair ordering, a per-stream
latency budget and admission control.

    sched = StreamScheduler(model, memory_budget_bytes=None, max_batch=8)
    a = sched.open_stream(SessionConfig(engine="lingbot-map", ...), name="cam0", frame_size=(640, 480))
    sched.submit(a, frame, timestamp)          # queue a frame (any number of streams)
    for stream, results in sched.step():       # one round: one batched forward for the streams served
        ...
    sched.close_stream(a)                      # drains, flushes (short scale phase), frees its caches

Each stream is an ordinary `LingBotMapSession` (engine/lingbot/session.py) over the *shared* model, so
its KV cache, camera cache, keyframe logic and results are exactly those of the session run alone:
a batched round runs the session's own step phases (`prepare_step`, `run_steps` with
`step_begin` / `step_commit` / `step_abort`, `step_results`) and its `forward_steps` over the
steps of all the streams served, so it re-implements none of them. What the scheduler adds is how
steps run:

* **Batching.** The streamed frames of the streams served in one round are stacked into one
  `model.forward_step`: patch embed, the 24 frame blocks, the heads' per-token work and the depth
  head run once for the whole batch. Global attention stays per stream, over its own pages: the
  `kv` object given to the model splits q/k/v by frame and sends each to its own stream's paged
  cache (`engine.kv.batch_attention.BatchKV`; with `attention_streams` the B attention kernels
  run side by side on CUDA side streams), and the camera head's causal attention likewise
  (`BatchCameraCache`). A batch lists its streams in the order they were opened, every round.
  Each frame carries its own 3D-RoPE time index. A stream still in its scale phase runs that
  step on its own (a multi-frame bidirectional step), through the session's own `push`.
  Streams are batched together only when they share the resolution and camera iterations.
* **Fair ordering.** Round robin: each round starts after the stream served first last round,
  and at most `max_batch` streams are served per round, so no stream starves.
* **Latency budget** (per stream, optional): a stream whose oldest queued frame would exceed its
  budget by the end of this round (its wait plus the recent round time) is served before the
  others, most urgent first. A *live* stream (webcam) drops queued frames older than its budget
  when a newer one is waiting (counted in `stats`), so it stays current instead of lagging.
* **Pipelined rounds** (`pipeline=True`, for throughput): a round's outputs go to pinned host
  memory on a copy stream (engine/host_copy.py) and its results are returned by the NEXT `step()`,
  after that step has queued its own forward -- the CPU builds round N's results and prepares
  round N+1 while the GPU still runs, instead of waiting for the GPU once per round. Results are
  the same, one round later; `pending()` counts frames in flight, `close_stream` collects them.
* **A stream alone** (`push_alone`): a frame of a stream no other could share a round with runs
  through its session's own `push`, on the caller's thread: no queue, stack or extra copy, so one
  stream costs what a session opened by itself costs (engine/shared_streams.py uses it whenever a
  stream is the only one open). Switching between alone and batched keeps each stream's results
  in order: `push_alone` first hands out the stream's results of batched rounds still in flight,
  and a batched round first takes the session's own deferred results (`collect_in_flight`).
* **Admission control.** `open_stream` estimates the bytes the new stream will hold (paged KV
  pools + camera cache, computed from the cache configuration exactly as they are allocated) and
  refuses it with `AdmissionError` -- a message saying what it needs, what is free and what to
  change -- when they would not fit in the memory budget (explicit, or the device's free memory
  minus `reserve_bytes` for activations, minus streams admitted but not yet allocated).

No Qt; one thread (the caller's).
"""
from __future__ import annotations

import math
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from .api import EngineError, FrameResult, SessionConfig
from .kv.batch_attention import side_streams_for
from .kv.page_table import PageTable
from .preprocess import target_size

_ELEM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


class AdmissionError(EngineError):
    """A new stream was refused: its caches would not fit. The message says what to change."""


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**26 else f"{n / 2**20:.1f} MiB"


def stream_cache_bytes(model, config: SessionConfig, frame_size: Optional[tuple] = None) -> dict:
    """Bytes a LingBot-Map stream allocates for its caches: the paged KV pools (sized exactly as
    `PagedKVCache` sizes them) and the camera cache. frame_size = (width, height) of the input;
    unknown = 4:3. Returns {"kv", "camera", "total", "patch_tokens", "resolution"}."""
    w_in, h_in = frame_size or (4, 3)
    w, _, h = target_size(int(w_in), int(h_in), config.image_width)
    mc = model.config
    geo = model.kv_geometry()
    P = (h // mc.patch_size) * (w // mc.patch_size)
    # the page count of the cache's own page table (plain integers: cheap to build here)
    pages = PageTable(P, geo["special_tokens"], config.scale_frames, config.window, config.special_cap,
                      max_step_frames=1).num_pages
    kv_name = config.dtype if config.kv_dtype == "auto" else config.kv_dtype
    elem = _ELEM_BYTES.get(kv_name, 4)
    kv = 2 * geo["num_layers"] * pages * P * geo["num_heads"] * geo["head_dim"] * elem
    ch = model.camera_head
    cam = config.camera_iterations * ch.depth * 2 * (config.scale_frames + config.special_cap + 1) * ch.dim * 4
    return {"kv": kv, "camera": cam, "total": kv + cam, "patch_tokens": P, "resolution": (w, h)}


def _available_bytes(device: torch.device) -> int:
    if device.type == "cuda":   # free on the device + what PyTorch's allocator holds unused
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(torch.cuda.mem_get_info(device)[0] + cached)
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 1 << 62


@dataclass(eq=False)
class Stream:
    """One admitted stream (returned by `open_stream`; pass it to submit / close_stream)."""

    name: str
    session: Any
    latency_budget_s: Optional[float] = None
    live: bool = False
    estimate: dict = field(default_factory=dict)
    queue: deque = field(default_factory=deque)        # (frame, timestamp, submitted_at)
    served: int = 0
    dropped: int = 0
    budget_misses: int = 0
    latencies: deque = field(default_factory=lambda: deque(maxlen=256))   # submit -> result, s
    error: Optional[str] = None
    closed: bool = False

    def stats(self) -> dict:
        lat = np.asarray(self.latencies, dtype=np.float64) * 1e3
        return {"name": self.name, "queued": len(self.queue), "served": self.served, "dropped": self.dropped,
                "budget_misses": self.budget_misses,
                "latency_budget_ms": None if self.latency_budget_s is None else self.latency_budget_s * 1e3,
                "latency_p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
                "latency_p95_ms": float(np.percentile(lat, 95)) if lat.size else None,
                "cache_bytes_estimate": self.estimate.get("total"), "error": self.error}


class StreamScheduler:
    """N LingBot-Map streams over one shared model (see the module docstring)."""

    def __init__(self, model, *, memory_budget_bytes: Optional[int] = None, reserve_bytes: Optional[int] = None,
                 max_batch: int = 8, clock=time.perf_counter, attention_streams: bool = True,
                 pipeline: bool = False):
        from .lingbot.model import LingBotMap
        if not isinstance(model, LingBotMap):
            raise EngineError(f"the scheduler runs LingBot-Map streams; got a {type(model).__name__}")
        if max_batch < 1:
            raise EngineError(f"max_batch must be >= 1 (got {max_batch})")
        self.model = model
        self.memory_budget_bytes = memory_budget_bytes
        self.reserve_bytes = reserve_bytes
        self.max_batch = int(max_batch)
        self.clock = clock
        self.streams: list[Stream] = []
        self._rr = 0                       # round-robin start (index into self.streams)
        self._round_s = deque(maxlen=16)   # recent round durations
        self._rounds = 0
        self._batched_frames = 0
        self._largest_batch = 0
        self._key: Optional[tuple] = None  # (device, dtype) every stream must share
        # per-stream attention of a batch on CUDA side streams: exact, and the streams' kernels
        # overlap (figures: docs/benchmarks.md "Several streams"); no effect on the CPU
        self.attention_streams = bool(attention_streams)
        self._side: dict = {}              # device -> side streams (engine/kv/batch_attention.py)
        self.pipeline = bool(pipeline)     # results one round later, no host wait per round
        self._copies = None                # engine.host_copy.HostCopies (pipeline)
        self._inflight = 0                 # frames whose forward ran, results not yet collected
        self._held: dict = {}              # Stream -> results collected while serving another one
        # host time per part of the rounds (seconds, summed): what the CPU spends where
        self._host = {"prepare": 0.0, "launch": 0.0, "readback": 0.0, "results": 0.0}

    # ------------------------------------------------------------------ admission
    def _reserve(self, device: torch.device) -> int:
        if self.reserve_bytes is not None:
            return int(self.reserve_bytes)
        return 2 << 30 if device.type == "cuda" else 0     # activations of a scale phase / batch

    def open_stream(self, config: SessionConfig, *, name: Optional[str] = None, frame_size: Optional[tuple] = None,
                    latency_budget_ms: Optional[float] = None, live: bool = False) -> Stream:
        """Admit a new stream or raise AdmissionError (EngineError for bad settings)."""
        if config.engine != "lingbot-map":
            raise AdmissionError(f"the scheduler batches LingBot-Map streams only (got engine {config.engine!r})")
        name = name or f"stream{len(self.streams)}"
        key = (str(torch.device(config.device)), config.dtype)
        if self._key is not None and key != self._key and any(not s.closed for s in self.streams):
            raise AdmissionError(f"cannot open stream {name!r} on {key[0]} in {key[1]}: the streams share one "
                                 f"model, which runs on {self._key[0]} in {self._key[1]}")
        from .lingbot.session import LingBotMapSession, model_device
        device = model_device(config)
        # the session plans its memory first (engine/memory_plan.py: window / KV / weight precision
        # for the budget, or MemoryPlanError); admission then counts the planned caches. A lone
        # stream is admitted by its plan alone, which accounts for the step's workspace itself.
        session = LingBotMapSession(config, self.model)
        session.replan(stream_cache_bytes(self.model, session.config, frame_size)["patch_tokens"])
        planned = session.config
        est = stream_cache_bytes(self.model, planned, frame_size)
        pending = sum(s.estimate.get("total", 0) for s in self.streams
                      if not s.closed and s.session.kv is None)          # admitted, not yet allocated
        open_n = sum(not s.closed for s in self.streams)
        if self.memory_budget_bytes is not None:
            used = sum(s.estimate.get("total", 0) for s in self.streams if not s.closed)
            free, where = int(self.memory_budget_bytes) - used, f"the {_gib(self.memory_budget_bytes)} budget"
        else:
            free = _available_bytes(device) - pending - self._reserve(device)
            where = f"{device} memory (after {_gib(self._reserve(device))} kept for activations)"
        if est["total"] > free and not (open_n == 0 and session.memory_plan is not None):
            session.close()
            w, h = est["resolution"]
            raise AdmissionError(
                f"cannot open stream {name!r}: its caches need {_gib(est['total'])} (KV {_gib(est['kv'])} for "
                f"window {planned.window} + {planned.scale_frames} scale frames at {w}x{h} in "
                f"{planned.kv_dtype if planned.kv_dtype != 'auto' else planned.dtype}, camera cache "
                f"{_gib(est['camera'])}) but only {_gib(max(free, 0))} of {where} is free with {open_n} "
                f"stream(s) open. Lower the window or the image width, use bf16, close a stream, or raise "
                f"the memory budget")
        budget = None if latency_budget_ms is None else float(latency_budget_ms) / 1e3
        if budget is not None and budget <= 0:
            session.close()
            raise EngineError(f"latency budget must be positive (got {latency_budget_ms} ms)")
        self._key = key
        # batched streamed steps replay CUDA graphs too (one per batch size), when graphs are on
        agg = self.model.aggregator
        agg.graph_batch = max(getattr(agg, "graph_batch", 1), self.max_batch)
        st = Stream(name=name, session=session, latency_budget_s=budget, live=bool(live), estimate=est)
        self.streams.append(st)
        return st

    # ------------------------------------------------------------------ frames
    def submit(self, stream: Stream, frame, timestamp: Optional[float] = None) -> None:
        if stream.closed:
            raise EngineError(f"stream {stream.name!r} is closed")
        stream.queue.append((frame, timestamp, self.clock()))

    def pending(self) -> int:
        """Frames not yet returned: queued in streams that can still run (not closed, no error),
        in flight (pipeline) and collected for a stream but not yet handed out."""
        return (sum(len(s.queue) for s in self.streams if not s.closed and s.error is None)
                + self._inflight
                + sum(len(r) for r in self._held.values()))

    def _order(self, now: float, only: Optional[Stream] = None) -> list[Stream]:
        """Streams with queued frames: urgent ones (budget at risk) first, then round robin."""
        n = len(self.streams)
        rotated = [self.streams[(self._rr + i) % n] for i in range(n)]
        ready = [s for s in rotated if s.queue and not s.closed and s.error is None and (only is None or only is s)]
        expect = float(np.median(self._round_s)) if self._round_s else 0.0

        def slack(s: Stream) -> float:
            if s.latency_budget_s is None:
                return math.inf
            return s.latency_budget_s - (now - s.queue[0][2]) - expect

        urgent = sorted((s for s in ready if slack(s) <= 0), key=slack)
        rest = [s for s in ready if slack(s) > 0]
        return urgent + rest

    def _drop_late(self, now: float) -> None:
        for s in self.streams:
            if s.live and s.latency_budget_s is not None:
                while len(s.queue) > 1 and now - s.queue[0][2] > s.latency_budget_s:
                    s.queue.popleft()
                    s.dropped += 1

    def step(self, only: Optional[Stream] = None) -> list[tuple[Stream, list[FrameResult]]]:
        """One round: serve up to `max_batch` streams (one frame each), batching the streamed
        frames of compatible streams into one forward. Returns (stream, results) per stream served;
        a stream whose frame failed gets `stream.error` set and no results (others go on).
        `only`: serve just that stream (used by close_stream)."""
        t0 = self.clock()
        self._drop_late(t0)
        chosen = self._order(t0, only)[:self.max_batch]
        out: list[tuple[Stream, list[FrameResult]]] = self._take_held(only)
        if not chosen:                     # nothing to run: hand out what is in flight
            return out + self._collect(0, only)
        first = self.streams.index(chosen[0])
        self._rr = (first + 1) % len(self.streams)
        groups: dict[tuple, list] = {}
        h0 = time.perf_counter()
        for s in chosen:
            frame, ts, submitted = s.queue.popleft()
            sess = s.session
            if not sess.streaming:     # the scale phase: a multi-frame step of its own, as alone
                out.append((s, self._guard(s, lambda: sess.push(frame, ts), submitted)))
                continue
            early = sess.collect_in_flight()    # frames it ran alone (push_alone) come out first
            if early:
                out.append((s, early))
            try:
                step = sess.prepare_step(frame, ts)        # one streamed frame, keyframe decided
            except EngineError as exc:
                self._fail(s, exc)
                out.append((s, []))
                continue
            key = (step.frame_shape, sess.config.camera_iterations)
            groups.setdefault(key, []).append((s, step, submitted))
        self._host["prepare"] += time.perf_counter() - h0
        launched = 0
        for (_, iterations), items in groups.items():
            got = self._batched(items, iterations)
            if got is None:                # pipelined: its results come with a later step
                launched += 1
            else:
                out.extend(got)
        if self.pipeline:                  # the rounds queued before this step's own
            out.extend(self._collect(launched, only))
        self._round_s.append(self.clock() - t0)
        self._rounds += 1
        return out

    def push_alone(self, stream: Stream, frame, timestamp: Optional[float] = None) -> list[tuple[Stream, list[FrameResult]]]:
        """One frame of `stream` run by its session's own `push` on the caller's thread: for a stream
        that no other stream could join in a round (engine/shared_streams.py when it is the only one
        open). Nothing is queued, stacked or copied beyond what the session does alone (on CUDA its
        results come from the next push, `defer_results`), so a stream alone runs exactly as a session
        opened by itself. The stream's results of earlier batched rounds still in flight come first.
        Counted as a round of one; returns [(stream, results)] like `step`."""
        if stream.closed:
            raise EngineError(f"stream {stream.name!r} is closed")
        t0 = self.clock()
        out = [r for _, res in self._take_held(stream) + self._collect(0, stream) for r in res]
        try:
            out += stream.session.push(frame, timestamp)
        except EngineError as exc:
            self._fail(stream, exc)
            out += stream.session.collect_in_flight()    # its frames before the failure
        self._account(stream, out, t0)
        self._round_s.append(self.clock() - t0)
        self._rounds += 1
        self._largest_batch = max(self._largest_batch, 1)
        return [(stream, out)]

    def _fail(self, s: Stream, exc: Exception) -> None:
        s.error = str(exc)

    def _guard(self, s: Stream, run, submitted: float) -> list[FrameResult]:
        try:
            res = run()
        except EngineError as exc:
            self._fail(s, exc)
            return []
        self._account(s, res, submitted)
        return res

    def _account(self, s: Stream, results, submitted: float) -> None:
        if not results:
            return
        lat = self.clock() - submitted
        s.served += len(results)
        s.latencies.append(lat)
        if s.latency_budget_s is not None and lat > s.latency_budget_s:
            s.budget_misses += 1

    def _batched(self, items: list, iterations: int) -> Optional[list[tuple[Stream, list[FrameResult]]]]:
        """One forward for one streamed step of each of several streams: the sessions' own step
        phases around one `forward_steps` call (engine/lingbot/session.py); None when pipelined."""
        from .lingbot.session import forward_steps, run_steps
        t0 = self.clock()
        h0 = time.perf_counter()
        order = {s: i for i, s in enumerate(self.streams)}
        items = sorted(items, key=lambda it: order[it[0]])    # the same composition every round
        steps = [step for _, step, _ in items]
        dev = steps[0].session.device
        side = (side_streams_for(dev, len(steps), self._side)
                if self.attention_streams and len(steps) > 1 else None)
        try:
            outputs = run_steps(steps, lambda: forward_steps(self.model, steps, iterations, side_streams=side))
        except torch.OutOfMemoryError as exc:
            raise EngineError(f"out of {dev.type.upper()} memory running a batch of {len(items)} streams; "
                              f"lower max_batch, the window or the image width") from exc
        self._batched_frames += len(items)
        self._largest_batch = max(self._largest_batch, len(items))
        h1 = time.perf_counter()
        self._host["launch"] += h1 - h0
        if self.pipeline:
            if self._copies is None:
                from .host_copy import HostCopies
                self._copies = HostCopies(dev, slots=4)
            self._copies.submit(outputs, tag=(items, t0))
            self._inflight += len(items)
            self._host["readback"] += time.perf_counter() - h1
            return None
        out_np = {k: v.float().cpu().numpy() for k, v in outputs.items()}
        self._host["readback"] += time.perf_counter() - h1
        return self._finish(items, out_np, t0)

    def _finish(self, items: list, out_np: dict, t0: float) -> list[tuple[Stream, list[FrameResult]]]:
        """Results of one batched forward from its outputs on the host (the session's own
        step_results, each step at its rows of the batch)."""
        h0 = time.perf_counter()
        dt = self.clock() - t0
        done, row = [], 0
        for s, step, submitted in items:
            r = s.session.step_results(step, out_np, row=row, seconds=dt)
            row += len(step.items)
            self._account(s, r, submitted)
            done.append((s, r))
        self._host["results"] += time.perf_counter() - h0
        return done

    def _collect(self, keep: int, only: Optional[Stream] = None) -> list[tuple[Stream, list[FrameResult]]]:
        """(pipeline) Results of the forwards in flight but the newest `keep`; with `only`, other
        streams' results are held for the next step."""
        if self._copies is None:
            return []
        out = []
        h0 = time.perf_counter()
        taken = self._copies.take(keep)       # waits only for the copies it hands out
        self._host["readback"] += time.perf_counter() - h0
        for (items, t0), arrays in taken:
            self._inflight -= len(items)
            for s, res in self._finish(items, arrays, t0):
                if only is None or s is only:
                    out.append((s, res))
                else:
                    self._held.setdefault(s, []).extend(res)
        return out

    def _take_held(self, only: Optional[Stream] = None) -> list[tuple[Stream, list[FrameResult]]]:
        keys = [only] if only is not None else list(self._held)
        return [(s, self._held.pop(s)) for s in keys if s in self._held]

    def run_until_idle(self) -> dict:
        """Step until no frame is queued; {stream name: [results]} in order."""
        got: dict[str, list] = {}
        while self.pending():
            for s, res in self.step():
                got.setdefault(s.name, []).extend(res)
        return got

    def close_stream(self, stream: Stream) -> list[FrameResult]:
        """Serve the stream's queued frames, flush it (a short stream runs its scale phase now),
        close its session (its caches are freed) and return the results not yet returned."""
        results: list[FrameResult] = []
        if stream.closed:
            return results
        while stream.queue and stream.error is None:
            for _, res in self.step(only=stream):
                results.extend(res)
        for _, res in self._take_held(stream) + self._collect(0, stream):    # pipelined, in flight
            results.extend(res)
        if stream.error is None:
            results.extend(self._guard(stream, stream.session.flush, self.clock()))
        stream.session.close()
        stream.closed = True
        stream.queue.clear()
        if self.model.aggregator.graphs is None and any(not s.closed for s in self.streams):
            # session.close() drops the model's shared CUDA graphs; the others keep using graphs
            live = [s for s in self.streams if not s.closed]
            if live[0].session.device.type == "cuda" and live[0].session.config.cuda_graphs:
                from .models.graphs import GraphCache
                self.model.aggregator.graphs = GraphCache()
        return results

    def stats(self) -> dict:
        return {"streams": [s.stats() for s in self.streams], "rounds": self._rounds,
                "batched_frames": self._batched_frames, "largest_batch": self._largest_batch,
                "max_batch": self.max_batch, "attention_streams": self.attention_streams,
                "pipeline": self.pipeline,
                "round_ms_median": float(np.median(self._round_s)) * 1e3 if self._round_s else None,
                "host_ms_per_round": {k: v * 1e3 / max(self._rounds, 1) for k, v in self._host.items()}}
