#!/usr/bin/env bash
# Debian packages the test cluster runs on: containerd + runc (the node's runtime), the CNI plugins,
# iptables + ipset (kube-proxy and kube-router's firewall), conntrack, socat (port-forward), openssl
# (certificates), busybox-static (the tools image), buildah (add-on images), gcc (the pause binary).
set -euo pipefail
declare -A need=([containerd]=containerd [runc]=runc [iptables]=iptables [ipset]=ipset [conntrack]=conntrack
  [socat]=socat [openssl]=openssl [buildah]=buildah [gcc]=gcc [nsenter]=util-linux)
missing=()
for bin in "${!need[@]}"; do command -v "$bin" >/dev/null 2>&1 || missing+=("${need[$bin]}"); done
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
[ -x /bin/busybox ] || missing+=(busybox-static)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "cluster: installing ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
