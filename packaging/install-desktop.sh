#!/usr/bin/env bash
# Install a built bundle (dist/reconstudio) for the current user: the program under
# ~/.local/opt/reconstudio, `reconstudio` on ~/.local/bin, the icon and the menu entry.
# Usage: packaging/install-desktop.sh [DIST_DIR]      (default: dist/reconstudio)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dist="${1:-$here/../dist/reconstudio}"
[ -x "$dist/reconstudio" ] || { echo "no bundle at $dist (build it: pyinstaller packaging/reconstudio.spec)" >&2; exit 2; }
prefix="${XDG_DATA_HOME:-$HOME/.local/share}"
mkdir -p "$HOME/.local/opt" "$HOME/.local/bin" "$prefix/applications"
rm -rf "$HOME/.local/opt/reconstudio"
cp -a "$dist" "$HOME/.local/opt/reconstudio"
ln -sf "$HOME/.local/opt/reconstudio/reconstudio" "$HOME/.local/bin/reconstudio"
for s in 32 64 128 256; do
  d="$prefix/icons/hicolor/${s}x${s}/apps"; mkdir -p "$d"
  cp "$here/../resources/icons/reconstudio-$s.png" "$d/reconstudio.png"
done
mkdir -p "$prefix/icons/hicolor/scalable/apps"
cp "$here/../resources/icons/reconstudio.svg" "$prefix/icons/hicolor/scalable/apps/reconstudio.svg"
sed "s|^Exec=reconstudio|Exec=$HOME/.local/bin/reconstudio|; s|^TryExec=reconstudio|TryExec=$HOME/.local/bin/reconstudio|" \
  "$here/reconstudio.desktop" > "$prefix/applications/reconstudio.desktop"
command -v update-desktop-database >/dev/null && update-desktop-database "$prefix/applications" || true
echo "installed: $HOME/.local/bin/reconstudio and the ReconStudio menu entry"
