#!/usr/bin/env bash
# System packages the sandboxes use: Chromium for the GUI recipe, patch/git for SWE tasks,
# libseccomp2 for the local backend's seccomp filter, runsc for its gVisor runtime and mmdebstrap for
# scripts/build-debian-root.sh. Installed only when missing, so a second run costs nothing.
set -euo pipefail
declare -A need=([chromium]=chromium [patch]=patch [git]=git [runsc]=runsc [mmdebstrap]=mmdebstrap)
missing=()
for bin in "${!need[@]}"; do
  command -v "$bin" >/dev/null 2>&1 || missing+=("${need[$bin]}")
done
ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || missing+=(libseccomp2)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "missing system packages: ${missing[*]} (install them with your package manager; root + apt-get not available here)" >&2
  exit 1
fi
echo "installing system packages: ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
