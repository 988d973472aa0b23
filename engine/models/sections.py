"""Named sections of a forward pass, for profilers and benchmarks.

The models enter `section(name)` around their parts ("patch_embed", each "frame_blocks" and
"global_blocks" call, "camera_head", "depth_head") and the paged KV cache around its attention
("global_attention"). A section is

- a `torch.profiler.record_function` range while a PyTorch profiler records (so traces from
  `torch.profiler` / `benchmarks/gpu_profile.py`, and Nsight with NVTX emission, show the parts),
  nothing otherwise (the check costs far less than creating a range for every section);
- timed by the timer a caller installed for the code it runs, on its own thread:

      with sections.timing(timer):        # timer: name -> context manager (engine.bench.SectionTimer)
          session.push(frame)

Nothing is attached to the model or the cache, so a benchmark cannot leave a timer behind in a
model that a later session shares.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Callable, Iterator, Optional

import torch

_TIMER: ContextVar[Optional[Callable]] = ContextVar("reconstudio_section_timer", default=None)


def _profiling() -> bool:
    # PyTorch's own flag, set while a profiler records (a range always when it is missing)
    return bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", True))


@contextlib.contextmanager
def _timed(name: str, timer: Callable, ranged: bool) -> Iterator[None]:
    with timer(name), (torch.profiler.record_function(name) if ranged else contextlib.nullcontext()):
        yield


def section(name: str):
    """The context manager of one section (see the module docstring)."""
    timer = _TIMER.get()
    ranged = _profiling()
    if timer is not None:
        return _timed(name, timer, ranged)
    return torch.profiler.record_function(name) if ranged else contextlib.nullcontext()


def timer_installed() -> bool:
    """A caller's section timer is installed on this thread (a captured CUDA graph would not
    time its sections: callers keep such steps eager)."""
    return _TIMER.get() is not None


@contextlib.contextmanager
def timing(timer: Optional[Callable]) -> Iterator[None]:
    """Sections entered on this thread inside the block are timed by `timer` (None: untimed)."""
    token = _TIMER.set(timer)
    try:
        yield
    finally:
        _TIMER.reset(token)
