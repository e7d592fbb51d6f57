"""The Kubernetes backend: a sandbox is a pod (`backend.KubernetesBackend`), with its API client, objects,
warm pool, adoption, snapshots and events; `network` holds the allowlist policies per CNI and `testing` the
fake API server the tests run it against."""
