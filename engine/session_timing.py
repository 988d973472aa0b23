"""Bookkeeping shared by the neural sessions (engine/lingbot/session.py LingBot-Map, engine/vggt/session.py
VGGT chunked, engine/windowed.py): checks of the device and integer settings, the closed flag, taking a frame (preprocess,
size check, index, timestamp) and the latency / throughput of recent model runs for `stats()`.

`SessionTiming` is a mixin: the session calls `_init_timing()` in its constructor and sets
`self.config` (and `self.device`, `self._hw`, `self._next_index` where it uses the methods that read
them); `_SESSION_NAME` names it in the "closed" message. The sessions that run a network of their
own (LingBot-Map, VGGT) start their constructor with `_open_model`, which sets all of these up."""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Optional

import numpy as np
import torch

from .api import EngineError, EngineEvent


def resolve_device(device, error: Callable[[str], EngineError]) -> torch.device:
    """The torch.device of a `device` setting (cpu, cuda, cuda:N); `error(msg)` builds the
    engine's settings error for a device that is unknown or not present."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise error(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise error("device 'cuda' was chosen but no CUDA GPU is available; use cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise error(f"{device} does not exist ({torch.cuda.device_count()} GPU(s) found)")
    elif dev.type != "cpu":
        raise error(f"unsupported device {device!r}; use cpu, cuda or cuda:N")
    return dev


def require_ints(cfg, limits, error: Callable[[str], EngineError]) -> None:
    """Each (name, lo) of `limits` names a setting of `cfg` that must be an int (not a bool) >= lo."""
    for name, lo in limits:
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise error(f"{name} must be an integer >= {lo} (got {v!r})")


class SessionTiming:
    """Closed flag, frame intake and run timing of one session (see the module docstring)."""

    _SESSION_NAME = "engine"

    def _open_model(self, config, model, *, engine: str, kind: type, load: Callable,
                    error: Callable[[str], EngineError]) -> None:
        """The common start of a neural session (config already validated): sets `config`,
        `device` (`error` builds the settings error), `dtype` (compute dtype), `model`, `_events`
        and the timing / closed state (`_init_timing`). The model is the one passed in, else
        `load(config, device, dtype)`; it must be a `kind` (the `engine` engine's network) and is
        moved to the device and converted to the dtype in place: sessions share one copy of the
        weights. Going up in precision cannot restore what an earlier bf16/fp16 session rounded
        away, so `_events` then starts with a warning that says so."""
        from .kv.dtypes import COMPUTE_DTYPES
        self.config = config
        self.device = resolve_device(config.device, error)
        self.dtype = COMPUTE_DTYPES[config.dtype]
        if model is None:
            model = load(config, self.device, self.dtype)
        if not isinstance(model, kind):
            raise EngineError(f"the {engine} engine needs a {self._SESSION_NAME} model, got {type(model).__name__}")
        was = model.compute_dtype
        self.model = model.to(self.device).set_dtype(self.dtype).eval()
        upcast = torch.finfo(was).bits < torch.finfo(self.dtype).bits
        self._events: list[EngineEvent] = [] if not upcast else [EngineEvent("warning", message=(
            f"the model was converted to {str(was).replace('torch.', '')} by an earlier session; "
            f"{config.dtype} results use those rounded weights. Reload the checkpoint for exact {config.dtype}"))]
        self._init_timing()

    def _init_timing(self) -> None:
        self._latency = deque(maxlen=256)       # seconds of recent push/flush calls that ran the model
        self._rate = deque(maxlen=32)           # (results, seconds) of recent model runs
        self._last_latency: Optional[float] = None
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError(f"this {self._SESSION_NAME} session is closed; open a new one")

    def prepare_frame(self, frame):
        """The CPU-side preprocessing of `frame` alone (no session state is touched): safe to call
        on another thread ahead of `push`, which then takes the returned `Prepared` as it is. On
        CUDA the tensor is put in pinned memory so that the step's copy to the GPU is asynchronous."""
        from .preprocess import preprocess
        prep = preprocess(frame, self.config.image_width)
        if self.device.type == "cuda" and not prep.tensor.is_pinned():
            prep.tensor = prep.tensor.pin_memory()
        return prep

    def _take_frame(self, frame, timestamp: Optional[float]):
        """Preprocess `frame`, check it keeps the session's size, and number it:
        -> (Prepared, index, timestamp). The first frame fixes the size."""
        from .preprocess import preprocess
        prep = preprocess(frame, self.config.image_width)
        hw = tuple(prep.tensor.shape[1:])
        if self._hw is None:
            self._hw = hw
        elif hw != self._hw:
            raise EngineError(f"frame size changed: this session runs at {self._hw[1]}x{self._hw[0]} but the "
                              f"frame becomes {hw[1]}x{hw[0]}; start a new session for a different source")
        index = self._next_index
        self._next_index += 1
        ts = float(timestamp) if timestamp is not None else index / float(self.config.fps)
        return prep, index, ts

    def _record_run(self, seconds: float, results: int) -> None:
        self._last_latency = seconds
        self._latency.append(seconds)
        self._rate.append((results, seconds))

    def _timed(self, t0: float, run) -> list:
        """Run `run()`, wait for the GPU, record the time since `t0`; returns run's results."""
        results = run()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._record_run(time.perf_counter() - t0, len(results))
        return results

    def _timing_stats(self) -> dict:
        """fps (results per second of model runs) and latency figures (ms) for `stats()`."""
        lat = np.asarray(self._latency, dtype=np.float64) * 1e3
        n_res = sum(r for r, _ in self._rate)
        secs = sum(s for _, s in self._rate)
        return {
            "fps": (n_res / secs) if secs > 0 else None,
            "latency_ms": self._last_latency * 1e3 if self._last_latency is not None else None,
            "latency_p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
            "latency_p95_ms": float(np.percentile(lat, 95)) if lat.size else None,
        }

    def _gpu_stats(self) -> dict:
        gpu = self.device.type == "cuda"
        return {"gpu_allocated_bytes": torch.cuda.memory_allocated(self.device) if gpu else None,
                "gpu_reserved_bytes": torch.cuda.memory_reserved(self.device) if gpu else None}
