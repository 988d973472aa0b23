#!/usr/bin/env bash
# Upstream LingBot-Map vs ReconStudio in ONE run on the GPU machine (H200): the same recipe
# weights, the same real frames (ICL-NUIM kt3 video, 518x378, played forwards then backwards to
# 300 frames), bf16, window 64, 8 scale frames, 4 camera iterations, keyframe interval 1 and 2;
# plus each implementation's bf16-vs-fp32 pose/depth error and ours-vs-upstream in fp32.
# Details: benchmarks/side_by_side.py (upstream's compiled kf1 run repeats until two agree within 3 %;
# ours deferred and sync). Results: docs/benchmarks.md.
#
# Here (once): fetch github:Robbyant/lingbot-map, export its lingbot_map/ into .upstream/ (ignored
# through .git/info/exclude, never committed), copy the clip into .cache/:
#   git -C <mirror> archive HEAD lingbot_map | tar -x -C .upstream
#   mkdir -p .cache/frames && cp ../shared/data/icl_livingroom_kt3/video.mp4 .cache/frames/icl_kt3.mp4
# Device: carry .whl .cache .upstream;  bash benchmarks/side_by_side.sh [FRAMES] [extra ours variants]
# (FID_VARIANTS=a,b: those variants' bf16 outputs also compared with the fp32 reference;
# NO_UPSTREAM=1: ours only; RES_H=392: frames at 518x392, a 640x480 camera's model size;
# UP_FLAGS=--no-eager: upstream's compiled runs only -- its fastest)
set -uo pipefail
. benchmarks/gpu_env.sh
N=${1:-300}; VARIANTS=${2:-}; FID=${FID:-48}
VIDEO=.cache/frames/icl_kt3.mp4
SBS="python3 benchmarks/side_by_side.py"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, flashinfer; print('torch', torch.__version__, 'flashinfer', flashinfer.__version__)"
T_OURS=${T_OURS:-280}; T_UP=${T_UP:-420}   # upstream repeats its compiled kf1 run until two agree
timeout 120 $SBS weights /tmp/recipe.pt; el
timeout $T_OURS $SBS ours --weights /tmp/recipe.pt --video $VIDEO --height "${RES_H:-378}" --frames "$N" --fid-frames "$FID" --variants "$VARIANTS" --fid-variants "${FID_VARIANTS:-}" \
  --json "$OUT/ours.json" --npz /tmp/ours_fp32.npz 2>&1 | grep -v Warning | tee "$OUT/ours.log"; el
[ -n "${NO_UPSTREAM:-}" ] && exit 0
timeout $T_UP $SBS upstream --weights /tmp/recipe.pt --video $VIDEO --height "${RES_H:-378}" --frames "$N" --fid-frames "$FID" --upstream .upstream ${UP_FLAGS:-} \
  --json "$OUT/upstream.json" --npz /tmp/upstream_fp32.npz 2>&1 | grep -v "Warning\|it/s\]" | tee "$OUT/upstream.log" | tail -30; el
$SBS report "$OUT/ours.json" "$OUT/upstream.json" --npz-ours /tmp/ours_fp32.npz --npz-upstream /tmp/upstream_fp32.npz \
  2>&1 | tee "$OUT/side_by_side.txt"
