#!/usr/bin/env bash
# Build a Debian root filesystem for local sandboxes (opt-in; ~25 s and ~280 MB, from the Debian
# registry): the tools of a task image and nothing of the host.
#
#   scripts/build-debian-root.sh DIR [EXTRA_PACKAGES...]      # e.g. /var/lib/orchard-images/bookworm
#
# Then create sandboxes with SandboxCreate(image="DIR"). The tree stays owned by host root: each
# sandbox mounts it idmapped through its own user namespace, so root in a sandbox owns the image's files
# (in its own overlay layer: the image itself is never written), whatever its id range.
set -euo pipefail
dir=${1:?usage: $0 DIR [EXTRA_PACKAGES...]}
shift
packages=python3,python3-pytest,git,patch${*:+,$(IFS=,; echo "$*")}
command -v mmdebstrap >/dev/null || { echo "mmdebstrap is missing: run scripts/install-system-deps.sh" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "run as root (mmdebstrap makes root-owned files)" >&2; exit 1; }
[ ! -e "$dir" ] || [ -z "$(ls -A "$dir")" ] || { echo "$dir exists and is not empty" >&2; exit 1; }
mmdebstrap --variant=apt --include="$packages" bookworm "$dir"
# mmdebstrap can leave /proc mounted when something held it busy ("umount /proc failed"): detach it.
for m in dev/pts dev sys proc; do
  if mountpoint -q "$dir/$m"; then umount -l "$dir/$m"; fi
done
echo "built $dir; use SandboxCreate(image=\"$dir\")"
