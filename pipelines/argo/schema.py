"""Offline validation of Argo YAML against the Argo Workflows schema.

Neither hera nor Argo's Python packages ship the Workflow JSON schema file, but hera's models
(`hera.workflows.models`) are generated from Argo's OpenAPI spec. Their JSON schema is that spec;
we make it strict (no unknown fields, as the Argo server's strict decoding would refuse them) and
validate with `jsonschema`. What this does not check: expressions inside `{{...}}`, whether
referenced templates/parameters exist (the tests check our DAG's structure for that), and CRD
version skew with a particular cluster (`argo lint` against a server does).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jsonschema

if TYPE_CHECKING:
    from pydantic import BaseModel


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _strict(value)
    elif isinstance(node, list):
        for value in node:
            _strict(value)
    return node


@functools.cache
def argo_schema(kind: str) -> dict:
    """The strict JSON schema of an Argo resource kind (Workflow, WorkflowTemplate, CronWorkflow)."""
    from hera.workflows import models

    by_kind: dict[str, type[BaseModel]] = {
        "Workflow": models.Workflow,
        "WorkflowTemplate": models.WorkflowTemplate,
        "CronWorkflow": models.CronWorkflow,
        "ClusterWorkflowTemplate": models.ClusterWorkflowTemplate,
    }
    model = by_kind.get(kind)
    if model is None:
        raise ValueError(f"no Argo schema for kind {kind!r}")
    return _strict(model.model_json_schema(by_alias=True))


def validate_argo(document: dict) -> None:
    """Raise jsonschema.ValidationError if `document` is not a valid Argo resource of its kind."""
    if document.get("apiVersion") != "argoproj.io/v1alpha1":
        raise jsonschema.ValidationError(f"apiVersion must be argoproj.io/v1alpha1, got {document.get('apiVersion')!r}")
    jsonschema.validate(document, argo_schema(document.get("kind", "")))
