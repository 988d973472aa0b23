"""engine/host_copy.py: outputs reach the host in order, tagged, `keep` newest in flight; on CUDA
(skipped without it) the copies survive the outputs being overwritten right after `submit` (as
CUDA-graph outputs are by the next replay) and a submit beyond the slots finishes the oldest."""
import numpy as np
import pytest
import torch

from engine.host_copy import HostCopies


def test_cpu_results_in_order_with_keep():
    hc = HostCopies("cpu")
    for i in range(3):
        hc.submit({"a": torch.full((2, 3), float(i)), "b": torch.tensor([i], dtype=torch.bfloat16)}, tag=i)
    assert len(hc) == 3
    first = hc.take(keep=1)
    assert [t for t, _ in first] == [0, 1] and len(hc) == 1
    assert first[1][1]["a"].dtype == np.float32 and np.all(first[1][1]["a"] == 1.0)
    assert first[1][1]["b"].dtype == np.float32 and first[1][1]["b"][0] == 1.0
    assert [t for t, _ in hc.take()] == [2] and hc.take() == []


def test_slots_must_be_positive():
    with pytest.raises(ValueError):
        HostCopies("cpu", slots=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_copies_are_isolated_from_later_writes():
    hc = HostCopies("cuda", slots=2)
    src = torch.empty(378, 518, device="cuda")
    want, got = [], []
    for i in range(7):
        src.normal_()
        want.append(src.cpu().numpy())
        torch.cuda._sleep(200_000)                  # keep the GPU busy: the host runs ahead
        hc.submit({"depth": src, "pose": src[:1, :9] * 2}, tag=i)
        src.fill_(-1.0)                             # as the next graph replay would
        if i % 3 == 2:                              # sometimes three submits before a take
            continue
        got += [(t, {k: a.copy() for k, a in d.items()}) for t, d in hc.take(keep=1)]
    got += hc.take()
    assert [t for t, _ in got] == list(range(7))
    for (t, d), w in zip(got, want):
        np.testing.assert_array_equal(d["depth"], w)
        np.testing.assert_allclose(d["pose"], w[:1, :9] * 2, rtol=1e-6)


def test_upload_on_cpu_is_a_plain_tensor():
    from engine.host_copy import upload
    t = upload([3, 1, 2], "cpu", torch.int64)
    assert t.dtype == torch.int64 and t.tolist() == [3, 1, 2]
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    assert torch.equal(upload(a, "cpu", torch.float32), torch.arange(6.0).reshape(2, 3))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_upload_does_not_synchronize_and_arrives_intact():
    from engine.host_copy import upload
    torch.cuda._sleep(100_000_000)                  # GPU work queued ahead of the copies
    torch.cuda.set_sync_debug_mode("error")         # any synchronising call raises
    try:
        xs = [upload(list(range(i, i + 50)), "cuda", torch.int64) for i in range(20)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert all(x.tolist() == list(range(i, i + 50)) for i, x in enumerate(xs))
