"""The KV page pools: the tensors of the paged KV cache and every byte move into or out of them.

`KVPool` owns ``k`` / ``v`` of shape ``[num_layers, num_pages, page_size, heads, head_dim]`` and,
for a quantized store, their scales. It writes a step's new keys/values (quantizing once),
copies slots (special ring, compressed window), and hands the attention backends the visible keys
and values of a layer in the attention dtype (a zero-copy view when possible). It knows nothing
about streams or pages in use: `PageTable` decides, the pool executes.

Quantized stores (engine/kv/dtypes.py):
* fp8 (e4m3): one scale per layer, K/V and head, fixed at the layer's first write (the scale
  frames) as amax * FP8_HEADROOM / 448, so later tokens up to FP8_HEADROOM times larger stay in
  range (larger ones saturate; `saturated` counts them, shown as stats()["fp8_saturated"]). A per-head scale can be folded into FlashInfer's fp8 kernel
  (into q for K, into the output for V), which a per-page scale cannot.
* int8: one scale per token and head (absmax / 127), so the error of every stored value is at
  most half a step of its own vector's scale; dequantized on gather (SDPA backend).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..host_copy import upload
from .dtypes import FP8, KVPrecision
from .page_table import KVCacheError, StepTable, page_slots

FP8_MAX = 448.0
FP8_HEADROOM = 8.0        # fp8 keeps ~2 significant digits at any magnitude; range costs nothing
INT8_MAX = 127.0


class KVPool:
    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_heads: int, head_dim: int,
                 precision: KVPrecision, device):
        self.num_layers, self.num_pages, self.page_size = num_layers, num_pages, page_size
        self.num_heads, self.head_dim = num_heads, head_dim
        self.precision = precision
        self.device = torch.device(device)
        self.kind = precision.name if precision.quantized else "native"
        self._index_bufs: dict = {}         # (name, length) -> persistent device index buffer
        store = {"fp8": torch.uint8, "int8": torch.int8}.get(self.kind, precision.storage)
        shape = (num_layers, num_pages, page_size, num_heads, head_dim)
        try:
            self.k = torch.empty(shape, dtype=store, device=self.device)
            self.v = torch.empty(shape, dtype=store, device=self.device)
            if self.kind == "fp8":
                self.scales = torch.ones(num_layers, 2, num_heads, dtype=torch.float32, device=self.device)
                self._scale_set = [False] * num_layers
                # values beyond the fixed range (clamped), counted on the device (no sync per write)
                self.saturated = torch.zeros((), dtype=torch.int64, device=self.device)
            elif self.kind == "int8":
                self.scales = torch.zeros(num_layers, 2, num_pages * page_size, num_heads,
                                          dtype=torch.float32, device=self.device)
            else:
                self.scales = None
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            need = 2 * math.prod(shape) * torch.empty((), dtype=store).element_size()
            raise KVCacheError(
                f"not enough memory for the KV cache ({need / 2**30:.2f} GiB on {self.device}); "
                f"lower the window, the resolution or use a smaller kv_dtype") from exc
        self._buf = None          # gather buffers, allocated once on first use
        self.block_means = None   # block_sparse: [L, pages, blocks, H, D] mean keys (enable_block_means)
        self.block_size = None

    def enable_block_means(self, block_size: int) -> None:
        """Keep the mean key of every run of `block_size` patch tokens of each written page."""
        self.block_size = int(block_size)
        nb = math.ceil(self.page_size / self.block_size)
        self.block_means = torch.zeros(self.num_layers, self.num_pages, nb, self.num_heads, self.head_dim,
                                       dtype=self.precision.attn, device=self.device)

    def reset_scales(self) -> None:
        """fp8: the next write of each layer sets its scales again (a reset cache starts over)."""
        if self.kind == "fp8":
            self._scale_set = [False] * self.num_layers

    # ------------------------------------------------------------------ sizes
    @property
    def bytes_allocated(self) -> int:
        n = 2 * self.k.numel() * self.k.element_size()
        if self.scales is not None:
            n += self.scales.numel() * self.scales.element_size()
        return n

    @property
    def bytes_per_token(self) -> float:
        """Bytes one cached token takes in all layers (keys + values + scales)."""
        return self.bytes_allocated / (self.num_pages * self.page_size)

    # ------------------------------------------------------------------ step tensors
    def attach(self, step: StepTable) -> StepTable:
        """Device index tensors of a step (built once, shared by all layers)."""
        dev = self.device
        step.device = dev
        # through pinned memory, non-blocking: a blocking upload would wait for the previous
        # step's GPU work (engine/host_copy.py `upload`)
        # the write indices go into buffers kept per length: the same device addresses every
        # step, so a captured CUDA graph of a whole step writes where the current step says
        step.new_pages_t = self._index("new_pages", step.new_pages)
        step.special_flat_t = self._index("special_flat", step.special_flat)
        step.pages_t = upload(step.pages, dev, torch.int64)
        if step.slots is not None:
            step.slots_t = upload(step.slots, dev, torch.int64)
        elif self.kind == "int8":     # token scales: a gather by token reads them (`visible`)
            step.int8_slots_t = upload(page_slots(step.pages, self.page_size, step.num_kv_tokens), dev, torch.int64)
        step.written = [False] * self.num_layers
        return step

    def _index(self, name: str, data) -> torch.Tensor:
        """int64 `data` on the device in the persistent buffer of (`name`, its length), through
        `upload` (no host sync; stream-ordered after the previous step's reads of the buffer)."""
        data = np.asarray(data, dtype=np.int64)
        key = (name, data.size)
        buf = self._index_bufs.get(key)
        if buf is None:
            buf = self._index_bufs[key] = torch.empty(data.size, dtype=torch.int64, device=self.device)
        return upload(data, self.device, torch.int64, out=buf)

    # ------------------------------------------------------------------ quantization
    def quantize(self, layer: int, which: int, x: torch.Tensor):
        """x [..., H, D] (any float dtype) -> (stored values, per-token scales or None)."""
        if self.kind == "native":
            return x.to(device=self.device, dtype=self.k.dtype), None
        x = x.to(device=self.device, dtype=torch.float32)
        if self.kind == "fp8":
            if not self._scale_set[layer]:
                amax = x.abs().amax(dim=tuple(range(x.dim() - 2)) + (x.dim() - 1,))     # [H]
                self.scales[layer, which] = torch.clamp(amax * FP8_HEADROOM / FP8_MAX, min=1e-8)
            s = self.scales[layer, which][:, None]
            y = x / s
            self.saturated += (y.abs() > FP8_MAX).sum()
            q = torch.clamp(y, -FP8_MAX, FP8_MAX).to(FP8).view(torch.uint8)
            return q, None
        s = torch.clamp(x.abs().amax(dim=-1) / INT8_MAX, min=1e-12)            # [..., H]
        q = torch.clamp(torch.round(x / s[..., None]), -INT8_MAX, INT8_MAX).to(torch.int8)
        return q, s

    def dequantize(self, layer: int, which: int, raw: torch.Tensor, slots_t=None) -> torch.Tensor:
        """Stored values [n, H, D] (of `slots_t` for int8) -> attention dtype."""
        dt = self.precision.attn
        if self.kind == "native":
            return raw if raw.dtype == dt else raw.to(dt)
        # convert first (exact: e4m3 / int8 values are representable in bf16 / fp16 / fp32), then
        # scale in place; the multiply runs in fp32 and rounds once, so this equals
        # (fp32(x) * s).to(dt) bit for bit, in two passes and without fp32 temporaries of the
        # whole visible set (19 -> 7 bytes moved per value)
        if self.kind == "fp8":
            return raw.view(FP8).to(dt).mul_(self.scales[layer, which][:, None])
        s = self.scales[layer, which].index_select(0, slots_t)
        return raw.to(dt).mul_(s[..., None])

    # ------------------------------------------------------------------ writes and copies
    def write(self, layer: int, step: StepTable, k: torch.Tensor, v: torch.Tensor, special_tokens: int) -> None:
        """The new frames' k, v [F, T, H, D] (T = specials + patches) into their pages / slots."""
        F = step.num_frames
        S, H, D, P = special_tokens, self.num_heads, self.head_dim, self.page_size
        for which, (pool, x) in enumerate(((self.k, k), (self.v, v))):
            q, s = self.quantize(layer, which, x)
            pool[layer].index_copy_(0, step.new_pages_t, q[:, S:])
            if s is not None:
                tok = (step.new_pages_t[:, None] * P + torch.arange(P, device=self.device)).reshape(-1)
                self.scales[layer, which].index_copy_(0, tok, s[:, S:].reshape(-1, H))
            if S:
                flat = pool[layer].view(self.num_pages * P, H, D)
                flat.index_copy_(0, step.special_flat_t, q[:, :S].reshape(F * S, H, D))
                if s is not None:
                    self.scales[layer, which].index_copy_(0, step.special_flat_t, s[:, :S].reshape(F * S, H))
        if self.kind == "fp8":
            self._scale_set[layer] = True
        if self.block_means is not None:
            B, nb = self.block_size, self.block_means.shape[2]
            x = k[:, S:].to(device=self.device, dtype=torch.float32)                  # [F, P, H, D]
            pad = nb * B - P
            if pad:
                x = torch.cat([x, x.new_zeros((F, pad, H, D))], dim=1)
            sizes = torch.full((nb,), float(B), device=self.device)
            sizes[-1:].fill_(float(B - pad))   # a kernel argument: no host copy (whole-step capture)
            means = x.view(F, nb, B, H, D).sum(dim=2) / sizes[None, :, None, None]
            self.block_means[layer].index_copy_(0, step.new_pages_t, means.to(self.block_means.dtype))

    def write_slots(self, layer: int, slots_t: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [n, H, D] (attention dtype) into flat slots of one layer (compressed window)."""
        P, H, D = self.page_size, self.num_heads, self.head_dim
        for which, (pool, x) in enumerate(((self.k, k), (self.v, v))):
            q, s = self.quantize(layer, which, x)
            pool[layer].view(self.num_pages * P, H, D).index_copy_(0, slots_t, q)
            if s is not None:
                self.scales[layer, which].index_copy_(0, slots_t, s)

    def write_slots_layers(self, slots_t: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [L, n, H, D] (every layer) into flat slots of a native store, one copy each."""
        L, N, P, H, D = self.k.shape
        for pool, x in ((self.k, k), (self.v, v)):
            pool.view(L, N * P, H, D).index_copy_(1, slots_t, x.to(pool.dtype))

    def copy_slots(self, src: list, dst: list) -> None:
        """Copy tokens (every layer, keys, values and their scales) between flat slots."""
        if len(src) == 0:
            return
        s = upload(src, self.device, torch.int64)
        d = upload(dst, self.device, torch.int64)
        L, N, P, H, D = self.k.shape
        for pool in (self.k, self.v):      # one copy for every layer
            flat = pool.view(L, N * P, H, D)
            flat[:, d] = flat[:, s]
        if self.kind == "int8":
            self.scales[:, :, d] = self.scales[:, :, s]

    def read_page(self, layer: int, page: int):
        """Keys and values of one page of one layer, dequantized: [P, H, D] each."""
        P = self.page_size
        slots = torch.arange(page * P, page * P + P, device=self.device) if self.kind == "int8" else None
        return (self.dequantize(layer, 0, self.k[layer, page], slots),
                self.dequantize(layer, 1, self.v[layer, page], slots))

    # ------------------------------------------------------------------ reads
    def visible(self, layer: int, step: StepTable, zero_copy: bool = True, slots_t=None):
        """The visible keys/values of one layer as [tokens, H, D] in the attention dtype: a view
        of the pool when the pages are one run and the store is native, else a gather (by page,
        or by token when the window is compressed / the store is int8 / `slots_t` is given)."""
        P, H, D = self.page_size, self.num_heads, self.head_dim
        slots_t = step.slots_t if slots_t is None else slots_t
        if slots_t is None and self.kind == "int8":
            slots_t = step.int8_slots_t
        kp, vp = self.k[layer], self.v[layer]
        if slots_t is not None:
            n = slots_t.numel()
            kb, vb = self._buffers()
            k = torch.index_select(kp.view(-1, H, D), 0, slots_t, out=kb.view(-1, H, D)[:n])
            v = torch.index_select(vp.view(-1, H, D), 0, slots_t, out=vb.view(-1, H, D)[:n])
        elif zero_copy and step.contiguous is not None:
            a, m = step.contiguous
            k = kp[a:a + m].reshape(m * P, H, D)[:step.num_kv_tokens]
            v = vp[a:a + m].reshape(m * P, H, D)[:step.num_kv_tokens]
        else:
            n = len(step.pages)
            kb, vb = self._buffers()
            k = torch.index_select(kp, 0, step.pages_t, out=kb[:n]).view(n * P, H, D)[:step.num_kv_tokens]
            v = torch.index_select(vp, 0, step.pages_t, out=vb[:n]).view(n * P, H, D)[:step.num_kv_tokens]
        return self.dequantize(layer, 0, k, slots_t), self.dequantize(layer, 1, v, slots_t)

    def _buffers(self):
        if self._buf is None:  # once, sized for the largest possible visible set
            self._buf = (torch.empty_like(self.k[0]), torch.empty_like(self.v[0]))
        return self._buf
