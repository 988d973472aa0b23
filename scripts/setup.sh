#!/usr/bin/env bash
# Sets up ReconStudio on a fresh Debian/Ubuntu machine: system libraries for Qt + headless GL,
# a virtual environment in .venv, and the package with its test extras. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PKGS="xvfb xauth libgl1-mesa-dri libegl1 libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4
libxcb-keysyms1 libxcb-shape0 libxcb-randr0 libxcb-render-util0 libxcb-image0 libfontconfig1
libdbus-1-3 libgl1 libglib2.0-0 libx11-xcb1"
missing=""
for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# torch first, pinned to the CPU build where one is available locally; the project range accepts it.
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q "torch==2.13.0" 2>/dev/null || .venv/bin/pip install -q torch
.venv/bin/pip install -q -e ".[test]"
