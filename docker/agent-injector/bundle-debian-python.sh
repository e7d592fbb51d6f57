#!/bin/sh
# Make the Debian Python of this image relocatable: interpreter, standard library, every shared library
# it and its extension modules load (glibc and the dynamic loader included) under DEST, the interpreter
# patched (patchelf) to load them from there. The result runs on any x86_64 Linux image whatever its C
# library, or none, as python-build-standalone does, but only from RUN_AT (the loader's path is absolute
# in an ELF interpreter field; RUN_AT is where pods mount the agent volume).
#   bundle-debian-python.sh DEST RUN_AT        e.g. /opt/orchard/python /orchard/python
# Hand-written because python-build-standalone (uv) needs GitHub, which offline builds cannot reach.
set -eu
dest=$1 run_at=$2
py=$(readlink -f "$(command -v python3)")
ver=$(basename "$py")                    # python3.11
command -v patchelf >/dev/null || { echo "bundle-debian-python: patchelf is missing in the base image" >&2; exit 1; }
mkdir -p "$dest/bin" "$dest/lib"
cp "$py" "$dest/bin/python3"
cp -a "/usr/lib/$ver" "$dest/lib/$ver"
rm -rf "$dest/lib/$ver/site-packages" "$dest/lib/$ver/dist-packages"
# Every library the interpreter and its extension modules link, following symlinks to the real files.
for elf in "$py" "$dest/lib/$ver"/lib-dynload/*.so; do
  ldd "$elf" | awk '/=> \// {print $3} /^\t\/.*ld-linux/ {print $1}'
done | sort -u | while read -r lib; do cp -L "$lib" "$dest/lib/$(basename "$lib")"; done
loader=$(basename "$(ldd "$py" | awk '/ld-linux/ {print $1}')")
# DT_RPATH (--force-rpath), unlike DT_RUNPATH, also applies to the libraries' own dependencies.
patchelf --set-interpreter "$run_at/lib/$loader" --force-rpath --set-rpath '$ORIGIN/../lib' "$dest/bin/python3"
for so in "$dest/lib/$ver"/lib-dynload/*.so; do patchelf --force-rpath --set-rpath '$ORIGIN/../..' "$so"; done
ln -s python3 "$dest/bin/$ver"
echo "bundle-debian-python: $ver from $py into $dest ($(du -sh "$dest" | cut -f1)), loader $run_at/lib/$loader"
