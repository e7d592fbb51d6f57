"""Allowlist networking on Kubernetes: NetworkPolicies, and the per-CNI host policies (Cilium, Antrea, Calico)."""
