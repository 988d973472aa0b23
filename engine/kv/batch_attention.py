"""Global and camera-head attention for a batch of frames from different streams (engine/scheduler.py).

The scheduler stacks the streamed frames of B streams into one forward; the global blocks then
hand their `kv` object q/k/v of shape [B, T, H, D]. `BatchKV` sends frame b's keys/values to
stream b's own paged cache and its queries to attention over that cache only, so every stream
sees exactly what it would alone.

The B attention calls cannot be one kernel: each stream's KV lives in its own pool (separate
tensors), and FlashInfer's batch prefill and SDPA both want one tensor for all page tables. One
call per stream is small for the GPU, though: at 518x378 a frame's 1,005 queries x 16 heads make
~128 thread blocks, about one per SM of an H200, for ~72k keys each. With `side_streams` (CUDA)
stream b's attention is queued on its own CUDA stream, so the B kernels run side by side and fill
the GPU (each waits for the batch's q/k/v, the batch waits for all of them); the kernels and
their inputs are the ones of the plain loop, so the outputs are identical. On the CPU (or without
side streams) the calls run one after the other.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch


class BatchKV:
    """`kv` of `model.forward_step` for a batch whose frame b belongs to `parts[b]` (an object
    with write(layer, k, v) / attend(layer, q) over one stream's cache)."""

    __slots__ = ("parts", "side_streams")

    def __init__(self, parts: Sequence, side_streams: Optional[Sequence] = None):
        self.parts = list(parts)
        self.side_streams = list(side_streams) if side_streams else None
        if self.side_streams is not None and len(self.side_streams) < len(self.parts):
            raise ValueError(f"BatchKV: {len(self.parts)} frames need as many side streams "
                             f"(got {len(self.side_streams)})")

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        for b, kv in enumerate(self.parts):
            kv.write(layer, k[b:b + 1], v[b:b + 1])

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        if self.side_streams is None or q.device.type != "cuda":
            return torch.cat([kv.attend(layer, q[b:b + 1]) for b, kv in enumerate(self.parts)], dim=0)
        main = torch.cuda.current_stream(q.device)
        outs = []
        for b, kv in enumerate(self.parts):
            side = self.side_streams[b]
            side.wait_stream(main)            # the writes and q of this layer are queued on main
            with torch.cuda.stream(side):
                outs.append(kv.attend(layer, q[b:b + 1]))
        for b, out in enumerate(outs):
            main.wait_stream(self.side_streams[b])
            out.record_stream(main)           # made on a side stream, read (and freed) on main
        return torch.cat(outs, dim=0)


class BatchCameraCache:
    """`camera_cache` of `model.forward_step` for the same batch: the camera head sees the batch
    as one sequence [1, B, dim]; token b attends only to `parts[b]` (stream b's camera cache, a
    `CameraCache` of engine/models/camera_head.py) and itself, as it would alone."""

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence):
        self.parts = list(parts)

    def attend_fn(self, iteration: int, block: int, *args):
        fns = [c.attend_fn(iteration, block, *args) for c in self.parts]

        def attend(q, k, v):               # [1, B, H, D]
            return torch.cat([f(q[:, b:b + 1], k[:, b:b + 1], v[:, b:b + 1]) for b, f in enumerate(fns)], dim=1)

        return attend

    def build_static_mask(self) -> None:     # the camera head's static (graph) mode, per cache
        for c in self.parts:
            c.build_static_mask()


def side_streams_for(device, n: int, cache: dict) -> Optional[list]:
    """`n` CUDA side streams of `device`, made once and kept in `cache`; None off CUDA."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    have = cache.setdefault(str(device), [])
    while len(have) < n:
        have.append(torch.cuda.Stream(device))
    return have[:n]
