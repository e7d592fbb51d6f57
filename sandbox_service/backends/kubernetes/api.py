"""How the Kubernetes backend reaches the API server: the client, and one way to make every call.

Every call takes a token from one client-side bucket (`kubernetes_ratelimit`) and goes through one
retry policy (`kubernetes_retry`): reads retry until a deadline, writes for a number of attempts. A
create whose first answer was lost reads back what it created rather than failing on AlreadyExists.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from sandbox_service.backends.kubernetes.config import KubernetesBackendConfig
from sandbox_service.backends.kubernetes.decode import FastApiClient
from sandbox_service.backends.kubernetes.ratelimit import TokenBucket
from sandbox_service.backends.kubernetes.retry import RetryPolicy, call, is_already_exists
from sandbox_service.errors import BackendUnavailableError


def load_api_client(config: KubernetesBackendConfig) -> k8s.ApiClient:
    """An API client from the pod's service account (in a cluster) or a kubeconfig."""
    configuration = k8s.Configuration()
    in_cluster = config.api_mode == "in_cluster" or (
        config.api_mode == "auto" and "KUBERNETES_SERVICE_HOST" in os.environ
    )
    try:
        if in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(
                config_file=config.kubeconfig, context=config.context, client_configuration=configuration
            )
    except (k8s_config.ConfigException, OSError) as err:
        raise BackendUnavailableError(
            f"cannot reach a Kubernetes cluster ({'in-cluster' if in_cluster else 'kubeconfig'} mode): {err}. "
            "Run the service in the cluster (manifests/) or point ORCHARD_K8S_KUBECONFIG at a kubeconfig."
        ) from err
    configuration.connection_pool_maxsize = config.api_pool_size
    return FastApiClient(configuration)  # the client's own decoding costs ~2 ms a pod (kubernetes_decode)


class KubernetesApi:
    """The typed clients of one backend, its rate limiter and retry policy, and `call`/`create` on top."""

    def __init__(
        self, config: KubernetesBackendConfig, api_client: k8s.ApiClient, sleep: Callable[[float], None] = time.sleep
    ):
        self.config, self.api_client, self.sleep = config, api_client, sleep
        self.core = k8s.CoreV1Api(api_client)
        self.net = k8s.NetworkingV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)
        self.retry = RetryPolicy(
            attempts=config.retry_attempts,
            base_seconds=config.retry_base_seconds,
            max_seconds=config.retry_max_seconds,
            read_deadline_seconds=config.read_deadline_seconds,
        )
        self.limiter = TokenBucket(config.api_qps, config.api_burst)

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API call, rate-limited and retried; `what` ("read pod", "create secret") names it in errors,
        and its verb decides the retry budget (a read's deadline, a write's attempts)."""
        kwargs.setdefault("_request_timeout", self.config.api_timeout_seconds)
        return call(
            what,
            fn,
            *args,
            policy=self.retry,
            sleep=self.sleep,
            limiter=self.limiter.acquire,
            read=what.startswith(("read ", "list ")),
            **kwargs,
        )

    def create(self, what: str, create: Callable[..., Any], read: Callable[..., Any], body: Any) -> Any:
        """Create, or read back what an earlier attempt of this very call already created."""
        ns = self.config.namespace
        try:
            return self.call(f"create {what}", create, ns, body)
        except ApiException as err:
            if not is_already_exists(err):
                raise
            name = body["metadata"]["name"] if isinstance(body, dict) else body.metadata.name  # custom objects: dicts
            return self.call(f"read {what}", read, name, ns)

    def health(self, timeout_seconds: float = 3.0) -> str | None:
        """One LIST of at most one pod in the sandbox namespace, unretried (what every create needs: the API
        server reachable and this identity's rights there). None when it answers, else why not."""
        try:
            self.core.list_namespaced_pod(self.config.namespace, limit=1, _request_timeout=timeout_seconds)
        except ApiException as err:
            return f"the Kubernetes API answered {err.status} {err.reason} listing pods in {self.config.namespace}"
        except Exception as err:  # noqa: BLE001 - urllib3/socket errors: unreachable, whatever the class
            return f"the Kubernetes API is unreachable ({type(err).__name__}: {str(err).splitlines()[0][:200]})"
        return None
