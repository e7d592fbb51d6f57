#!/usr/bin/env bash
# Build a Debian root filesystem for local sandboxes (opt-in; ~25 s and ~280 MB, from the Debian
# registry): the tools of a task image and nothing of the host.
#
#   scripts/build-debian-root.sh DIR [EXTRA_PACKAGES...]      # e.g. /var/lib/orchard-images/bookworm
#
# Then create sandboxes with SandboxCreate(image="DIR"). The tree is handed to the sandboxes' user
# namespace (LocalBackendConfig.userns_base, default 1000000000; ORCHARD_USERNS_BASE overrides): every
# file's owner is shifted into that range, so root in a sandbox owns the image's files (in its own
# overlay layer: the image itself is never written). Without the shift the image still works, but its
# files show as nobody:nogroup inside and only /workspace, /root, /tmp are writable.
set -euo pipefail
dir=${1:?usage: $0 DIR [EXTRA_PACKAGES...]}
shift
base=${ORCHARD_USERNS_BASE:-1000000000}
packages=python3,python3-pytest,git,patch${*:+,$(IFS=,; echo "$*")}
command -v mmdebstrap >/dev/null || { echo "mmdebstrap is missing: run scripts/install-system-deps.sh" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "run as root (the ownership shift needs it)" >&2; exit 1; }
[ ! -e "$dir" ] || [ -z "$(ls -A "$dir")" ] || { echo "$dir exists and is not empty" >&2; exit 1; }
mmdebstrap --variant=apt --include="$packages" bookworm "$dir"
# mmdebstrap can leave /proc mounted when something held it busy ("umount /proc failed"): detach it.
for m in dev/pts dev sys proc; do
  if mountpoint -q "$dir/$m"; then umount -l "$dir/$m"; fi
done
# Shift ownership into the sandbox id range (uid u -> base + u), keeping setuid/setgid bits.
python3 - "$dir" "$base" <<'PY'
import os, stat, sys
root, base = sys.argv[1], int(sys.argv[2])
for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if not os.path.ismount(os.path.join(dirpath, d))]
    for name in [".", *dirnames, *filenames] if dirpath == root else [*dirnames, *filenames]:
        path = os.path.join(dirpath, name)
        st = os.lstat(path)
        if st.st_uid < base:
            os.lchown(path, base + st.st_uid, base + st.st_gid)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(path, stat.S_IMODE(st.st_mode))  # chown clears setuid bits
PY
echo "built $dir (files shifted to host uid $base + n); use SandboxCreate(image=\"$dir\")"
