"""The cuDNN split backend over an fp8 store on the CPU: the run read into 16-bit scratch, key
scales folded into q, value scales applied to the output (the kernels are CPU flash stand-ins for
cuDNN). Outputs must equal the SDPA backend's over the same fp8 store (which dequantises on
gather) through window filling, eviction, rollbacks, the special ring's growth and wrap, and whole
fixed-length steps. GPU checks of the real kernels: test_cudnn_fp8_gpu.py."""
import torch

from engine.kv.backends import SDPABackend
from engine.kv.cudnn_kernels import torch_flash_lse
from engine.kv.cudnn_split import CuDNNSplitBackend
from tests.engine.kv_pair import H, D, P, cache_pair, drive

PATTERN = "kknkkknkknknnkkkknknkk"      # fills, evicts, rolls back (interval 2), wraps the ring


def _drive_paths(cu, sd):
    paths = []
    for a, b, step, path in ((*r[:3], r[4]) for r in drive(cu, sd, PATTERN, attended=lambda c: c._attn.path)):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        paths.append(path)
        if path == "whole":
            assert step.fixed_length
    # the window fills on the fallback, then splits, then (ring full) whole steps
    assert paths[0] == "fallback" and "split" in paths and paths[-1] == "whole"
    be = cu._attn
    assert be.calls["split"] > 0 and be.calls["whole"] > 0 and be.error is None


def test_fp8_store_read_into_scratch_equals_sdpa_over_the_same_store():
    cu, sd = cache_pair(dtype="fp8", attn_dtype="fp32")
    seen = []

    def kernel_a(q, k, v):           # what cuDNN would get: 16-bit-style scratch, not the e4m3 bytes
        sk = cu._attn._scratch[0]          # the run's own rows of the scratch
        assert k.dtype == v.dtype == cu.attn_dtype
        assert sk.data_ptr() <= k.data_ptr() < sk.data_ptr() + sk.numel() * sk.element_size()
        seen.append(k.shape[0])
        return torch_flash_lse(q, k, v)
    cu._attn = be = CuDNNSplitBackend(cu, kernel_a=kernel_a, kernel_full=lambda q, k, v: torch_flash_lse(q, k, v)[0],
                                      fallback=SDPABackend.create(cu))
    assert be.fp8 and be._ok and "fp8 store" in be.kernel
    _drive_paths(cu, sd)
    assert len(set(seen)) == 1                               # part A: one constant shape
    assert be._scratch[0].shape == (cu.pool.num_pages * P, H, D)   # allocated once, whole capacity
