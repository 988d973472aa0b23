"""Benchmarks of issue #13 on GPUs (figures go to docs/benchmarks.md).

    python -m benchmarks.parallel_bench --out DIR [--ring-frames 32,64,128,256] [--scale-sizes 8,32,64,128]
                                    [--streams 4] [--frames 40]

With 2+ GPUs it spawns 2 processes (one per GPU, NCCL; NVLink multicast stays off) and measures
1. ring attention alone: N frames x 1005 tokens (518x378), 16 heads x 64, bf16, one GPU (one
   fused flash-attention call) against the ring over 2 GPUs; outputs compared;
2. LingBot-Map's scale phase (full-size model, recipe-scaled random weights, bf16, SDPA) of S
   frames through a session: one GPU against `sequence_parallel="ring"` on 2 GPUs; pose/depth
   compared, peak memory per GPU;
3. a VGGT-1B chunk (recipe-scaled random weights, bf16 trunk, camera + depth heads, 518x392) of C
   frames that sees only itself (`sliding_window_num = 1`): one GPU against the chunk split over
   2 GPUs (engine/parallel/vggt_ring.py); time per chunk, peak memory per GPU, outputs compared,
   and the memory per frame from which the longest chunk that fits follows;
then on GPU 0 alone
0. (`--noise-floor`) the bf16 tolerance the ring's deviations are judged against: the same scale
   phase and VGGT chunk on one GPU in bf16 against fp32, with the same metrics as parts 2 and 3;
4. the stream scheduler at 518x378, for each of `--backends` (sdpa) and `--variants` (one: 1
   stream; batched: `--streams` batched; serial: `--streams` one at a time, max_batch 1; each
   with +streams = per-stream attention on CUDA side streams, +pipeline = results one round
   later): aggregate FPS over `--frames` streamed frames per stream against the `one` row, host
   time per round (prepare / launch / readback / results), memory per stream; `--breakdown` adds
   CUDA-event time per model section over 10 more rounds.
Writes DIR/parallel_bench.json and prints a summary. Needs CUDA.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
import torch

for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_k] = _v          # NVLink multicast must stay off on the shared hosts

W, H = 518, 378
TOKENS = 6 + (W // 14) * (H // 14)        # 1005 per frame
MODEL, DEV, HEADS, HEAD_DIM = "lingbot-map", "cuda", 16, 64
VGGT_MODEL, VGGT_HW = "vggt-1b", (392, 518)


def _smoke():
    """--smoke: the same code on the CPU (gloo, lingbot-map-tiny, 70x56), to check it runs."""
    global W, H, TOKENS, MODEL, DEV, HEADS, HEAD_DIM, VGGT_MODEL, VGGT_HW
    W, H, MODEL, DEV, HEADS, HEAD_DIM = 70, 56, "lingbot-map-tiny", "cpu", 4, 16
    VGGT_MODEL, VGGT_HW = "vggt-tiny", (56, 70)
    TOKENS = 6 + (W // 14) * (H // 14)


class _Mem:
    """torch.cuda memory counters; zeros on the CPU."""
    cuda = property(lambda self: DEV == "cuda")

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def allocated(self):
        return torch.cuda.memory_allocated() if self.cuda else 0

    def reset_peak(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def peak(self):
        return torch.cuda.max_memory_allocated() if self.cuda else 0

    def empty(self):
        if self.cuda:
            torch.cuda.empty_cache()


mem = _Mem()


def _sync_time(fn, reps: int = 3):
    fn()
    mem.sync()
    ts = []
    for _ in range(reps):
        mem.sync()
        t0 = time.perf_counter()
        fn()
        mem.sync()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def _model(device):
    from engine.models.recipe import random_init_
    from engine.model_zoo import build_model
    with torch.device(device):
        model = build_model(MODEL)
    random_init_(model, 0)
    return model


def _cfg(**kw):
    from engine.api import SessionConfig
    base = dict(engine="lingbot-map", device=DEV, dtype="bf16" if DEV == "cuda" else "fp32", backend="sdpa",
                image_width=W, model=MODEL)
    base.update(kw)
    return SessionConfig(**base)


def _frames(n, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (H, W, 3), dtype=np.uint8) for _ in range(n)]


def _ring_attention_part(rank, world, args, log):
    import torch.distributed as dist
    from engine.parallel.lingbot_ring import gather_frames
    from engine.parallel.ring_attention import attention_lse, ring_attention, split_lengths
    rows = []
    for n in args.ring_frames:
        L = n * TOKENS
        g = torch.Generator(device=DEV).manual_seed(n)
        dt = torch.bfloat16 if DEV == "cuda" else torch.float32
        q, k, v = (torch.randn(1, HEADS, L, HEAD_DIM, generator=g, device=DEV, dtype=dt) for _ in range(3))
        lens = split_lengths(L, world)
        a = sum(lens[:rank])
        sl = slice(a, a + lens[rank])
        ql, kl, vl = (x[:, :, sl].contiguous() for x in (q, k, v))
        row = {"frames": n, "tokens": L}
        if rank == 0:
            row["one_gpu_ms"] = _sync_time(lambda: attention_lse(q, k, v)) * 1e3
            ref = attention_lse(q, k, v)[0]
        dist.barrier()

        def ring():
            return ring_attention(ql, kl, vl, lengths=lens)
        out = ring()
        mem.sync()
        dist.barrier()
        ts = []
        for _ in range(3):
            dist.barrier()
            mem.sync()
            t0 = time.perf_counter()
            ring()
            mem.sync()
            ts.append(time.perf_counter() - t0)
        row["ring_ms"] = float(np.median(ts)) * 1e3
        full = gather_frames(out[0].transpose(0, 1).contiguous(), lens)          # [L, heads, D]
        if rank == 0:
            r = ref[0].transpose(0, 1).float()
            d = (full.float() - r).abs()
            row.update(max_abs_diff=float(d.max()), mean_abs_diff=float(d.mean()),
                       ref_mean_abs=float(r.abs().mean()))
            row["speedup"] = row["one_gpu_ms"] / row["ring_ms"]
            log(f"ring attention {n} frames ({L} tokens): one GPU {row['one_gpu_ms']:.1f} ms, ring x{world} "
                f"{row['ring_ms']:.1f} ms (x{row['speedup']:.2f}); max |diff| {row['max_abs_diff']:.2e}")
            rows.append(row)
        del q, k, v, ql, kl, vl, out, full
        mem.empty()
    return rows


def _pose_depth_diff(out, ref):
    """The agreement metrics of parts 0, 2 and 3 on (pose encodings, depths): pose encoding max
    |diff|, depth median relative diff."""
    pe = float(np.abs(out[0] - ref[0]).max())
    dep = float(np.median(np.abs(out[1] - ref[1]) / np.maximum(np.abs(ref[1]), 1e-6)))
    return pe, dep


def _peaks_per_rank(peak, world):
    """Every rank's peak bytes, gathered (a collective: all ranks call it)."""
    import torch.distributed as dist
    peaks = [torch.zeros(1, dtype=torch.float64, device=DEV) for _ in range(world)]
    dist.all_gather(peaks, torch.tensor([float(peak)], dtype=torch.float64, device=DEV))
    return [int(p.item()) for p in peaks]


def _vggt_images(n):
    """n smooth random images at VGGT_HW in [0, 1] on DEV, [n, 3, H, W] (seeded by n)."""
    vh, vw = VGGT_HW
    g = torch.Generator().manual_seed(n)
    x = torch.rand(n, 3, vh // 8, vw // 8, generator=g)
    return torch.nn.functional.interpolate(x, size=(vh, vw), mode="bilinear").clamp(0, 1).to(DEV)


def _scale_phase_part(rank, world, model, args, log):
    import torch.distributed as dist
    from engine.lingbot.session import LingBotMapSession
    rows = []

    def run(S, ring):
        cfg = _cfg(scale_frames=S, window=64, special_cap=max(1024, S + 64),
                   sequence_parallel="ring" if ring else "off")
        s = LingBotMapSession(cfg, model)
        frames = _frames(S, S)
        for f in frames[:-1]:
            s.push(f)
        mem.sync()
        mem.reset_peak()
        base = mem.allocated()
        t0 = time.perf_counter()
        res = s.push(frames[-1])
        mem.sync()
        dt = time.perf_counter() - t0
        peak = mem.peak() - base
        out = (np.stack([r.pose_enc for r in res]), np.stack([r.depth for r in res]))
        s.close()
        mem.empty()
        return dt, peak, out

    if rank == 0:
        run(4, False)                                     # warm-up (cuBLAS, kernels)
    dist.barrier()
    run(4, True)
    for S in args.scale_sizes:
        row = {"scale_frames": S, "tokens": S * TOKENS}
        if rank == 0:
            row["one_gpu_s"], row["one_gpu_peak_bytes"], ref = run(S, False)
        dist.barrier()
        dt, peak, out = run(S, True)
        peaks = _peaks_per_rank(peak, world)
        if rank == 0:
            row["ring_s"] = dt
            row["ring_peak_bytes_per_gpu"] = peaks
            pe, dep = _pose_depth_diff(out, ref)
            row.update(pose_max_abs_diff=pe, depth_median_rel_diff=dep, speedup=row["one_gpu_s"] / dt)
            log(f"scale phase {S} frames: one GPU {row['one_gpu_s']*1e3:.0f} ms (peak +{row['one_gpu_peak_bytes']/2**30:.2f} GiB), "
                f"ring x{world} {dt*1e3:.0f} ms (x{row['speedup']:.2f}; peak +{max(row['ring_peak_bytes_per_gpu'])/2**30:.2f} GiB/GPU); "
                f"pose max |diff| {pe:.2e}, depth median rel diff {dep:.2e}")
            rows.append(row)
    return rows


def _vggt_model():
    from engine.models.recipe import random_init_
    from engine.model_zoo import build_model
    with torch.device(DEV):
        m = build_model(VGGT_MODEL)
    random_init_(m, 0)
    return m.set_dtype(torch.bfloat16 if DEV == "cuda" else torch.float32).eval()


def _vggt_chunk_part(rank, world, args, log):
    """Part 3: one VGGT chunk on one GPU (rank 0) against the chunk split over the ring."""
    import torch.distributed as dist
    from engine.parallel.vggt_ring import chunk_forward
    model = _vggt_model()
    heads = ("camera", "depth")

    def timed(fn, imgs):
        mem.sync()
        mem.empty()
        mem.reset_peak()
        base = mem.allocated()
        t0 = time.perf_counter()
        out = fn(imgs)
        mem.sync()
        dt = time.perf_counter() - t0
        out = tuple(out[k].float().cpu().numpy() for k in ("pose_enc", "depth"))
        return dt, mem.peak() - base, out

    single = lambda imgs: model.forward_chunk(imgs, heads=heads)
    ring = lambda imgs: chunk_forward(model, imgs, heads=heads)
    warm = _vggt_images(max(world, 4))
    if rank == 0:
        timed(single, warm)
    dist.barrier()
    timed(ring, warm)
    rows = []
    for n in args.vggt_chunks:
        imgs = _vggt_images(n)
        row = {"frames": n, "tokens": n * (5 + (VGGT_HW[0] // 14) * (VGGT_HW[1] // 14))}
        ref = None
        if rank == 0:
            try:
                row["one_gpu_s"], row["one_gpu_peak_bytes"], ref = timed(single, imgs)
            except torch.OutOfMemoryError:
                row["one_gpu_oom"] = True
                mem.empty()
        dist.barrier()
        dt, peak, out = timed(ring, imgs)
        peaks = _peaks_per_rank(peak, world)
        if rank == 0:
            row["ring_s"] = dt
            row["ring_peak_bytes_per_gpu"] = peaks
            msg = (f"vggt chunk {n} frames: ring x{world} {dt:.2f} s ({n / dt:.1f} FPS; "
                   f"peak +{max(row['ring_peak_bytes_per_gpu']) / 2**30:.2f} GiB/GPU)")
            if ref is not None:
                pe, dep = _pose_depth_diff(out, ref)
                row.update(pose_max_abs_diff=pe, depth_median_rel_diff=dep, speedup=row["one_gpu_s"] / dt)
                msg += (f"; one GPU {row['one_gpu_s']:.2f} s (peak +{row['one_gpu_peak_bytes'] / 2**30:.2f} GiB), "
                        f"x{row['speedup']:.2f}; pose max |diff| {pe:.2e}, depth median rel diff {dep:.2e}")
            log(msg)
            rows.append(row)
        del imgs, out, ref
        mem.empty()
    fit = {}
    if rank == 0 and DEV == "cuda" and len(rows) >= 2:
        cap = torch.cuda.get_device_properties(0).total_memory - torch.cuda.memory_allocated()
        for key, get in (("one_gpu", lambda r: r.get("one_gpu_peak_bytes")),
                         ("ring", lambda r: max(r["ring_peak_bytes_per_gpu"]))):
            pts = [(r["frames"], get(r)) for r in rows if get(r)]
            if len(pts) >= 2:
                (n0, b0), (n1, b1) = pts[-2], pts[-1]
                per_frame = (b1 - b0) / (n1 - n0)
                fit[key] = {"bytes_per_frame": per_frame,
                            "frames_that_fit_estimate": int(n1 + (cap * 0.95 - b1) / per_frame)}
        log(f"vggt chunk memory per frame / longest chunk that fits (linear in the last two sizes): {fit}")
    del model
    mem.empty()
    return {"rows": rows, "fit": fit, "resolution": [VGGT_HW[1], VGGT_HW[0]], "heads": list(heads)}


def _noise_floor_part(args, log):
    """Part 0: one GPU, bf16 against fp32 on the inputs of parts 2 and 3 (the rounding a bf16 run
    carries anyway; a ring whose deviation from one GPU is of this size is exact to bf16)."""
    from engine.lingbot.session import LingBotMapSession
    rows = {}
    S = args.noise_floor[0]
    outs = {}
    model = _model(torch.device(DEV))
    for dt in ("fp32", "bf16"):                   # fp32 first: the session casts the trunk in place
        s = LingBotMapSession(_cfg(scale_frames=S, window=64, special_cap=max(1024, S + 64), dtype=dt), model)
        res = []
        for f in _frames(S, S):
            res += s.push(f)
        outs[dt] = (np.stack([r.pose_enc for r in res]), np.stack([r.depth for r in res]))
        s.close()
    del model
    mem.empty()
    pe, dep = _pose_depth_diff(outs["bf16"], outs["fp32"])
    rows["scale_phase"] = {"scale_frames": S, "pose_max_abs_diff": pe, "depth_median_rel_diff": dep,
                           "pose_max_abs": float(np.abs(outs["fp32"][0]).max())}
    log(f"noise floor, scale phase {S} frames, one GPU bf16 vs fp32: pose max |diff| {pe:.2e} "
        f"(max |pose| {rows['scale_phase']['pose_max_abs']:.2f}), depth median rel diff {dep:.2e}")
    n = args.noise_floor[1]
    imgs = _vggt_images(n)
    vggt = _vggt_model()
    outs = {}
    for dt in (torch.float32, torch.bfloat16):
        o = vggt.set_dtype(dt).forward_chunk(imgs, heads=("camera", "depth"))
        outs[dt] = (o["pose_enc"].float().cpu().numpy(), o["depth"].float().cpu().numpy())
    del vggt, imgs
    mem.empty()
    pe, dep = _pose_depth_diff(outs[torch.bfloat16], outs[torch.float32])
    rows["vggt_chunk"] = {"frames": n, "pose_max_abs_diff": pe, "depth_median_rel_diff": dep,
                          "pose_max_abs": float(np.abs(outs[torch.float32][0]).max())}
    log(f"noise floor, VGGT chunk {n} frames, one GPU bf16 vs fp32: pose max |diff| {pe:.2e} "
        f"(max |pose| {rows['vggt_chunk']['pose_max_abs']:.2f}), depth median rel diff {dep:.2e}")
    return rows


def _variant(name: str, streams: int):
    """'one' | 'batched' | 'serial', '+streams' (attention on CUDA side streams), '+pipeline'."""
    base, *mods = name.split("+")
    sizes = {"one": (1, 1), "batched": (streams, streams), "serial": (streams, 1)}
    if base not in sizes or not set(mods) <= {"streams", "pipeline"}:
        raise SystemExit(f"unknown scheduler variant {name!r}: one|batched|serial[+streams][+pipeline]")
    n, max_batch = sizes[base]
    return n, max_batch, {"attention_streams": "streams" in mods, "pipeline": "pipeline" in mods}


def _breakdown(model, sched, streams, frames, rounds):
    """CUDA-event time per model section over `rounds` more rounds (stream time between the
    events: GPU work plus any GPU idle inside the section), ms per round, and the wall time."""
    from engine.bench import SectionTimer
    from engine.models.sections import timing
    timer = SectionTimer(mem.cuda)
    mem.sync()
    t0 = time.perf_counter()
    with timing(timer):                 # the scheduler steps on this thread
        for f in frames[:rounds]:
            for st in streams:
                sched.submit(st, f)
            while sched.pending():
                sched.step()
    mem.sync()
    wall = (time.perf_counter() - t0) / rounds
    timer.collect()
    ms = {k: v * 1e3 / rounds for k, v in timer.totals.items()}
    top = ("patch_embed", "frame_blocks", "global_blocks", "camera_head", "depth_head")
    ms["round_wall"] = wall * 1e3
    ms["outside_sections"] = wall * 1e3 - sum(ms.get(k, 0.0) for k in top)
    return ms


def _scheduler_row(model, args, log, backend, variant):
    from engine.scheduler import StreamScheduler, stream_cache_bytes
    n, max_batch, opts = _variant(variant, args.streams)
    cfg = _cfg(backend=backend)
    mem.sync()
    mem.empty()
    base = mem.allocated()
    sched = StreamScheduler(model, max_batch=max_batch, **opts)
    streams = [sched.open_stream(cfg, name=f"s{i}", frame_size=(W, H)) for i in range(n)]
    extra = 10 if args.breakdown else 0
    frames = _frames(8 + 5 + args.frames + extra, 1)
    for st in streams:                                 # scale phases + 5 warm-up frames each
        for f in frames[:13]:
            sched.submit(st, f)
    while sched.pending():
        sched.step()
    mem.sync()
    mem_streams = mem.allocated() - base
    for s in streams:
        s.latencies.clear()                            # latency of the timed frames only
    sched._host = dict.fromkeys(sched._host, 0.0)      # host time of the timed rounds only
    rounds0 = sched.stats()["rounds"]
    mem.reset_peak()
    t0 = time.perf_counter()
    last = {}
    for f in frames[13:13 + args.frames]:
        for st in streams:
            sched.submit(st, f)
        while sched.pending():
            for st, res in sched.step():
                if res:
                    last[st.name] = (res[-1].pose_enc, res[-1].depth)
    mem.sync()
    dt = time.perf_counter() - t0
    est = stream_cache_bytes(model, cfg, (W, H))
    st = sched.stats()
    timed_rounds = st["rounds"] - rounds0
    row = {"backend": backend, "variant": variant, "streams": n, "max_batch": max_batch, **opts,
           "frames_per_stream": args.frames, "seconds": dt,
           "aggregate_fps": n * args.frames / dt, "per_stream_fps": args.frames / dt,
           "round_ms": dt * 1e3 / max(timed_rounds, 1),
           "host_ms_per_round": {k: v * 1e3 / max(timed_rounds, 1) for k, v in sched._host.items()},
           "memory_per_stream_bytes": mem_streams / n, "cache_estimate_bytes": est["total"],
           "peak_during_timed_bytes": mem.peak() - base, "largest_batch": st["largest_batch"],
           "latency_p50_ms": [s["latency_p50_ms"] for s in st["streams"]], "_last": last}
    if extra:
        row["breakdown_ms_per_round"] = _breakdown(model, sched, streams, frames[13 + args.frames:], extra)
    for s in streams:
        sched.close_stream(s)
    return row


def _scheduler_part(model, args, log, save=lambda rows: None):
    """Each backend x variant: aggregate FPS over `--frames` streamed frames per stream, against
    the 'one' row of the same backend; each stream's last result against the single stream's."""
    rows = []
    for backend in args.backends:
        one = None
        for variant in args.variants:
            try:
                row = _scheduler_row(model, args, log, backend, variant)
            except Exception as exc:           # keep the rows measured so far (e.g. FlashInfer missing)
                log(f"scheduler {backend} {variant}: FAILED {type(exc).__name__}: {exc}")
                rows.append({"backend": backend, "variant": variant, "error": f"{type(exc).__name__}: {exc}"})
                save(rows)
                continue
            last = row.pop("_last")
            if row["streams"] == 1 and one is None:
                one = (row["aggregate_fps"], last["s0"])
            elif one is not None:
                row["vs_one_stream"] = row["aggregate_fps"] / one[0]
                p0, d0 = one[1]
                row["pose_max_abs_diff_vs_one_stream"] = float(max(np.abs(p - p0).max() for p, _ in last.values()))
                row["depth_max_rel_diff_vs_one_stream"] = float(max(
                    np.median(np.abs(d - d0) / np.maximum(np.abs(d0), 1e-6)) for _, d in last.values()))
            hm = row["host_ms_per_round"]
            log(f"scheduler [{backend}] {variant}: {row['streams']} stream(s), max_batch {row['max_batch']}: "
                f"{row['aggregate_fps']:.1f} FPS together ({row['per_stream_fps']:.1f} each"
                + (f", x{row['vs_one_stream']:.2f} one stream" if "vs_one_stream" in row else "")
                + f"), round {row['round_ms']:.1f} ms (host: prepare {hm['prepare']:.1f}, launch {hm['launch']:.1f}, "
                f"readback {hm['readback']:.1f}, results {hm['results']:.1f}), "
                f"{row['memory_per_stream_bytes'] / 2**30:.2f} GiB per stream, p50 latency {row['latency_p50_ms'][0]:.0f} ms"
                + (f"; vs one stream: pose max |diff| {row['pose_max_abs_diff_vs_one_stream']:.2e}, depth median rel "
                   f"{row['depth_max_rel_diff_vs_one_stream']:.2e}" if "pose_max_abs_diff_vs_one_stream" in row else ""))
            if "breakdown_ms_per_round" in row:
                log("  breakdown ms/round: " + ", ".join(f"{k} {v:.1f}" for k, v in row["breakdown_ms_per_round"].items()))
            rows.append(row)
            save(rows)
    return rows


def _rank(rank, world, args, rdzv):
    if args.smoke:
        _smoke()
        torch.set_num_threads(1)
    log = (lambda m: print(m, flush=True)) if rank == 0 else (lambda m: None)
    cuda = DEV == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    res = {"gpu": torch.cuda.get_device_name(rank) if cuda else "cpu", "gpus": world, "torch": torch.__version__,
           "model": MODEL, "resolution": [W, H]}
    model = _model(torch.device("cuda", rank) if cuda else torch.device("cpu"))

    def save():          # after every part, so a run cut short keeps what it measured
        if rank == 0:
            with open(os.path.join(args.out, "parallel_bench.json"), "w") as f:
                json.dump(res, f, indent=1)
    if world > 1:
        import torch.distributed as dist
        if cuda:
            dist.init_process_group("nccl", init_method=f"file://{rdzv}", rank=rank, world_size=world,
                                    device_id=torch.device("cuda", rank))
        else:
            dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=world)
        if args.ring_frames:
            res["ring_attention"] = _ring_attention_part(rank, world, args, log)
            save()
        if args.scale_sizes:
            res["scale_phase"] = _scale_phase_part(rank, world, model, args, log)
            save()
        if args.vggt_chunks:
            del model
            mem.empty()
            res["vggt_chunk"] = _vggt_chunk_part(rank, world, args, log)
            save()
            model = _model(torch.device("cuda", rank) if cuda else torch.device("cpu")) if args.streams else None
        dist.barrier()
        dist.destroy_process_group()
        if rank != 0:
            return
    if args.noise_floor:
        res["noise_floor"] = _noise_floor_part(args, log)
        save()
    if args.streams:
        def keep(rows):
            res["scheduler"] = rows
            save()
        res["scheduler"] = _scheduler_part(model, args, log, keep)
    save()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ints = lambda s: [int(x) for x in s.split(",") if x]
    p.add_argument("--out", default=".")
    p.add_argument("--ring-frames", type=ints, default=[32, 64, 128, 256])
    p.add_argument("--scale-sizes", type=ints, default=[8, 32, 64, 128])
    p.add_argument("--vggt-chunks", type=ints, default=[64, 128, 256, 512])
    p.add_argument("--noise-floor", type=ints, default=[], metavar="S,C",
                   help="part 0 on one GPU: scale phase of S frames and a VGGT chunk of C frames, bf16 vs fp32")
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--frames", type=int, default=40)
    words = lambda s: [x for x in s.split(",") if x]
    p.add_argument("--backends", type=words, default=["sdpa"],
                   help="attention backends of the scheduler rows, e.g. sdpa,flashinfer")
    p.add_argument("--variants", type=words, default=["one", "batched", "serial"],
                   help="scheduler rows: one | batched | serial (--streams streams, max_batch 1), each "
                        "optionally +streams (attention on CUDA side streams) and/or +pipeline (results "
                        "one round later, no host wait per round)")
    p.add_argument("--breakdown", action="store_true",
                   help="10 more rounds per scheduler row with CUDA events around each model section")
    p.add_argument("--smoke", action="store_true", help="run the same code on 2 CPU processes, tiny model")
    args = p.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("parallel bench: needs CUDA (or --smoke)")
    os.makedirs(args.out, exist_ok=True)
    world = 2 if args.smoke else min(2, torch.cuda.device_count())
    if world > 1:
        import torch.multiprocessing as mp
        rdzv = os.path.join(tempfile.mkdtemp(), "rdzv")
        mp.spawn(_rank, args=(world, args, rdzv), nprocs=world, join=True)
    else:
        _rank(0, 1, args, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
