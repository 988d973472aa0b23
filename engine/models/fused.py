"""Fused elementwise kernels of the transformer blocks (Triton; CUDA only).

A streamed LingBot-Map frame runs 72 ViT-L blocks (24 patch-embed, 24 frame, 24 global) on ~1,000
tokens. Around their matmuls each block launched ~18 small elementwise kernels (LayerNorm, dtype
casts, qk-norm, the RoPE products, the LayerScale residuals), each a full pass over its tensor
-- milliseconds of GPU time a frame (docs/benchmarks.md), which `torch.compile` fuses
only after a compile of tens of seconds (engine/models/compile.py). These kernels fuse the same
chains by hand and compile in about a second on first use:

- `layer_norm_cast`: LayerNorm of the float32 residual stream, written in the matmul dtype
  (norm1, and norm2 inside the next one);
- `residual_layer_norm`: x + y * gamma (the LayerScale residual, float32) and LayerNorm of the
  result in the matmul dtype, one pass (attn_post's first residual + norm2);
- `qk_norm_rope`: qk-norm (LayerNorm over the head dim) and the rotary embedding of q and k
  together, read from the fused qkv projection's strided views, written contiguous;
- `residual`: the block's last LayerScale residual (float32 x + bf16 y * gamma), which PyTorch
  runs through its slow mixed-dtype loop;
- `merge_lse`: the cuDNN split's merge of two attention partials by their log-sum-exp
  (engine/kv/cudnn_kernels.py), one pass instead of six kernels.
`gelu_epilogue_usable` decides the MLP's fc1 + GELU in cuBLASLt's epilogue (engine/models/layers.py).

All arithmetic is float32 with one rounding at the store, so results equal the unfused path to
the matmul dtype's rounding (the unfused path rounds after each op). `Block.attn_pre` /
`attn_post` (engine/models/layers.py) take these when `usable` says so: CUDA tensors, Triton
importable, float32 residual stream, not inside a torch.compile trace. Tests: tests/engine/test_fused_gpu.py (GPU), test_fused.py.
"""
from __future__ import annotations

import torch

try:                                    # the CPU build of PyTorch ships no Triton
    import triton
    import triton.language as tl
except ImportError:                     # pragma: no cover - depends on the install
    triton = None


error = None     # why the kernels stopped (a failed first compile or launch): plain ops from then on


def _guarded(fn):
    """A kernel wrapper that returns None instead of raising -- and switches the kernels off for
    the process, recording `error` -- so a Triton that cannot build them costs speed, not the
    session. Inside a CUDA-graph capture the exception propagates (the capture has failed anyway)."""
    def call(*args, **kwargs):
        global error
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise
            error = f"{type(exc).__name__}: {exc}"[:500]
            return None
    call.__name__, call.__doc__ = fn.__name__, fn.__doc__
    return call


def _pow2(v: int) -> bool:
    return v & (v - 1) == 0


def plain_weight(w: torch.Tensor) -> bool:
    """A dense weight, not a tensor subclass: torchao's quantized weights (weight_dtype int8 /
    fp8, engine/weight_quant.py) report the compute dtype but implement only what `F.linear`
    calls, not the raw matmul ops (`t`, `_addmm_activation`) of the fused epilogue."""
    return type(w) in (torch.Tensor, torch.nn.Parameter)


def gelu_epilogue_usable(x: torch.Tensor, fc1) -> bool:
    """A CUDA bf16/fp16 MLP input with a biased, dense fc1 of the same dtype takes cuBLASLt's fused
    matmul + bias + GELU epilogue (its GELU is the tanh form, which barely moves the bf16 pose
    error against fp32: docs/benchmarks.md). Float32 (the conformance path) keeps the exact GELU."""
    return (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and fc1.bias is not None
            and fc1.weight.dtype == x.dtype and plain_weight(fc1.weight))


def usable(x: torch.Tensor, block) -> bool:
    """The fused kernels apply to this block call: see the module docstring."""
    if triton is None or error is not None or not x.is_cuda or x.dtype != torch.float32:
        return False
    if torch.compiler.is_compiling():
        return False
    w = block.attn.qkv.weight
    if any(t is None for t in (block.norm1.weight, block.norm1.bias, block.norm2.weight, block.norm2.bias)):
        return False
    return (w.dtype in (torch.bfloat16, torch.float16) and block.norm1.weight.dtype == torch.float32
            and block.norm2.weight.dtype == torch.float32 and block.ls1.gamma.dtype == torch.float32
            and x.shape[-1] <= 8192)


if triton is not None:
    @triton.jit
    def _ln_row(x, m, W, B, cols, C, eps):
        """LayerNorm of one row x (float32, lanes past C masked by m) with weight W, bias B."""
        mean = tl.sum(x, axis=0) / C
        d = tl.where(m, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / C + eps)
        w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
        b = tl.load(B + cols, mask=m, other=0.0).to(tl.float32)
        return d * rstd * w + b

    @triton.jit
    def _ln_cast_kernel(X, W, B, Y, C, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        m = cols < C
        x = tl.load(X + row * C + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(Y + row * C + cols, _ln_row(x, m, W, B, cols, C, eps).to(Y.dtype.element_ty), mask=m)

    @triton.jit
    def _residual_row(X, R, G, XO, row, cols, m, C):
        """x + r * gamma of one row (float32 x, any-dtype r), stored to XO and returned."""
        x = tl.load(X + row * C + cols, mask=m, other=0.0)
        r = tl.load(R + row * C + cols, mask=m, other=0.0).to(tl.float32)
        x = x + r * tl.load(G + cols, mask=m, other=0.0)
        tl.store(XO + row * C + cols, x, mask=m)
        return x

    @triton.jit
    def _residual_ln_kernel(X, R, G, W, B, XO, Y, C, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        m = cols < C
        x = _residual_row(X, R, G, XO, row, cols, m, C)
        tl.store(Y + row * C + cols, _ln_row(x, m, W, B, cols, C, eps).to(Y.dtype.element_ty), mask=m)

    @triton.jit
    def _residual_kernel(X, R, G, XO, C, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        _residual_row(X, R, G, XO, row, cols, cols < C, C)

    @triton.jit
    def _merge_lse_kernel(OA, LA, OB, LB, O, sa_n, sa_h, sb_n, sb_h, la_h, lb_h,
                          H: tl.constexpr, D: tl.constexpr):
        # one program per query token: its H x D block of both partial results
        i = tl.program_id(0).to(tl.int64)
        h = tl.arange(0, H)
        d = tl.arange(0, D)[None, :]
        hh = h[:, None]
        a = tl.load(OA + i * sa_n + hh * sa_h + d).to(tl.float32)
        b = tl.load(OB + i * sb_n + hh * sb_h + d).to(tl.float32)
        w = tl.sigmoid(tl.load(LB + h * lb_h + i) - tl.load(LA + h * la_h + i))[:, None]
        tl.store(O + i * (H * D) + hh * D + d, (a + (b - a) * w).to(O.dtype.element_ty))

    @triton.jit
    def _pick(A, B, which, idx):
        """A[idx] for q (which 0), B[idx] for k, as float32."""
        if which == 0:
            v = tl.load(A + idx)
        else:
            v = tl.load(B + idx)
        return v.to(tl.float32)

    @triton.jit
    def _qk_norm_rope_kernel(QKV, WQ, BQ, WK, BK, COS, SIN, OQ, OK,
                             N, s_b, s_n, s_which, cos_b, eps,
                             H: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr,
                             INTERLEAVED: tl.constexpr, HALF: tl.constexpr):
        # one program per (frame b, token n, q or k): its H x D block
        pid = tl.program_id(0).to(tl.int64)
        which = tl.program_id(1)
        b = pid // N
        n = pid % N
        h = tl.arange(0, H)[:, None]
        d = tl.arange(0, D)[None, :]
        base = QKV + b * s_b + n * s_n + which * s_which
        x = tl.load(base + h * D + d).to(tl.float32)
        w = _pick(WQ, WK, which, d)
        bb = _pick(BQ, BK, which, d)
        mean = tl.sum(x, axis=1)[:, None] / D
        xc = x - mean
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1)[:, None] / D + eps)
        y = xc * rstd * w + bb
        if ROPE:
            # the pair partner of feature d: d ^ 1 (interleaved), else the other half of its chunk
            if INTERLEAVED:
                p = d ^ 1
            else:
                p = (d // (2 * HALF)) * (2 * HALF) + (d % (2 * HALF) + HALF) % (2 * HALF)
            xp = tl.load(base + h * D + p).to(tl.float32)
            yp = (xp - mean) * rstd * _pick(WQ, WK, which, p) + _pick(BQ, BK, which, p)
            trow = (b * cos_b + n) * D
            c = tl.load(COS + trow + d).to(tl.float32)
            s = tl.load(SIN + trow + d).to(tl.float32)
            y = y * c + yp * s
        if which == 0:
            tl.store(OQ + pid * (H * D) + h * D + d, y.to(OQ.dtype.element_ty))
        else:
            tl.store(OK + pid * (H * D) + h * D + d, y.to(OK.dtype.element_ty))


def _block(c: int) -> int:
    return triton.next_power_of_2(c)


def _warps(block: int) -> int:
    return 4 if block <= 2048 else 8


@_guarded
def layer_norm_cast(x: torch.Tensor, norm: torch.nn.LayerNorm, dtype: torch.dtype) -> torch.Tensor:
    """`norm(x).to(dtype)` for a contiguous float32 x [..., C], one pass (None: see `_guarded`)."""
    C = x.shape[-1]
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=dtype, device=x.device)
    rows = x.numel() // C
    bl = _block(C)
    _ln_cast_kernel[(rows,)](x, norm.weight, norm.bias, y, C, norm.eps, BLOCK=bl, num_warps=_warps(bl))
    return y


@_guarded
def residual_layer_norm(x: torch.Tensor, r: torch.Tensor, gamma: torch.Tensor, norm: torch.nn.LayerNorm,
                        dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + r * gamma, norm(x + r * gamma).to(dtype)) for float32 x [..., C], r of x's shape in
    any float dtype, gamma [C] float32 -- `torch.addcmul(x, r, gamma)` and the norm in one pass
    (None: see `_guarded`)."""
    C = x.shape[-1]
    x, r = x.contiguous(), r.contiguous()
    xo = torch.empty_like(x)
    y = torch.empty(x.shape, dtype=dtype, device=x.device)
    bl = _block(C)
    _residual_ln_kernel[(x.numel() // C,)](x, r, gamma, norm.weight, norm.bias, xo, y, C, norm.eps,
                                           BLOCK=bl, num_warps=_warps(bl))
    return xo, y


@_guarded
def residual(x: torch.Tensor, r: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """`torch.addcmul(x, r, gamma)` for float32 x [..., C], r of x's shape in a 16-bit dtype,
    gamma [C] float32, one vectorised pass (PyTorch's mixed-dtype addcmul takes its slow strided
    loop; None: see `_guarded`)."""
    C = x.shape[-1]
    x, r = x.contiguous(), r.contiguous()
    xo = torch.empty_like(x)
    bl = _block(C)
    _residual_kernel[(x.numel() // C,)](x, r, gamma, xo, C, BLOCK=bl, num_warps=_warps(bl))
    return xo


def merge_usable(out_a: torch.Tensor, lse_a: torch.Tensor) -> bool:
    """`merge_lse` applies: CUDA, Triton, not switched off, out [n, H, D] with H, D powers of two
    and D dense, lse [H, n] float32 with its token axis dense."""
    if triton is None or error is not None or not out_a.is_cuda:
        return False
    n, H, D = out_a.shape
    return (_pow2(H) and _pow2(D) and H * D <= 8192 and out_a.stride(-1) == 1 and lse_a.dtype == torch.float32
            and lse_a.stride(-1) == 1 and not torch.compiler.is_compiling())


@_guarded
def merge_lse(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """out_a + (out_b - out_a) * sigmoid(lse_b - lse_a) in float32, written contiguous in out_a's
    dtype: two attention partials over disjoint key sets merged by their log-sum-exp
    (engine/kv/cudnn_kernels.py `merge_lse`) in one pass instead of six kernels (None: see `_guarded`)."""
    n, H, D = out_a.shape
    if out_b.stride(-1) != 1 or lse_b.stride(-1) != 1:
        out_b, lse_b = out_b.contiguous(), lse_b.contiguous()
    out = torch.empty((n, H, D), dtype=out_a.dtype, device=out_a.device)
    _merge_lse_kernel[(n,)](out_a, lse_a, out_b, lse_b, out, out_a.stride(0), out_a.stride(1),
                            out_b.stride(0), out_b.stride(1), lse_a.stride(0), lse_b.stride(0),
                            H=H, D=D, num_warps=4)
    return out


def qk_usable(qkv: torch.Tensor, q_norm, rope) -> bool:
    """`qk_norm_rope` applies to this call (CUDA, Triton, a 16-bit projection, layouts as
    `qk_norm_rope_ok`, not inside a torch.compile trace, not switched off)."""
    return (triton is not None and error is None and qkv.is_cuda and qkv.dtype in (torch.bfloat16, torch.float16)
            and not torch.compiler.is_compiling() and q_norm.weight is not None
            and q_norm.bias is not None
            and qk_norm_rope_ok(qkv, rope))


def qk_norm_rope_ok(qkv: torch.Tensor, rope) -> bool:
    """The fused qk path applies: qkv [B, N, 3, H, D] with D and H powers of two and the innermost
    (H, D) block dense; a rotation (engine/models/rope.py `Rotation`) with cos/sin [1 | B, N, 1, D]."""
    B, N, three, H, D = qkv.shape
    if three != 3 or not (_pow2(H) and _pow2(D)) or qkv.stride(-1) != 1 or qkv.stride(-2) != D:
        return False
    if qkv.stride(2) != H * D:
        return False
    if rope is None:
        return True
    cos, sin = rope.cos, rope.sin
    return (cos.shape[1:] == (N, 1, D) and cos.shape[0] in (1, B) and sin.shape == cos.shape
            and cos.is_contiguous() and sin.is_contiguous() and (rope.interleaved or D % (2 * rope.chunks) == 0))


@_guarded
def qk_norm_rope(qkv: torch.Tensor, q_norm, k_norm, rope) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k = rope(q_norm(q)), rope(k_norm(k)) from the fused projection qkv [B, N, 3, H, D] (its
    q and k parts), both contiguous [B, N, H, D] in qkv's dtype; one launch for both (None: see
    `_guarded`)."""
    B, N, _, H, D = qkv.shape
    oq = torch.empty((B, N, H, D), dtype=qkv.dtype, device=qkv.device)
    ok = torch.empty_like(oq)
    if rope is None:
        cos = sin = oq          # unused
        cos_b, interleaved, half = 0, True, 1
    else:
        cos, sin = rope.cos, rope.sin
        cos_b = N if cos.shape[0] > 1 else 0
        interleaved = bool(rope.interleaved)
        half = 1 if interleaved else D // (2 * rope.chunks)
    _qk_norm_rope_kernel[(B * N, 2)](qkv, q_norm.weight, q_norm.bias, k_norm.weight, k_norm.bias, cos, sin, oq, ok,
                                     N, qkv.stride(0), qkv.stride(1), qkv.stride(2), cos_b, q_norm.eps,
                                     H=H, D=D, ROPE=rope is not None, INTERLEAVED=interleaved, HALF=half,
                                     num_warps=4)
    return oq, ok
