#!/usr/bin/env bash
# Build the offline base of orchard's images: a Debian bookworm root filesystem with Python 3.11 and a
# virtualenv at /opt/venv on PATH (python, pip), written as a tar that docker/podman/buildah import.
# It stands in for the public python:3.11-slim-bookworm base where no registry can be pulled from
# (scripts/build-images.sh BASE_IMAGE=local calls this once and caches the tar).
#
#   scripts/build-base-rootfs.sh OUT.tar
#
# Needs root and mmdebstrap (scripts/install-system-deps.sh) and a Debian mirror; ~25 s idle.
# Why a venv and not the system pip: Debian's python is "externally managed" (PEP 668) and refuses
# `pip install`; a venv gives the Dockerfiles the same `python`/`pip` on PATH that python:slim has.
set -euo pipefail
out=${1:?usage: $0 OUT.tar}
command -v mmdebstrap >/dev/null || { echo "mmdebstrap is missing: run scripts/install-system-deps.sh" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "build-base-rootfs: run as root (mmdebstrap's root mode)" >&2; exit 1; }
# passwd: useradd for the images' non-root users; patchelf and busybox-static: the agent injector's
# offline Python bundle and the static `cp` of its otherwise empty final image.
packages=python3.11,python3-venv,python3-pip,ca-certificates,passwd,findutils,patchelf,busybox-static
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
mkdir -p "$(dirname "$out")"
mmdebstrap --variant=apt --format=tar --include="$packages" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --customize-hook='chroot "$1" python3 -m venv /opt/venv' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
  bookworm "$tmp"
mv "$tmp" "$out"
echo "build-base-rootfs: wrote $out ($(du -h "$out" | cut -f1))"
