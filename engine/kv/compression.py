"""KV-cache compression of the window stream (`SessionConfig.kv_compression`).

Scale frames and special tokens are always kept exact; the frame being processed attends with all
of its own tokens. What changes is what a *committed window frame* leaves in the cache:

* ``none``: every patch token.
* ``token_partition`` (after FastVGGT's partition into kept and dropped tokens): per layer, the
  ``keep_ratio`` share of tokens whose keys deviate most from the frame's mean key (the
  distinctive ones; the near-average ones carry little that the rest does not).
* ``random_subset`` (after AVGGT): a seeded random ``keep_ratio`` share, the same in every layer,
  reproducible from (seed, frame number).
* ``token_merge``: tokens are merged into ``keep_ratio * P`` groups of raster-adjacent patches
  (neighbours along the row); a group's key and value are the means of its members.
* ``block_sparse`` (after Sparse-VGGT): nothing is dropped from storage; at attention time each
  layer attends to the ``keep_ratio`` share of window blocks (runs of ``block_size`` tokens of a
  frame) whose mean key best matches the step's mean query, plus all scale, own and special
  tokens. The block means are stored when a frame is written (engine/kv/pool.py), so choosing
  reads ~1/block_size of the window's keys. The number of blocks kept depends on the window's
  block count only (`kept_blocks`), so once the window is full a step attends a fixed number of
  blocks: the cuDNN split gathers them into a fixed-length scratch (`block_slots`: a page's
  partial last block is packed away, the token count stays on the device) for whole-step graphs.

The first three store ``keep_tokens`` per window frame (packed, engine/kv/page_table.py "compressed
window"), so they save memory and attention time; block_sparse saves attention time only.
Compressors are handed to `PagedKVCache(compression=...)`; `make_compressor(name, ...)` builds one.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from ..host_copy import upload
from .page_table import KVCacheError

METHODS = ("none", "token_partition", "random_subset", "token_merge", "block_sparse")


class Compressor:
    """Base: keeps everything."""

    name = "none"
    stores_fewer = False        # packs fewer tokens per window frame
    sparse_attention = False    # selects window blocks at attention time

    def __init__(self, keep_ratio: float = 1.0, block_size: int = 64, seed: int = 0):
        if not 0.0 < float(keep_ratio) <= 1.0:
            raise KVCacheError(f"kv_keep_ratio must be in (0, 1] (got {keep_ratio})")
        if int(block_size) < 1:
            raise KVCacheError(f"kv_block_size must be >= 1 (got {block_size})")
        self.keep_ratio, self.block_size, self.seed = float(keep_ratio), int(block_size), int(seed)

    def keep_tokens(self, page_size: int) -> int:
        return page_size

    def describe(self) -> dict:
        return {"method": self.name, "keep_ratio": self.keep_ratio, "block_size": self.block_size,
                "seed": self.seed}

    # storage compressors implement: kept(k [P,H,D], v [P,H,D], layer, frame) -> (k [K,H,D], v [K,H,D])

    def kept_layers(self, k: torch.Tensor, v: torch.Tensor, frame: int):
        """`kept` for every layer at once: k, v [L, P, H, D] -> [L, K, H, D] each (the same tokens
        as `kept` layer by layer). The commit of a compressed frame uses it: a few launches per
        frame instead of a few per layer, and no host synchronisation."""
        outs = [self.kept(k[i], v[i], i, frame) for i in range(k.shape[0])]
        return torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])


class _Storing(Compressor):
    stores_fewer = True

    def keep_tokens(self, page_size: int) -> int:
        return max(1, min(page_size, int(round(self.keep_ratio * page_size))))


class TokenPartition(_Storing):
    name = "token_partition"

    def indices(self, k: torch.Tensor) -> torch.Tensor:
        K = self.keep_tokens(k.shape[0])
        kf = k.float()
        score = (kf - kf.mean(dim=0, keepdim=True)).norm(dim=-1).mean(dim=-1)      # [P]
        return torch.sort(torch.topk(score, K).indices).values

    def kept(self, k, v, layer, frame):
        idx = self.indices(k)
        return k[idx], v[idx]

    def kept_layers(self, k, v, frame):
        L, P, H, D = k.shape
        kf = k.float()
        score = (kf - kf.mean(dim=1, keepdim=True)).norm(dim=-1).mean(dim=-1)          # [L, P]
        idx = torch.sort(torch.topk(score, self.keep_tokens(P), dim=1).indices, dim=1).values
        idx = idx[:, :, None, None].expand(-1, -1, H, D)
        return k.gather(1, idx), v.gather(1, idx)


class RandomSubset(_Storing):
    name = "random_subset"

    def indices(self, page_size: int, frame: int, device) -> torch.Tensor:
        K = self.keep_tokens(page_size)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(frame))
        # drawn on the host (reproducible on any device), uploaded without a host sync
        return upload(torch.sort(torch.randperm(page_size, generator=g)[:K]).values, device, torch.int64)

    def kept(self, k, v, layer, frame):
        idx = self.indices(k.shape[0], frame, k.device)
        return k[idx], v[idx]

    def kept_layers(self, k, v, frame):
        idx = self.indices(k.shape[1], frame, k.device)        # the same tokens in every layer
        return k[:, idx], v[:, idx]


class TokenMerge(_Storing):
    name = "token_merge"

    def groups(self, page_size: int) -> np.ndarray:
        """Group id of every token: K runs of raster-adjacent tokens (sizes differ by <= 1)."""
        K = self.keep_tokens(page_size)
        return (np.arange(page_size) * K) // page_size

    def _group_tensors(self, page_size: int, device):
        """(group id per token, members per group as float32) on `device`, built once: no
        per-frame upload, and no `bincount` on the device (which reads its result size back)."""
        key = (page_size, str(device))
        cached = getattr(self, "_groups_cache", None)
        if cached is None or cached[0] != key:
            g = self.groups(page_size)
            count = np.bincount(g, minlength=self.keep_tokens(page_size)).astype(np.float32)
            cached = self._groups_cache = (key, upload(g, device, torch.int64), upload(count, device))
        return cached[1], cached[2]

    def kept(self, k, v, layer, frame):
        out = self.kept_layers(k[None], v[None], frame)
        return out[0][0], out[1][0]

    def kept_layers(self, k, v, frame):
        L, P = k.shape[:2]
        g, count = self._group_tensors(P, k.device)
        out = []
        for x in (k, v):
            acc = torch.zeros((L, self.keep_tokens(P)) + tuple(x.shape[2:]), dtype=torch.float32, device=x.device)
            acc.index_add_(1, g, x.float())
            out.append((acc / count[:, None, None]).to(x.dtype))
        return out[0], out[1]


class BlockSparse(Compressor):
    name = "block_sparse"
    sparse_attention = True

    def blocks_per_page(self, page_size: int) -> int:
        return math.ceil(page_size / self.block_size)

    def kept_blocks(self, num_blocks: int) -> int:
        """How many of `num_blocks` window blocks a step attends: fixed by the block count, so a
        full window keeps the same number every step (the fixed-shape path relies on it)."""
        return min(num_blocks, max(1, int(math.ceil(self.keep_ratio * num_blocks))))

    def top_blocks(self, q: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
        """Flat ids (page_index * blocks_per_page + block) of the kept window blocks, in no
        particular order: q [n, H, D] the step's queries, means [W, nb, H, D] the mean keys of the
        window's blocks; score = mean query . mean key summed over heads; the top keep_ratio share
        (`kept_blocks`) is kept. Device ops only, of shapes fixed by W (no host read)."""
        score = (means.float() * q.float().mean(dim=0)[None, None]).sum(dim=(-1, -2)).reshape(-1)
        keep = self.kept_blocks(score.numel())
        if keep >= score.numel():
            return torch.arange(score.numel(), device=score.device)
        return torch.topk(score, keep, sorted=False).indices

    def select_blocks(self, q: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
        """`top_blocks`, ascending."""
        return torch.sort(self.top_blocks(q, means)).values

    def block_slots(self, chosen: torch.Tensor, pages_t: torch.Tensor, page_size: int):
        """The pool's flat slots of the chosen blocks with a FIXED length: (slots int64
        [len(chosen) * block_size], valid int64 scalar on the device). The first `valid` slots are
        the blocks' tokens (a page's last block may be partial: page_size need not be a multiple
        of block_size), packed; the rest are slot 0, to be masked by the length. `pages_t`: the
        window's pages, oldest first (`chosen` indexes them). Device ops only: what a static step
        attends (engine/kv/cudnn_split.py), with no host read of how many tokens were chosen."""
        nb, B, P = self.blocks_per_page(page_size), self.block_size, page_size
        page, blk = pages_t[chosen // nb], chosen % nb
        length = torch.clamp(P - blk * B, max=B)                          # tokens of each block
        start = torch.cumsum(length, 0) - length                          # packed offsets
        t = torch.arange(B, device=chosen.device)
        n = chosen.numel() * B
        dst = torch.where(t[None] < length[:, None], start[:, None] + t[None], n)   # n: a discard slot
        src = page[:, None] * P + blk[:, None] * B + t[None]
        slots = torch.zeros(n + 1, dtype=torch.int64, device=chosen.device)
        slots.scatter_(0, dst.reshape(-1), src.reshape(-1))
        return slots[:n], length.sum()

    def block_tokens(self, chosen: torch.Tensor, page_size: int) -> torch.Tensor:
        """Token offsets (page_index * page_size + offset) of the chosen flat block ids."""
        nb, B = self.blocks_per_page(page_size), self.block_size
        page, blk = chosen // nb, chosen % nb
        off = blk[:, None] * B + torch.arange(B, device=chosen.device)[None]
        tok = page[:, None] * page_size + off
        return tok[off < page_size]


_CLASSES = {c.name: c for c in (Compressor, TokenPartition, RandomSubset, TokenMerge, BlockSparse)}


def make_compressor(method: Optional[str], keep_ratio: float = 0.5, block_size: int = 64,
                    seed: int = 0) -> Compressor:
    """The compressor for a `kv_compression` setting (KVCacheError names the choices)."""
    name = (method or "none").lower()
    if name not in _CLASSES:
        raise KVCacheError(f"unknown kv_compression {method!r}; use {', '.join(METHODS)}")
    if name == "none":
        return Compressor()
    return _CLASSES[name](keep_ratio=keep_ratio, block_size=block_size, seed=seed)
