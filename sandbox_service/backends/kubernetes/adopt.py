"""Adopting a replica's running sandboxes after a service restart, from what the cluster holds.

A restart (a rollout, a crash, an OOM of the service) must not cost every running sandbox: an RL
run holding a thousand of them would lose a thousand episodes. Everything the service needs to keep
serving a sandbox is written onto its objects when it is created:
- the pod: the owner labels (`kubernetes_objects.owner_labels`), the sandbox id, the spec without its
  env (`orchard.dev/spec`), the resources it runs with (`orchard.dev/resources`, an escalation changes
  them), its creation time (the hard TTL counts from it, as the pod's activeDeadlineSeconds does), and
  from its status the agent's IP; its agent port from the container's port;
- its Secret (immutable): the agent's shared secret, the certificate of the sandbox's own CA (public:
  the CA's key was discarded once it signed the agent's certificate) and the spec's env, which may
  hold credentials and so is kept out of annotations that anyone who may read pods can see.

A sandbox is adopted when all of that is there and the pod runs with an IP before its deadline;
anything else (a half-created sandbox, an expired or failed pod, an older pod without these fields)
is left to the orphan reaper. Whether its agent answers is the service's check (`SandboxManager`).
What is not carried over: escalation history, snapshots (the service's registry of them dies with
it), exposed ports and async jobs.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from pydantic import ValidationError

from sandbox_service.backends.base import AdoptedSandbox, AgentEndpoint
from sandbox_service.backends.kubernetes.config import KubernetesBackendConfig
from sandbox_service.backends.kubernetes.objects import SECRET_KEY_AGENT, agent_address
from sandbox_service.backends.kubernetes.status import PodAssessment
from sandbox_service.models import Resources, SandboxCreate

SPEC_ANNOTATION = "orchard.dev/spec"
RESOURCES_ANNOTATION = "orchard.dev/resources"
CLAIMED_AT_ANNOTATION = "orchard.dev/claimed-at"  # a warm pod's sandbox starts at its claim, not at pod creation
SECRET_KEY_CA = "ca.crt"
SECRET_KEY_ENV = "env.json"


def pod_annotations(spec: SandboxCreate, resources: Resources, claimed_at: datetime | None = None) -> dict[str, str]:
    """What the pod carries for a later adoption (no env: it may hold credentials). `claimed_at`: when a
    warm pod became this sandbox (the warm pool's claim writes these annotations over the pool's)."""
    annotations = {
        SPEC_ANNOTATION: spec.model_dump_json(exclude={"env", "from_snapshot"}),
        RESOURCES_ANNOTATION: resources.model_dump_json(),
    }
    if claimed_at is not None:
        annotations[CLAIMED_AT_ANNOTATION] = claimed_at.isoformat()
    return annotations


def secret_entries(spec: SandboxCreate, ca_pem: str) -> dict[str, str]:
    """What the sandbox's Secret carries for a later adoption, besides the agent's secret and key."""
    return {SECRET_KEY_CA: ca_pem, SECRET_KEY_ENV: json.dumps(spec.env, sort_keys=True)}


def _secret_text(secret: Any, key: str) -> str | None:
    value = (secret.data or {}).get(key)
    return base64.b64decode(value).decode() if value is not None else None


def judge(
    sandbox_id: str,
    objects: dict[str, list[Any]],
    assess: Callable[[Any], PodAssessment],
    config: KubernetesBackendConfig,
    now: datetime,
) -> tuple[AdoptedSandbox, str] | str:
    """(the sandbox to adopt, its pod's name) from its objects by kind (`Cleanup.list_all`), or why it
    cannot be adopted. `assess` is the backend's reading of a pod's status (`assess_pod`)."""
    live = [p for p in objects.get("pod", []) if p.metadata.deletion_timestamp is None]
    if len(live) != 1:
        return f"{len(live)} live pods (a create or cleanup was cut short)"
    pod, assessment = live[0], assess(live[0])
    secrets = {s.metadata.name: s for s in objects.get("secret", [])}
    if assessment.state != "running" or not assessment.pod_ip:
        return f"pod {pod.metadata.name} is {assessment.state}: {assessment.message or 'not running'}"
    annotations = pod.metadata.annotations or {}
    try:
        spec = SandboxCreate.model_validate_json(annotations[SPEC_ANNOTATION])
        resources = Resources.model_validate_json(annotations[RESOURCES_ANNOTATION])
    except (KeyError, ValidationError) as err:
        return f"pod {pod.metadata.name} lacks a readable spec ({type(err).__name__}: {err}); made by an older service?"
    try:
        claimed = annotations.get(CLAIMED_AT_ANNOTATION)
        created = datetime.fromisoformat(claimed) if claimed else pod.metadata.creation_timestamp or now
    except ValueError as err:
        return f"pod {pod.metadata.name} has an unreadable {CLAIMED_AT_ANNOTATION} annotation: {err}"
    if created.tzinfo is None:
        created = created.replace(tzinfo=timezone.utc)
    deadline = created + timedelta(seconds=min(spec.ttl_seconds, config.max_ttl_seconds))
    if deadline <= now:
        return f"pod {pod.metadata.name} is past its hard TTL (deadline {deadline.isoformat()})"
    secret = next(
        (
            s
            for name, s in secrets.items()
            if any(v.secret is not None and v.secret.secret_name == name for v in pod.spec.volumes or [])
        ),
        None,
    )
    if secret is None:
        return f"pod {pod.metadata.name}: its Secret is gone"
    agent_secret, ca_pem, env = (_secret_text(secret, k) for k in (SECRET_KEY_AGENT, SECRET_KEY_CA, SECRET_KEY_ENV))
    if agent_secret is None or ca_pem is None or env is None:
        return f"Secret {secret.metadata.name} lacks the agent secret, CA or env (made by an older service?)"
    ports = [p.container_port for c in pod.spec.containers for p in c.ports or [] if p.name == "agent"]
    port = ports[0] if ports else config.agent_port
    endpoint = AgentEndpoint(
        transport="tcp",
        address=agent_address(assessment.pod_ip, port),
        secret=agent_secret,
        tls=True,
        ca_cert_pem=ca_pem,
    )
    return AdoptedSandbox(
        sandbox_id=sandbox_id,
        spec=spec.model_copy(update={"env": json.loads(env)}),
        resources=resources,
        secret=agent_secret,
        endpoint=endpoint,
        created_at=created,
    ), pod.metadata.name
