"""CUDA graphs for the fixed-shape parts of a streamed LingBot-Map frame.

A streamed frame launches ~2,000 small kernels; in eager mode the Python launch time can exceed
the GPU time, so the GPU waits (docs/benchmarks.md). The patch
embed, each frame block and the depth head see the same shapes every streamed frame, so each is
captured once into a CUDA graph and replayed: one launch instead of dozens. The global blocks
(their KV length changes as the special stream grows) and the camera head (its cache grows) stay
eager -- unless the KV backend attends with fixed shapes and pointers (the cuDNN split in static
mode): then the model captures the WHOLE streamed step, keyed by its kind, through this cache
(engine/lingbot/model.py `_graphed_step`), and the parts above run inside it unwrapped.

`GraphCache.run(key, fn, *inputs)` captures `fn` the first time a key is seen (inputs copied into
static buffers, a side-stream warm-up first, as CUDA graphs require) and replays it afterwards.
Outputs live in the graph's static buffers: they are valid until the same key runs again, which
is the next frame -- callers must copy what they keep beyond that (the session converts results
to numpy at the end of every step). All graphs share one memory pool.
"""
from __future__ import annotations

from typing import Callable, Hashable

import torch


_WARMUP_STREAMS: dict = {}


def _warmup_stream(device: torch.device) -> torch.cuda.Stream:
    """ONE side stream per device for every capture's warm-up, for the process: PyTorch keeps a
    cuBLAS workspace for each (handle, stream) until the process ends, so a fresh stream per
    capture (26 part graphs a session, sessions after sessions) left up to one workspace per
    stream of torch's stream pool in the ordinary pool -- memory no plan counts, which the
    whole-step capture under a memory cap then lacked (docs/benchmarks.md, "Stop 32")."""
    dev = device.index if device.index is not None else torch.cuda.current_device()
    if dev not in _WARMUP_STREAMS:
        _WARMUP_STREAMS[dev] = torch.cuda.Stream(dev)
    return _WARMUP_STREAMS[dev]


class _Captured:
    def __init__(self, fn: Callable, inputs: tuple, pool, side: torch.cuda.Stream, error_mode: str = "global"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        self.static_in = tuple(x.clone() for x in inputs)
        # the flash / mem-efficient SDPA kernels capture cleanly; cuDNN's per-shape graph build
        # is kept out of the capture (calls that ask for cuDNN first -- layers.sdpa_bnhd, the
        # split -- build it in the eager warm-up below, so the capture only launches it)
        kernels = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        with sdpa_kernel(kernels, set_priority=True):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):      # warm-up: lazy inits (cuBLAS handles, workspaces)
                for _ in range(2):
                    fn(*self.static_in)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool, capture_error_mode=error_mode):
                self.static_out = fn(*self.static_in)

    def __call__(self, inputs: tuple):
        for s, x in zip(self.static_in, inputs):
            s.copy_(x)
        self.graph.replay()
        return self.static_out


class GraphCache:
    """Captured graphs by key (part name + input shapes/dtypes)."""

    def __init__(self):
        self._graphs: dict[Hashable, _Captured] = {}
        self._pool = None

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, name: Hashable, fn: Callable, *inputs: torch.Tensor, error_mode: str = "global"):
        """fn(*inputs) through the graph of (`name`, the inputs' shapes and dtypes), captured on
        first use. error_mode: CUDA's stream-capture mode ("thread_local": CUDA calls of OTHER
        threads -- a reader thread pinning the next frame -- do not invalidate the capture)."""
        key = (name,) + tuple((tuple(x.shape), x.dtype) for x in inputs)
        g = self._graphs.get(key)
        if g is None:
            if self._pool is None or not self._graphs:
                # a fresh pool once no graph holds the last one: the allocator retires a pool
                # whose graphs are all gone and refuses a capture into it
                self._pool = torch.cuda.graph_pool_handle()
            g = self._graphs[key] = _Captured(fn, inputs, self._pool, _warmup_stream(inputs[0].device), error_mode)
        return g(inputs)

    def has(self, name: Hashable) -> bool:
        """A graph is captured under `name` (any input shapes)."""
        return any(k[0] == name for k in self._graphs)

    def step_graphs(self) -> int:
        """How many whole-step graphs are captured (keys named ("step", ...))."""
        return sum(1 for k in self._graphs if isinstance(k[0], tuple) and k[0][:1] == ("step",))

    def discard(self, name: Hashable) -> None:
        """Forget the graphs captured under `name` (any input shapes)."""
        for key in [k for k in self._graphs if k[0] == name]:
            del self._graphs[key]

    def clear(self) -> None:
        self._graphs.clear()
        self._pool = None
