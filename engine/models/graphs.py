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


class _Captured:
    def __init__(self, fn: Callable, inputs: tuple, pool, error_mode: str = "global"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        self.static_in = tuple(x.clone() for x in inputs)
        # the flash / mem-efficient SDPA kernels capture cleanly; cuDNN's per-shape graph build
        # is kept out of the capture (calls that ask for cuDNN first -- layers.sdpa_bnhd, the
        # split -- build it in the eager warm-up below, so the capture only launches it)
        kernels = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        with sdpa_kernel(kernels, set_priority=True):
            side = torch.cuda.Stream()
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
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            g = self._graphs[key] = _Captured(fn, inputs, self._pool, error_mode)
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

    def discard_single_frame_parts(self) -> int:
        """Forget the per-part graphs of one-frame steps (every key but the whole steps'): their
        blocks go back to the shared pool, where a whole-step capture reuses them. Batched
        parts (first input larger than one frame) stay. Returns how many were dropped."""
        drop = [k for k in self._graphs if not (isinstance(k[0], tuple) and k[0][:1] == ("step",))
                and len(k) > 1 and k[1][0][:1] == (1,)]
        for key in drop:
            del self._graphs[key]
        return len(drop)

    def clear(self) -> None:
        self._graphs.clear()
        self._pool = None
