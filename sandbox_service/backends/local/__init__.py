"""The local backend: sandboxes as namespaces and cgroups on this host (`backend.LocalBackend`), with its
rootfs, network, egress filter, zygote, slots and gVisor runtime."""
