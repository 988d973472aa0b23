"""Multi-process / multi-GPU parts of the engine (no Qt): ring attention over a torch.distributed
group (ring_attention.py) and the sequence-parallel LingBot-Map scale phase (lingbot_ring.py)."""
from .ring_attention import (  # noqa: F401
    attention_lse,
    blockwise_attention,
    ring_attention,
    ring_attention_bnhd,
    shard_lengths,
    split_lengths,
)

__all__ = ["attention_lse", "blockwise_attention", "ring_attention", "ring_attention_bnhd",
           "shard_lengths", "split_lengths"]
