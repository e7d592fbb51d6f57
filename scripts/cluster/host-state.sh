#!/usr/bin/env bash
# What the test cluster may change on the host, printed in a stable order: cluster-up records it before
# starting anything, cluster-down compares after tearing down and fails on a difference.
# Only what the cluster's programs would make is listed (their names, paths, addresses and iptables
# chains): the machine is shared, and other work (the local sandbox backend's tests: veths orc<n>h,
# network namespaces, mounts under /tmp, cgroups orchard-<hex>, nftables/iptables rules of its egress
# tests) comes and goes meanwhile without being the cluster's.
set -uo pipefail
source "$(dirname "$0")/env.sh"
# Addresses and names of the cluster (env.sh) and of the programs it runs (the CNI bridge and its
# veth<8 hex> host ends, kube-proxy's/kube-router's KUBE-* chains, CNI's CNI-* chains).
ours="${HOST_IF}|${NODE_IF}|cni0|veth[0-9a-f]{8}|KUBE-|CNI-|${CLUSTER_CIDR%.*.*}\.|${SERVICE_CIDR%.*.*}\.|${HOST_IP%.*}\."
echo "## processes of the cluster"
ps -eo comm= | grep -xE 'etcd|kube-apiserver|kube-controller|kube-scheduler|kubelet|kube-proxy|kube-router|containerd|containerd-shim.*|coredns|local-path-prov.*|workflow-contro.*|argoexec|training-operat.*|pause' | sort | uniq -c
echo "## mounts"
awk '{print $5}' /proc/self/mountinfo \
  | grep -E "^($STATE|$RUN|$CACHE|/run/containerd|/var/lib/kubelet|/var/lib/cni|/run/netns/($NETNS|cni-)|/sys/fs/cgroup/[^/]+$CGROUP_ROOT)(/|$)" | sort
echo "## network namespaces"; ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^($NETNS|cni-)" | sort
echo "## links"; ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^($ours)" | sort
echo "## routes"; ip route show | grep -E "$ours" | sort
echo "## iptables (host namespace): the cluster's chains and addresses"
for t in filter nat mangle raw; do
  iptables-save -t "$t" 2>/dev/null | grep -vE '^#' | sed 's/\[[0-9]*:[0-9]*\]//' | grep -E "$ours" | sed "s/^/$t /"
done
echo "## nftables (host namespace)"; nft list tables 2>/dev/null | grep -E 'kube|cni|orchard-cluster'
echo "## sysctls"; sysctl net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables 2>/dev/null
# The local sandbox backend's own cgroups (orchard-<10 hex>) come and go with other tests: not ours.
echo "## cgroups"; find /sys/fs/cgroup -mindepth 2 -maxdepth 2 -type d 2>/dev/null | grep -vE '/orchard-[0-9a-f]{10}$' | sort
echo "## directories"
# (/run/netns is shared with anyone's `ip netns add`: its entries of ours are listed above.)
for d in "$STATE" "$RUN" /var/log/pods /var/log/containers /var/lib/kubelet /run/containerd /etc/cni /opt/cni /var/lib/cni; do
  [ -e "$d" ] && echo "$d: $(find "$d" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l) entries"
done
exit 0
