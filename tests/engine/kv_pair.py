"""Two paged caches driven through identical streamed steps -- a backend under test against a
reference -- the one loop of the cuDNN backend tests (test_cudnn_backend, test_cudnn_seqlen,
test_cudnn_split), with their shared tiny geometry."""
import torch

from engine.kv import PagedKVCache

L, H, D, P, S6 = 2, 2, 8, 5, 3           # tiny frames: 5 patch tokens + 3 specials
KW = dict(scale_frames=2, window=3, special_cap=6)
PATTERN = "kknkkknkkkknnkkkkk"          # fills the window, evicts, rolls back, wraps the special ring


def drive(a, b, pattern, seed=0, dtype=torch.float32, planned=None, attended=None):
    """A scale step of 2 frames, then one frame per letter of `pattern` (k keyframe, n not), with the
    same random k / v / q through caches `a` and `b`. Yields (outputs of a, outputs of b, a's step,
    planned(a) read right after a's begin_step, attended(a) read after a's attends)."""
    g = torch.Generator().manual_seed(seed)
    page = a.page_size
    for nf, scale, key in [(2, True, True)] + [(1, False, c == "k") for c in pattern]:
        k, v, q = (torch.randn(L, nf, S6 + page, H, D, generator=g).to(dtype) for _ in range(3))
        outs = []
        for c in (a, b):
            step = c.begin_step(nf, scale=scale, keyframe=key)
            if c is a:
                st, plan = step, planned(a) if planned else None
            outs.append([(c.write(i, k[i], v[i]), c.attend(i, q[i]))[1] for i in range(L)])
            if c is a:
                seen = attended(a) if attended else None
            c.end_step()
        yield outs[0], outs[1], st, plan, seen


def cache_pair(page=P, garbage=False, dtype=torch.float32, **kw):
    """Two caches of the same settings (KW overridden by `kw`), both on SDPA; the caller gives the
    first its backend under test. `garbage`: the first pool holds NaN (uninitialised memory may)."""
    kw = dict(KW, dtype=dtype, **kw)
    a, b = (PagedKVCache(L, H, D, page, special_tokens=S6, backend="sdpa", **kw) for _ in range(2))
    if garbage:
        a.pool.k.fill_(float("nan"))
        a.pool.v.fill_(float("nan"))
    return a, b


def drive_paths(a, b, pattern, seed=0, dtype=torch.float32):
    """`drive` yielding (outputs of a, outputs of b, a's step, the path a's backend took)."""
    for oa, ob, st, _, path in drive(a, b, pattern, seed, dtype, attended=lambda c: c._attn.path):
        yield oa, ob, st, path
