"""How long a restarted service takes to adopt N running sandboxes (Kubernetes backend, fake API server).

    PYTHONPATH=$PWD python scripts/bench_k8s_adopt.py 1000

One sandbox is started through the backend; its Pod and Secret are cloned N-1 times in the fake (the
same bodies the backend writes, fast set-up), then a fresh backend runs `adopt()` (one LIST per kind,
decoding every pod and Secret: this runs before the service listens) and `list_orphans()` (reuses that
list). Agents are not pinged (the service does that after listening). The full restart-at-scale
figures (reaping, exec p99) are scripts/sim_k8s_scale.py's.
"""

from __future__ import annotations

import copy
import sys
import tempfile
import time
from pathlib import Path
from kubernetes import client as k8s
from sandbox_service.backends.kubernetes.backend import KubernetesBackend
from sandbox_service.backends.kubernetes.config import KubernetesBackendConfig
from sandbox_service.backends.kubernetes.decode import FastApiClient
from sandbox_service.backends.kubernetes.testing.fake import FakeKubernetesAPI, running_after
from sandbox_service.models import Resources, SandboxCreate

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
fake = FakeKubernetesAPI(validate=False)
fake.kubelet = running_after(0)
tmp = Path(tempfile.mkdtemp())


def backend():
    return KubernetesBackend(
        KubernetesBackendConfig(namespace="orchard", snapshot_dir=tmp / "s", api_qps=1e6, api_burst=10**6),
        api_client=FastApiClient(k8s.Configuration(host=fake.url)),
    )


old = backend()
spec = SandboxCreate(image="python:3.12-slim")
old.start("sb-template", spec, Resources(), "s")
# clone the template's objects N-1 times (fast setup; the same bodies the backend writes)
with fake.lock:
    objs = [(k, v) for k, v in fake.objects.items() if "sb-template" in k[2]]
    for i in range(N - 1):
        for (kind, ns, name), obj in objs:
            new = copy.deepcopy(obj)
            nn = name.replace("sb-template", f"sb-{i:05d}")
            new["metadata"]["name"] = nn
            new["metadata"]["annotations"]["orchard.dev/sandbox-id"] = f"sb-{i:05d}"
            new["metadata"]["labels"]["orchard.dev/sandbox-id"] = f"sb-{i:05d}"
            if kind == "pods":
                for v in new["spec"]["volumes"]:
                    if "secret" in v:
                        v["secret"]["secretName"] = v["secret"]["secretName"].replace("sb-template", f"sb-{i:05d}")
            fake.objects[(kind, ns, nn)] = new
restarted = backend()
t = time.perf_counter()
adopted = restarted.adopt()
t_adopt = time.perf_counter() - t
t = time.perf_counter()
orphans = restarted.list_orphans()
t_orph = time.perf_counter() - t
print(
    f"N={N} adopted={len(adopted)} in {t_adopt:.2f}s; orphans={len(orphans)} in {t_orph:.3f}s; requests={len(fake.requests)}"  # noqa: E501
)
old.close()
restarted.close()
fake.close()
