#!/usr/bin/env bash
# What the test cluster may change on the host, printed in a stable order: cluster-up records it before
# starting anything, cluster-down compares after tearing down (a test checks they are equal).
set -uo pipefail
source "$(dirname "$0")/env.sh"
echo "## processes of the cluster"
ps -eo comm= | grep -xE 'etcd|kube-apiserver|kube-controller|kube-scheduler|kubelet|kube-proxy|kube-router|containerd|containerd-shim.*|coredns|local-path-prov.*|workflow-contro.*|argoexec|pause' | sort | uniq -c
# Mounts under /tmp belong to the local sandbox backend's tests, never to the cluster.
echo "## mounts"; awk '{print $5}' /proc/self/mountinfo | grep -v '^/tmp/' | sort
echo "## network namespaces"; ip netns list 2>/dev/null | awk '{print $1}' | sort
echo "## links"; ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort
echo "## routes"; ip route show | sort
echo "## iptables (host namespace)"
for t in filter nat mangle raw; do iptables-save -t "$t" 2>/dev/null | grep -vE '^#|^:.*\[[0-9]+:[0-9]+\]$' | sed 's/\[[0-9]*:[0-9]*\]//'; done
echo "## nftables (host namespace)"; nft list tables 2>/dev/null
echo "## sysctls"; sysctl net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables 2>/dev/null
# The local sandbox backend's own cgroups (orchard-<10 hex>) come and go with other tests: not ours.
echo "## cgroups"; find /sys/fs/cgroup -mindepth 2 -maxdepth 2 -type d 2>/dev/null | grep -vE '/orchard-[0-9a-f]{10}$' | sort
echo "## directories"
for d in "$STATE" "$RUN" /var/log/pods /var/log/containers /var/lib/kubelet /run/containerd /etc/cni /opt/cni /var/lib/cni /run/netns; do
  [ -e "$d" ] && echo "$d: $(find "$d" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l) entries"
done
exit 0
