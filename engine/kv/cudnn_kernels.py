"""Attention kernels the cuDNN backends call (engine/kv/cudnn.py, engine/kv/cudnn_split.py):
PyTorch's cuDNN and flash attention with their log-sum-exp, the exact merge of two attention
partials, the wave tail's chunked form, and cuDNN's fused attention built through the cuDNN
frontend with the visible length on the device (`CuDNNFrontendKernel`). Plain functions over
[tokens, H, D] tensors: no cache, no page tables.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch
import torch.nn.functional as F

from ..models import fused
from ..models.layers import CUDNN_Q_TILE
from .page_table import KVCacheError

# Additive bias of a hidden key. Finite on purpose: a fixed-capacity call has whole KV tiles that
# are hidden (page 0 of a keyframe step, free pages), and an online softmax whose running max is
# still -inf computes exp(-inf - -inf) = NaN unless the kernel guards it; PyTorch's own bool-mask
# conversion for cuDNN uses -65504 for the same reason. exp(score - 65504) is exactly 0 in fp32
# for any score this model produces, so the result equals attention over the visible keys only.
CUDNN_MASKED = -65504.0


def _cudnn_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """q [1, H, n, D], k / v [1, H, capacity, D], bias [1, 1, 1 | n, capacity] -> [1, H, n, D] through
    PyTorch's cuDNN SDPA kernel ONLY: asked for alone, an ineligible call raises ("No available
    kernel") instead of silently running another kernel (with a priority list it would fall back)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


# ------------------------------------------------------------------ cuDNN through its frontend
@functools.lru_cache(maxsize=1)
def _import_cudnn_frontend():
    """The cuDNN frontend's Python package (`import cudnn`, pip nvidia-cudnn-frontend), or why not.
    torch is imported first, so the frontend finds the libcudnn PyTorch already loaded."""
    try:
        import cudnn
        cudnn.backend_version()               # raises when no libcudnn could be loaded
        return cudnn, None
    except Exception as exc:  # ImportError, or no / an unusable libcudnn
        return None, f"{type(exc).__name__}: {exc}"


def cudnn_frontend_available() -> bool:
    return _import_cudnn_frontend()[0] is not None


_CUDNN_UID = {"q": 1, "k": 2, "v": 3, "o": 4, "seq_q": 5, "seq_kv": 6, "k_table": 7, "v_table": 8}


def _build_plans(cudnn, g) -> int:
    """Validate a described frontend graph and build its execution plan (the heuristics' first:
    A, else the fallback). Returns the workspace bytes the built plan needs."""
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return int(g.get_workspace_size())


class CuDNNFrontendKernel:
    """cuDNN's fused attention built through the cuDNN frontend's graph API, with the padding mask:
    the visible lengths are DEVICE tensors (`seq_q`, `seq_kv`, int32 [1, 1, 1, 1]) read by the
    kernel, so one built graph serves every visible length -- no rebuild per frame, no host sync.

    `__call__(q, k, v, seq_q, seq_kv, table=None)`: q [n, H, D] contiguous; dense: k / v
    [S, H, D] views (token stride H * D), keys 0 .. seq_kv - 1 attended; paged: k / v [N, P, H, D]
    (the layer's pool), `table` int32 [1, 1, N, 1] the visible pages in order, the first seq_kv
    tokens of their concatenation attended. Returns [n, H, D]. Graphs are built once per layout
    (q length, K/V shape and strides, paged or not) and kept; `builds` counts them. cuDNN's
    "composite" SDPA implementation, the heuristics' first plan."""

    def __init__(self, device):
        cudnn, err = _import_cudnn_frontend()
        if cudnn is None:
            raise KVCacheError(f"the cuDNN frontend is not available ({err})")
        self._cudnn = cudnn
        self.device = torch.device(device)
        self._handle = None
        self._graphs: dict = {}
        self._workspace = torch.empty(0, dtype=torch.uint8, device=self.device)
        self.builds = 0

    def _dtype(self, dt):
        c = self._cudnn.data_type
        if dt == torch.bfloat16:
            return c.BFLOAT16
        if dt == torch.float16:
            return c.HALF
        raise KVCacheError(f"cuDNN attention runs bf16/fp16, not {dt}")

    @staticmethod
    def paged_ok(page_size: int) -> bool:
        """cuDNN's paged attention takes power-of-two block sizes only (CUDNN_STATUS_BAD_PARAM
        "block size needs to be non-zero and a power of 2", cuDNN 9.19)."""
        return page_size > 0 and page_size & (page_size - 1) == 0

    def _build(self, q, k, table):
        cudnn = self._cudnn
        if self._handle is None:
            with torch.cuda.device(self.device):
                self._handle = cudnn.create_handle()
        n, H, D = q.shape
        io = self._dtype(q.dtype)
        g = cudnn.pygraph(handle=self._handle, name="reconstudio_sdpa", io_data_type=io,
                          intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT)
        qt = g.tensor(name="q", dim=[1, H, n, D], stride=[n * H * D, D, H * D, 1], data_type=io)
        if table is None:                       # [S, H, D] as cuDNN's [1, H, S, D]
            S = k.shape[0]
            kv_dim, kv_stride = [1, H, S, D], [S * k.stride(0), k.stride(1), k.stride(0), k.stride(2)]
        else:                                   # [N, P, H, D] pages as cuDNN's [N, H, P, D]
            N, P = k.shape[:2]
            kv_dim, kv_stride = [N, H, P, D], [k.stride(0), k.stride(2), k.stride(1), k.stride(3)]
        kt = g.tensor(name="k", dim=kv_dim, stride=kv_stride, data_type=io)
        vt = g.tensor(name="v", dim=kv_dim, stride=kv_stride, data_type=io)
        i32 = cudnn.data_type.INT32
        sq = g.tensor(name="seq_q", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=i32)
        skv = g.tensor(name="seq_kv", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=i32)
        extra = dict(use_padding_mask=True, seq_len_q=sq, seq_len_kv=skv)
        named = {"q": qt, "k": kt, "v": vt, "seq_q": sq, "seq_kv": skv}
        if table is not None:
            N = table.shape[2]
            for name in ("k_table", "v_table"):
                named[name] = g.tensor(name=name, dim=[1, 1, N, 1], stride=[N, 1, 1, 1], data_type=i32)
            extra.update(paged_attention_k_table=named["k_table"], paged_attention_v_table=named["v_table"],
                         paged_attention_max_seq_len_kv=N * k.shape[1])
        o, _ = g.sdpa(name="sdpa", q=qt, k=kt, v=vt, attn_scale=1.0 / math.sqrt(D), generate_stats=False,
                      implementation=cudnn.attention_implementation.COMPOSITE,
                      compute_data_type=cudnn.data_type.FLOAT, **extra)
        o.set_output(True).set_dim([1, H, n, D]).set_stride([n * H * D, D, H * D, 1]).set_data_type(io)
        named["o"] = o
        for name, t in named.items():
            t.set_uid(_CUDNN_UID[name])
        ws = _build_plans(cudnn, g)
        if ws > self._workspace.numel():
            self._workspace = torch.empty(ws, dtype=torch.uint8, device=self.device)
        self.builds += 1
        return g

    def __call__(self, q, k, v, seq_q, seq_kv, table=None):
        key = (tuple(q.shape), q.dtype, tuple(k.shape), k.stride(), v.stride(), table is not None)
        g = self._graphs.get(key)
        if g is None:
            g = self._graphs[key] = self._build(q, k, table)
        out = torch.empty_like(q)
        ptrs = {_CUDNN_UID["q"]: q.data_ptr(), _CUDNN_UID["k"]: k.data_ptr(), _CUDNN_UID["v"]: v.data_ptr(),
                _CUDNN_UID["o"]: out.data_ptr(), _CUDNN_UID["seq_q"]: seq_q.data_ptr(),
                _CUDNN_UID["seq_kv"]: seq_kv.data_ptr()}
        if table is not None:
            ptrs[_CUDNN_UID["k_table"]] = ptrs[_CUDNN_UID["v_table"]] = table.data_ptr()
        self._cudnn.set_stream(self._handle, torch.cuda.current_stream(self.device).cuda_stream)
        g._execute(ptrs, self._workspace.data_ptr(), self._handle)
        return out


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).unsqueeze(0)              # [L, H, D] -> [1, H, L, D] (a view)


def torch_cudnn_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """PyTorch's cuDNN SDPA (no mask) over exactly k / v [S, H, D] -> (out [n, H, D], lse [H, n]
    float32, natural log). PyTorch keys its cuDNN graph cache by shapes and strides: a fixed-length
    K/V run costs one build for good."""
    n, H, _ = q.shape
    res = torch.ops.aten._scaled_dot_product_cudnn_attention(_bhsd(q), _bhsd(k), _bhsd(v), None, True)
    return res[0][0].transpose(0, 1), res[1].reshape(H, -1)[:, :n].float()


def torch_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """PyTorch's cuDNN SDPA (no mask, no log-sum-exp: its fastest form, below the form with
    statistics) over exactly k / v [S, H, D] -> out [n, H, D]."""
    res = torch.ops.aten._scaled_dot_product_cudnn_attention(_bhsd(q), _bhsd(k), _bhsd(v), None, False)
    return res[0][0].transpose(0, 1)


def torch_flash_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """PyTorch's flash attention (no per-shape set-up: any K/V length) over k / v [S, H, D] ->
    (out [n, H, D], lse [H, n] float32, natural log). On the CPU its CPU flash kernel (tests)."""
    n, H, _ = q.shape
    if q.device.type == "cuda":
        res = torch.ops.aten._scaled_dot_product_flash_attention(_bhsd(q), _bhsd(k), _bhsd(v))
    else:
        res = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(_bhsd(q), _bhsd(k), _bhsd(v))
    return res[0][0].transpose(0, 1), res[1].reshape(H, -1)[:, :n].float()


def torch_flash_varlen_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                           cu_k: torch.Tensor):
    """PyTorch's flash attention (varlen) of q [n, H, D] over the FIRST cu_k[1] keys of the fixed
    view k / v [cap, H, D] -> (out [n, H, D], lse [H, n] float32). The length is read by the kernel
    from the int32 device tensor cu_k = [0, length] (cu_q = [0, n]), so nothing depends on it on
    the host: one CUDA graph serves every length (the split's static steps)."""
    n, H, _ = q.shape
    res = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, n, k.shape[0], 0.0, False, False)
    return res[0], res[1].reshape(H, -1)[:, :n].float()


def tail_chunks(tail_rows: int, heads: int, sms: Optional[int], keys: int, tile: int = CUDNN_Q_TILE,
                min_keys: int = 1024) -> int:
    """How many key chunks the wave tail's queries are attended in (`chunked_lse`): enough that
    chunks x heads x ceil(rows / tile) work tiles fill the SMs once, each chunk >= `min_keys`."""
    tiles = heads * -(-tail_rows // tile)
    n = max(1, min((sms or tiles) // tiles, keys // min_keys))
    return -(-keys // -(-keys // n))       # runs of ceil(keys / n): none of them empty


def even_chunks(keys: int, most: int, min_keys: int = 1024) -> int:
    """The largest chunk count <= `most` that cuts `keys` into EQUAL runs of >= `min_keys` (what
    `chunked_lse`'s cuDNN form needs: the chunks as one strided batch view); 1 if none."""
    return max([n for n in range(1, max(1, most) + 1) if keys % n == 0 and keys // n >= min_keys] or [1])


def chunked_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunks: int, bounds=None,
                kernel: str = "flash"):
    """Attention of a few query rows q [t, H, D] over MANY keys k / v [L, H, D] -> (out, lse [H, t]
    float32), the keys cut into `chunks` contiguous runs attended in parallel and merged by their
    log-sum-exp. Why: t rows are one work tile a head, so a single call would run `heads` CTAs
    through all L keys one after another (the wave tail of `CuDNNSplitBackend`); chunked, the same
    work spreads over chunks x heads CTAs. On CUDA one varlen flash call (the q rows repeated per
    chunk, the chunks zero-copy slices of k / v, `bounds` = (cu_q, cu_k) int32 device tensors from
    `chunk_bounds`), or with kernel "cudnn" one batched cuDNN call (equal chunks, `even_chunks`:
    the batch a strided view of k / v); elsewhere a loop of `torch_flash_lse` (the CPU tests)."""
    t, H, D = q.shape
    L = k.shape[0]
    c = -(-L // chunks)                                                    # keys a chunk (the last: fewer)
    assert (chunks - 1) * c < L, "an empty key chunk (tail_chunks picks the count)"
    if q.device.type == "cuda" and kernel == "cudnn":
        assert L % chunks == 0, "the cuDNN form takes equal chunks (even_chunks picks the count)"
        kc, vc = (x.view(chunks, L // chunks, H, D).transpose(1, 2) for x in (k, v))   # [C, H, c, D]
        qc = q.repeat(chunks, 1, 1).view(chunks, t, H, D).transpose(1, 2)
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(qc, kc, vc, None, True)
        out = res[0].transpose(1, 2)                                       # [chunks, t, H, D]
        lse = res[1].reshape(chunks, H, -1)[:, :, :t].float()
    elif q.device.type == "cuda":
        cu_q, cu_k = bounds if bounds is not None else chunk_bounds(t, L, chunks, q.device)
        res = torch.ops.aten._flash_attention_forward(q.repeat(chunks, 1, 1), k, v, cu_q, cu_k, t, c,
                                                      0.0, False, False)
        out = res[0].view(chunks, t, H, -1)
        lse = res[1]
        # PyTorch's varlen flash returns the statistics unpadded [H, chunks * t] (or padded
        # [chunks, H, >= t] in older flash builds): both read as [chunks, H, t]
        lse = (lse.view(H, chunks, t).transpose(0, 1) if lse.dim() == 2 else lse[:, :, :t]).float()
    else:
        parts = [torch_flash_lse(q, k[i * c:(i + 1) * c], v[i * c:(i + 1) * c]) for i in range(chunks)]
        out = torch.stack([o for o, _ in parts])                           # [chunks, t, H, D]
        lse = torch.stack([s for _, s in parts])                           # [chunks, H, t]
    total = torch.logsumexp(lse, dim=0)                                    # [H, t]
    w = torch.exp(lse - total).transpose(1, 2).unsqueeze(-1)               # [chunks, t, H, 1]
    return (out.float() * w).sum(dim=0).to(q.dtype), total


def chunk_bounds(rows: int, keys: int, chunks: int, device):
    """(cu_q, cu_k) int32 device tensors of `chunked_lse`'s varlen call: `chunks` copies of `rows`
    query rows, and `keys` cut into runs of ceil(keys / chunks) (the last one shorter). Built by
    device kernels only (no host copy: safe while a CUDA graph captures)."""
    i = torch.arange(chunks + 1, device=device, dtype=torch.int32)
    c = -(-keys // chunks)
    return i * rows, torch.clamp(i * c, max=keys)


def masked_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor):
    """`torch_flash_varlen_lse` in plain float32 math (the CPU and tests): the keys at or past
    cu_k[1] masked on the device, no host read of the length."""
    qf, kf, vf = (x.float().transpose(0, 1) for x in (q, k, v))                  # [H, ., D]
    s = (qf @ kf.transpose(1, 2)) * q.shape[-1] ** -0.5
    hidden = torch.arange(k.shape[0], device=k.device) >= cu_k[1]
    s = s.masked_fill(hidden, float("-inf"))
    # the slots past the length are unwritten pool memory: a NaN there would survive 0 * NaN
    vf = vf.masked_fill(hidden[None, :, None], 0.0)
    lse = torch.logsumexp(s, dim=-1)                                               # [H, n]
    out = torch.softmax(s, dim=-1) @ vf
    return out.transpose(0, 1).to(q.dtype), lse


def merge_lse(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over the union of two disjoint key sets from each set's result and log-sum-exp:
    (out_a e^lse_a + out_b e^lse_b) / (e^lse_a + e^lse_b) = out_a + (out_b - out_a) sigmoid(lse_b - lse_a),
    in float32, cast back to out_a's dtype. Exact up to rounding; out_* [n, H, D], lse_* [H, n]."""
    if fused.merge_usable(out_a, lse_a):
        out = fused.merge_lse(out_a, lse_a, out_b, lse_b)              # one Triton pass on CUDA
        if out is not None:
            return out
    w = torch.sigmoid(lse_b - lse_a).t().unsqueeze(-1)                 # [n, H, 1]
    return torch.lerp(out_a.float(), out_b.float(), w).to(out_a.dtype)
