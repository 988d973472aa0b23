"""Step outputs to the host without a host synchronisation per step.

A session that copies its outputs to numpy at the end of every step makes the CPU wait for the
GPU once per frame: the GPU then idles while the CPU preprocesses the next frame and queues its
first kernels. `HostCopies` instead queues, at the end of step N,

1. a device-to-device copy of the outputs into a staging slot (on the compute stream: a few
   microseconds, and the outputs -- often a CUDA graph's static buffers, overwritten by the next
   replay -- are free again at once),
2. on a copy stream, waiting for (1) by an event: a copy of the staging slot into pinned host
   memory, then a "done" event,

and the caller takes step N's arrays later (`take(keep=1)` after submitting step N + 1 hands out
step N, waiting only on N's "done" event, which by then has normally passed). Two slots are
enough for "one step later"; a third submit before a take waits for the oldest.

On the CPU `submit` converts at once and `take` returns immediately. Arrays handed out are views
of the pinned buffers, valid until their slot is reused (`slots` submits later): copy what you
keep (FrameResult construction does).
"""
from __future__ import annotations

from collections import deque
from typing import Any, Hashable

import torch


class _Slot:
    __slots__ = ("staging", "pinned", "ready", "done", "owner")

    def __init__(self):
        self.staging: dict = {}     # (key, shape) -> device float32 tensor
        self.pinned: dict = {}      # (key, shape) -> pinned host float32 tensor
        self.ready = torch.cuda.Event()
        self.done = torch.cuda.Event()
        self.owner = None           # the pending entry whose copy this slot holds


class HostCopies:
    """Queue of step outputs on their way to the host (see the module docstring)."""

    def __init__(self, device: Any, slots: int = 2):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if slots < 1:
            raise ValueError("HostCopies needs at least one slot")
        self._n = int(slots)
        self._pending: deque = deque()          # (tag, slot or host dict)
        self._slots: list = []
        self._next = 0
        self._stream = torch.cuda.Stream(self.device) if self.cuda else None

    def __len__(self) -> int:
        return len(self._pending)

    def submit(self, outputs: dict, tag: Hashable = None) -> None:
        """Queue `outputs` (name -> tensor on this device) for the host, tagged `tag`."""
        if not self.cuda:
            self._pending.append([tag, {k: t.detach().float().numpy() for k, t in outputs.items()}])
            return
        if len(self._slots) < self._n:
            self._slots.append(_Slot())
        slot = self._slots[self._next]
        self._next = (self._next + 1) % self._n
        if slot.owner is not None:              # every slot in flight: finish the oldest now,
            entry = slot.owner                  # copying its arrays (the slot is reused below)
            entry[1] = {k: a.copy() for k, a in self._finish(*entry)[1].items()}
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(slot.done)           # its previous copy to the host has run
        keys = []
        for k, t in outputs.items():
            key = (k, tuple(t.shape))
            if key not in slot.staging:
                slot.staging[key] = torch.empty(t.shape, dtype=torch.float32, device=self.device)
                slot.pinned[key] = torch.empty(t.shape, dtype=torch.float32, pin_memory=True)
            slot.staging[key].copy_(t)
            keys.append(key)
        slot.ready.record(compute)
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(slot.ready)
            for key in keys:
                slot.pinned[key].copy_(slot.staging[key], non_blocking=True)
            slot.done.record(self._stream)
        entry = [tag, (slot, keys)]
        slot.owner = entry
        self._pending.append(entry)

    def take(self, keep: int = 0) -> list:
        """[(tag, {name: np.ndarray})] of the oldest submitted steps, oldest first, leaving the
        newest `keep` in flight; waits only for the copies it hands out."""
        out = []
        while len(self._pending) > keep:
            out.append(self._finish(*self._pending.popleft()))
        return out

    def _finish(self, tag, item):
        if isinstance(item, dict):              # CPU, or already finished
            return tag, item
        slot, keys = item
        slot.done.synchronize()
        slot.owner = None
        return tag, {k: slot.pinned[(k, shape)].numpy() for k, shape in keys}

    def clear(self) -> None:
        """Drop everything in flight (a closed session); the buffers go with their last reference."""
        if self._stream is not None:
            self._stream.synchronize()      # no copy may still read a staging buffer being freed
        self._pending.clear()
        self._slots.clear()



def upload(data, device, dtype=None, out: torch.Tensor = None) -> torch.Tensor:
    """Host data (a list, numpy array or CPU tensor) on `device` without a host synchronisation:
    `torch.tensor(data, device="cuda")` and a blocking `.to("cuda")` wait for the whole stream
    before copying, i.e. for the previous step's GPU work. Here the data goes through pinned
    memory with a non-blocking copy; PyTorch's pinned-memory cache keeps that block until the
    copy has run. CPU devices get a plain CPU tensor. `out`: copied into this tensor of the data's
    size on `device` instead (stream-ordered after earlier reads of it), which is returned."""
    t = torch.as_tensor(data, dtype=dtype)
    dev = torch.device(device)
    if dev.type != "cuda":
        return t.to(dev) if out is None else out.copy_(t)
    if out is not None:
        return out.copy_(t.pin_memory(), non_blocking=True)
    return t.pin_memory().to(dev, non_blocking=True)
