"""torch.compile of the transformer blocks' two halves (opt-in, measured, not the default).

Outside attention a streamed LingBot-Map frame spends much of its kernel time in
LayerNorms, dtype casts, LayerScale residual adds and RoPE -- dozens of small kernels per block,
because the residual stream stays float32 while the matmuls run in bf16 (docs/benchmarks.md).
Inductor fuses them. `compile_blocks(model)` puts every `Block.attn_pre` (norm1, qkv, qk-norm,
RoPE) and `Block.attn_post` (proj, LayerScale residual, norm2, MLP, residual) of the trunk under
`torch.compile` (default mode: no CUDA graphs of its own, so engine/models/graphs.py still
captures the compiled kernels); attention itself stays outside (SDPA, or the KV cache's backend).
Blocks of one shape share compiled code (~10 graphs for the whole model, compiled on first use:
tens of seconds).

Its outputs equal the eager path's on the GPU (tests/engine/test_compile_blocks.py); speed against
the default session: docs/history/benchmarks_h200_issue11.md. Not the default because of the
compile at the first frames.
Switch: the typed setting `compile_blocks` (`--compile-blocks`, the settings panel), for a
LingBot-Map session on CUDA (engine/lingbot/session.py).
"""
from __future__ import annotations

_ATTRS = ("attn_pre", "attn_post")


def _blocks(model):
    """The trunk's blocks (patch embed, frame, global)."""
    agg = model.aggregator
    return (*agg.patch_embed.blocks, *agg.frame_blocks, *agg.global_blocks)


def compile_blocks(model, backend: str = "inductor") -> int:
    """Every trunk Block's attn_pre / attn_post through torch.compile (idempotent); returns how
    many functions are compiled. `backend`: torch.compile's ("aot_eager" for CPU tests)."""
    import torch
    import torch._dynamo
    # blocks of one shape share code; the limit guards against recompiling per instance
    torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
    n = 0
    for blk in _blocks(model):
        for name in _ATTRS:
            if name not in vars(blk):               # not compiled yet
                setattr(blk, name, torch.compile(getattr(blk, name), dynamic=False, backend=backend))
            n += 1
    return n


def uncompile_blocks(model) -> None:
    """Back to the plain methods."""
    for blk in _blocks(model):
        for name in _ATTRS:
            vars(blk).pop(name, None)


def blocks_compiled(model) -> bool:
    return any(name in vars(blk) for blk in _blocks(model) for name in _ATTRS)
