#!/usr/bin/env bash
# Sets up ReconStudio on a fresh Debian/Ubuntu machine: system libraries for Qt + headless GL,
# a virtual environment in .venv, and the package with its test extras. Idempotent and quiet:
# when the environment is up to date it changes nothing and prints one line.
#
# "Up to date" = a stamp in .venv holding a hash of what the install depends on (pyproject.toml,
# this script, the Python version) matches AND the venv works (the package imports from this
# checkout, with PySide6). A matching stamp over a broken venv reinstalls; pip's output (~90 lines
# of setuptools notices) goes to .venv/setup.log and is shown only when the install fails.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

APT_PKGS="xvfb xauth libgl1-mesa-dri libegl1 libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4
libxcb-keysyms1 libxcb-shape0 libxcb-randr0 libxcb-render-util0 libxcb-image0 libfontconfig1
libdbus-1-3 libgl1 libglib2.0-0 libx11-xcb1"
if ! dpkg -s $APT_PKGS >/dev/null 2>&1; then
  missing=""
  for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  echo "setup: installing system packages:$missing"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
STAMP=.venv/.reconstudio-setup
key=$( { cat pyproject.toml scripts/setup.sh; .venv/bin/python -c 'import sys; print(sys.version)'; } \
       | sha256sum | cut -d' ' -f1 )

venv_works() {
  # from outside the checkout, so the import proves the editable install points here
  local where
  where=$(cd / && "$ROOT/.venv/bin/python" -c 'import engine, PySide6; print(engine.__file__)' 2>/dev/null) || return 1
  [ "$where" = "$ROOT/engine/__init__.py" ] && [ -x .venv/bin/reconstudio ]
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$key" ] && venv_works; then
  echo "setup: .venv is up to date (nothing to do)"
  exit 0
fi

echo "setup: installing ReconStudio into .venv (log: .venv/setup.log) ..."
rm -f "$STAMP"
LOG=.venv/setup.log
if ! {
  .venv/bin/pip install --upgrade pip &&
  # torch first, pinned to the CPU build where one is available locally; the project range accepts it.
  { .venv/bin/pip install "torch==2.13.0" || .venv/bin/pip install torch; } &&
  .venv/bin/pip install -e ".[test]"
} >"$LOG" 2>&1; then
  tail -n 40 "$LOG" >&2
  echo "setup: pip install failed; full log in $LOG" >&2
  exit 1
fi
if ! venv_works; then
  echo "setup: installed, but 'import engine, PySide6' fails from .venv; see $LOG" >&2
  exit 1
fi
echo "$key" > "$STAMP"
echo "setup: done"
