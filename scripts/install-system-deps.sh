#!/usr/bin/env bash
# System packages the sandboxes use: Chromium for the GUI recipe, patch/git for SWE tasks,
# libseccomp2 for the local backend's seccomp filter, nftables (libnftables) for its allowlist egress
# filter, runsc for its gVisor runtime, mmdebstrap for scripts/build-debian-root.sh and the offline image
# base, and buildah for `make images` where neither a docker engine nor podman answers. Installed only
# when missing, so a second run costs nothing.
set -euo pipefail
declare -A need=([chromium]=chromium [patch]=patch [git]=git [runsc]=runsc [mmdebstrap]=mmdebstrap [nft]=nftables)
missing=()
for bin in "${!need[@]}"; do
  command -v "$bin" >/dev/null 2>&1 || missing+=("${need[$bin]}")
done
ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || missing+=(libseccomp2)
# A docker CLI alone is no builder: its engine must answer (scripts/build-images.sh checks the same way).
if ! command -v buildah >/dev/null 2>&1 && ! timeout 20 docker info >/dev/null 2>&1 \
   && ! timeout 20 podman info >/dev/null 2>&1; then
  missing+=(buildah)
fi
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "missing system packages: ${missing[*]} (install them with your package manager; root + apt-get not available here)" >&2
  exit 1
fi
echo "installing system packages: ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
