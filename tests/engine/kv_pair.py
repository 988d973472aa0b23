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


def tiny_sessions_against_sdpa(monkeypatch, make_backend, frames: int = 14, special_cap: int = 5,
                               seed: int = 4, opened=None, closing=None, settings=None):
    """The tiny LingBot-Map model (CPU, fp32) over the same `frames` random frames twice -- scale 2,
    window 3, special cap `special_cap`, keyframe interval 2 (eviction, rollback, ring wrap) -- with
    SDPA and with backend "cudnn" resolved to `make_backend(cache)` (a stand-in under test, declared
    to run on the CPU in float32 -- the resolver chooses from declarations); checks
    the two runs' results equal (1e-5 / 1e-4) and returns the backend made, for the caller's checks.
    `opened(session)` / `closing(session)`: called for the "cudnn" session after it opens and
    before it closes. `settings`: further SessionConfig fields of both sessions (kv_compression...)."""
    import dataclasses

    import numpy as np
    import torch

    from engine import SessionConfig, open_session
    from engine.kv import resolve
    from engine.kv.cudnn import CuDNNBackend
    from engine.model_zoo import build_model
    from engine.models.recipe import fill_recipe

    made = {}

    class StandInCuDNN(CuDNNBackend):       # the cuDNN backend's store checks, the stand-in's instance
        support = dataclasses.replace(CuDNNBackend.support, devices=("cpu",), compute_dtypes=(torch.float32,),
                                      stores=("native", "fp8", "int8"))

        @classmethod
        def create(cls, cache):
            made["backend"] = make_backend(cache)
            return made["backend"]
    monkeypatch.setitem(resolve.BACKENDS, "cudnn", StandInCuDNN)
    model = fill_recipe(build_model("lingbot-map-tiny"))
    rng = np.random.default_rng(seed)
    frames = [rng.integers(0, 256, (60, 80, 3), dtype=np.uint8) for _ in range(frames)]
    outs = {}
    for backend in ("sdpa", "cudnn"):
        s = open_session(SessionConfig(engine="lingbot-map", model="lingbot-map-tiny", image_width=70,
                                       scale_frames=2, window=3, special_cap=special_cap, keyframe_interval=2,
                                       camera_iterations=2, backend=backend, **(settings or {})), model=model)
        if backend == "cudnn" and opened is not None:
            opened(s)
        outs[backend] = [r for f in frames for r in s.push(f)] + s.flush()
        if backend == "cudnn" and closing is not None:
            closing(s)
        s.close()
    a, b = outs["cudnn"], outs["sdpa"]
    assert len(a) == len(b) == len(frames)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.pose_enc, y.pose_enc, atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(x.depth, y.depth, atol=1e-5, rtol=1e-4)
    return made["backend"]
