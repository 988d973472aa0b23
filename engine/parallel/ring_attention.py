"""Ring attention: exact non-causal attention over a sequence sharded across the ranks of a
torch.distributed process group (one GPU per rank over NCCL, or CPU processes over gloo).

Every rank holds one contiguous shard of the queries, keys and values (shards may have different
lengths). The key/value shards travel around the ring: at step s rank r holds the shard of rank
(r - s) mod W; it *sends that shard on* to rank r + 1 and *receives the next one* from rank r - 1
(P2P isend/irecv, started before the local attention, so the transfer overlaps the compute), then
attends its queries to the shard it holds. After W steps every query has seen every key. The
partial results are merged with their log-sum-exp, which makes the result exact (up to float
rounding) against attention over the whole sequence in one process:

    lse = logaddexp(lse_a, lse_b);  out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse)

The merge runs in float32 whatever the input dtype. The local attention uses a fused kernel that
returns the log-sum-exp (CPU: the flash-attention-for-CPU op; CUDA bf16/fp16: flash attention;
CUDA fp32: memory-efficient attention), falling back to plain float32 math in query chunks.

Layout: the core functions take SDPA's [B, H, L, D]; `ring_attention_bnhd` takes the model's
[B, L, H, D] (engine/models/layers.py). No Qt, no model imports.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

# the float32 math fallback takes queries in chunks whose score matrix stays under this many bytes
_MATH_BYTES = 1 << 28
_MATH_CHUNK = None          # fixed rows per chunk (tests); None = from _MATH_BYTES


def _math_attention_lse(q, k, v, scale):
    """float32 reference: (out [B,H,Lq,D] fp32, lse [B,H,Lq] fp32), queries in chunks."""
    kf, vf = k.float(), v.float()
    outs, lses = [], []
    if k.shape[2] == 0:                          # no keys: zero output, lse -inf (merges to nothing)
        B, H, Lq, _ = q.shape
        return q.new_zeros(B, H, Lq, v.shape[-1], dtype=torch.float32), q.new_full((B, H, Lq), -math.inf, dtype=torch.float32)
    if q.shape[2] == 0:
        return q.new_zeros(*q.shape[:3], v.shape[-1], dtype=torch.float32), q.new_zeros(q.shape[:3], dtype=torch.float32)
    B, H, _, _ = q.shape
    rows = _MATH_CHUNK or max(1, _MATH_BYTES // (4 * B * H * k.shape[2]))
    for i in range(0, q.shape[2], rows):
        s = torch.matmul(q[:, :, i:i + rows].float(), kf.transpose(-1, -2)) * scale
        lse = torch.logsumexp(s, dim=-1)
        outs.append(torch.matmul(torch.exp(s - lse[..., None]), vf))
        lses.append(lse)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  scale: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention of q [B,H,Lq,D] over k, v [B,H,Lk,D] -> (out [B,H,Lq,D] in q's dtype,
    lse [B,H,Lq] float32), the log-sum-exp of each query's scaled scores."""
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if q.shape[2] == 0 or k.shape[2] == 0:      # fused kernels divide by these (SIGFPE on the CPU)
        out, lse = _math_attention_lse(q, k, v, scale)
        return out.to(q.dtype), lse
    try:
        if q.device.type == "cpu":
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, False, scale=scale)[:2]
            return out, lse.float()
        if q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16):
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, 0.0, False, False, scale=scale)[:2]
            return out, lse.float()
        if q.device.type == "cuda":
            out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, None, True, 0.0, False, scale=scale)[:2]
            return out, lse[..., :q.shape[2]].float()      # lse rows may be padded
    except (RuntimeError, NotImplementedError, TypeError):
        pass                                                # unsupported shape/dtype: plain math
    out, lse = _math_attention_lse(q, k, v, scale)
    return out.to(q.dtype), lse


class _Merged:
    """Running log-sum-exp merge of partial attention results (float32)."""

    __slots__ = ("out", "lse")

    def __init__(self):
        self.out = self.lse = None

    def add(self, out: torch.Tensor, lse: torch.Tensor) -> None:
        out = out.float()
        if self.out is None:
            self.out, self.lse = out, lse
            return
        new = torch.logaddexp(self.lse, lse)
        self.out = self.out * torch.exp(self.lse - new)[..., None] + out * torch.exp(lse - new)[..., None]
        self.lse = new

    def result(self, dtype: torch.dtype) -> torch.Tensor:
        return self.out.to(dtype)


def blockwise_attention(q: torch.Tensor, k_blocks: Sequence[torch.Tensor], v_blocks: Sequence[torch.Tensor],
                        scale: Optional[float] = None, return_lse: bool = False):
    """Attention of q over the concatenation of key/value blocks, one block at a time, merged by
    log-sum-exp (what one rank of the ring computes, in one process). Empty blocks are skipped."""
    acc = _Merged()
    for k, v in zip(k_blocks, v_blocks):
        if k.shape[2]:
            acc.add(*attention_lse(q, k, v, scale))
    if acc.out is None:
        raise ValueError("blockwise attention needs at least one non-empty key block")
    out = acc.result(q.dtype)
    return (out, acc.lse) if return_lse else out


def _peer(group, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def shard_lengths(local_len: int, group=None) -> list[int]:
    """Every rank's shard length (one small all-gather; a tensor on the backend's device)."""
    world = dist.get_world_size(group)
    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    mine = torch.tensor([int(local_len)], dtype=torch.int64, device=dev)
    out = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(out, mine, group=group)
    return [int(t.item()) for t in out]


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None,
                   scale: Optional[float] = None, lengths: Optional[Sequence[int]] = None,
                   on_block: Optional[Callable[[int, torch.Tensor], None]] = None) -> torch.Tensor:
    """Exact attention of this rank's queries q [B,H,Lq,D] over the keys/values of *every* rank
    of `group` (this rank's k, v [B,H,Lk,D] are its shard; shards may differ in length, a rank may
    hold none). `lengths` (every rank's Lk) saves an all-gather when the caller knows them.
    `on_block(src_rank, kv)` sees every shard as it passes (kv = [2, B, H, L_src, D], this rank's
    own first), e.g. to fill a replicated KV cache without a separate all-gather.
    Returns [B,H,Lq,D] in q's dtype. Every rank of the group must call it (it communicates)."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size(group) == 1:
        if on_block is not None:
            on_block(0, torch.stack((k, v)))
        return blockwise_attention(q, [k], [v], scale)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    lengths = list(lengths) if lengths is not None else shard_lengths(k.shape[2], group)
    if len(lengths) != world or lengths[rank] != k.shape[2]:
        raise ValueError(f"ring attention: lengths {lengths} do not match world {world} / local {k.shape[2]}")
    if not any(lengths):
        raise ValueError("ring attention needs at least one key on some rank")
    nxt_rank, prv_rank = _peer(group, (rank + 1) % world), _peer(group, (rank - 1) % world)
    B, H, _, D = k.shape
    cur = torch.stack((k, v)).contiguous()          # one message per step: [2, B, H, L, D]
    acc = _Merged()
    for step in range(world):
        reqs = []
        nxt = None
        if step < world - 1:
            ops = []
            if cur.shape[3]:                        # empty shards are not sent (lengths are known)
                ops.append(dist.P2POp(dist.isend, cur, nxt_rank, group))
            n_len = lengths[(rank - step - 1) % world]
            if n_len:
                nxt = torch.empty((2, B, H, n_len, D), dtype=cur.dtype, device=cur.device)
                ops.append(dist.P2POp(dist.irecv, nxt, prv_rank, group))
            if ops:
                reqs = dist.batch_isend_irecv(ops)
        if cur.shape[3]:                            # compute while the next shard is in flight
            acc.add(*attention_lse(q, cur[0], cur[1], scale))
            if on_block is not None:
                on_block((rank - step) % world, cur)
        for r in reqs:
            r.wait()
        if nxt is None and step < world - 1:
            nxt = cur.new_empty((2, B, H, 0, D))
        cur = nxt
    return acc.result(q.dtype)


def ring_attention_bnhd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None,
                        scale: Optional[float] = None, lengths: Optional[Sequence[int]] = None) -> torch.Tensor:
    """`ring_attention` in the model's [B, L, H, D] layout (engine/models/layers.py)."""
    t = lambda x: x.transpose(1, 2)
    return t(ring_attention(t(q), t(k), t(v), group=group, scale=scale, lengths=lengths))


def split_lengths(total: int, parts: int) -> list[int]:
    """Near-even contiguous split of `total` items over `parts` ranks (earlier ranks take the extra)."""
    base, extra = divmod(int(total), int(parts))
    return [base + (1 if i < extra else 0) for i in range(parts)]
