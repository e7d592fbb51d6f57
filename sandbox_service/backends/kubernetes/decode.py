"""Decoding API JSON into the `kubernetes` client's models (V1Pod, V1SecretList, ...), fast.

The client's own deserializer (`ApiClient.deserialize`, kubernetes==30) builds every model without a
configuration, so each model's constructor makes a fresh `Configuration()`, whose `debug = False`
calls `setLevel` on two loggers, which clears the cache of every logger in the process: 60 % of the
time of decoding a pod, more the more loggers the process has, and the bulk of adopting a thousand
sandboxes after a restart (one LIST of pods, ~30 models each). This decoder walks the same
`openapi_types`/`attribute_map` the client's does and builds the same models, sharing one
configuration (the client's defaults: its validation is the same), and parses timestamps with
`datetime.fromisoformat` (RFC 3339 as the API server writes them) before the client's (dateutil's).
Hand-written because the client has no hook for either; `test_kubernetes_decode` checks it returns
models equal to the client's.
"""

from __future__ import annotations

import datetime
import json
import re
from functools import lru_cache
from typing import Any

from kubernetes import client as k8s
from kubernetes.client import models

_SHARED = k8s.Configuration()  # made once: what each model would otherwise make for itself
_NATIVE = {"int": int, "long": int, "float": float, "str": str, "bool": bool}
_LIST = re.compile(r"list\[(.*)\]")
_DICT = re.compile(r"dict\(([^,]*), (.*)\)")


@lru_cache(maxsize=None)
def _model(type_name: str) -> tuple[type, tuple[tuple[str, str, str], ...]]:
    klass = getattr(models, type_name)
    return klass, tuple((attr, klass.attribute_map[attr], sub) for attr, sub in klass.openapi_types.items())


def decode(data: Any, type_name: str) -> Any:
    """`data` (parsed JSON) as the client type `type_name` ("V1Pod", "list[V1Container]", "datetime")."""
    if data is None:
        return None
    if type_name.startswith("list["):
        sub = _LIST.match(type_name).group(1)
        return [decode(item, sub) for item in data]
    if type_name.startswith("dict("):
        sub = _DICT.match(type_name).group(2)
        return {key: decode(value, sub) for key, value in data.items()}
    if (native := _NATIVE.get(type_name)) is not None:
        try:
            return native(data)
        except TypeError:  # as the client: a value of another type is kept as it is
            return data
    if type_name == "object":
        return data
    if type_name == "datetime":
        try:
            return datetime.datetime.fromisoformat(data)
        except (TypeError, ValueError):  # not RFC 3339: the client's (dateutil's) general parser
            return _CLIENT.deserialize(_Raw(data), type_name)
    if type_name == "date":
        return _CLIENT.deserialize(_Raw(data), type_name)
    klass, fields = _model(type_name)
    if not fields and not hasattr(klass, "get_real_child_model"):
        return data
    if hasattr(klass, "get_real_child_model") or not isinstance(data, dict):
        return _CLIENT.deserialize(_Raw(data), type_name)  # polymorphic or odd: the client's own way
    kwargs = {attr: decode(data[key], sub) for attr, key, sub in fields if key in data}
    return klass(local_vars_configuration=_SHARED, **kwargs)


class _Raw:
    def __init__(self, data: Any):
        self.data = json.dumps(data)


_CLIENT = k8s.ApiClient()


class FastApiClient(k8s.ApiClient):
    """An `ApiClient` whose responses are decoded by `decode` (same models, a fraction of the time)."""

    def deserialize(self, response: Any, response_type: Any) -> Any:
        if not isinstance(response_type, str) or response_type == "file":
            return super().deserialize(response, response_type)
        try:
            data = json.loads(response.data)
        except ValueError:
            data = response.data
        return decode(data, response_type)
