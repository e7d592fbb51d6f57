"""MkDocs hook: the sandbox service's API reference (`api.md`), generated at build time from the service's
own OpenAPI schema (`sandbox_service.api.create_app(...).openapi()`), so the page cannot drift from the code.
Hand-written because the maintained renderers (mkdocs-swagger-ui-tag, neoteroi-mkdocs) embed a JavaScript
viewer or need the schema as a file; a plain Markdown page is searchable and checked by `--strict`."""

from __future__ import annotations

import tempfile
from typing import Any

from mkdocs.structure.files import File, Files

METHODS = ("get", "post", "put", "patch", "delete")


def _schema() -> dict[str, Any]:
    from sandbox_service.api import create_app
    from sandbox_service.config import ServiceConfig

    with tempfile.TemporaryDirectory() as state:  # the backend is built, never started
        return create_app(ServiceConfig(token="docs", state_dir=state)).openapi()


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if "enum" in schema:
        return " | ".join(f"`{v}`" for v in schema["enum"])
    return schema.get("type", "any")


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def render(spec: dict[str, Any]) -> str:
    out = [f"# API reference\n\n{spec['info']['title']} {spec['info']['version']}, generated from the service's "
           "OpenAPI schema when the site is built. Authentication, error kinds and the published-API surface are "
           "described on [the sandbox service page](sandbox-service.md).\n\n## Routes\n"]
    for path, ops in spec["paths"].items():
        for method in METHODS:
            op = ops.get(method)
            if op is None:
                continue
            out.append(f"\n### `{method.upper()} {path}`\n\n{op.get('description') or op.get('summary', '')}\n")
            params = op.get("parameters", [])
            if params:
                out.append("\n| parameter | in | type | required |\n| --- | --- | --- | --- |")
                out += [f"| `{p['name']}` | {p['in']} | {_cell(_type(p.get('schema', {})))} | "
                        f"{'yes' if p.get('required') else 'no'} |" for p in params]
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                out.append(f"\nBody ({media}): {_type(content.get('schema', {}))}")
    out.append("\n## Schemas\n")
    for name, schema in spec.get("components", {}).get("schemas", {}).items():
        out.append(f"\n### {name}\n\n{_cell(schema.get('description', ''))}\n")
        props = schema.get("properties", {})
        if props:
            required = set(schema.get("required", []))
            out.append("| field | type | required | default | description |\n| --- | --- | --- | --- | --- |")
            out += [f"| `{field}` | {_cell(_type(p))} | {'yes' if field in required else 'no'} | "
                    f"{_cell(p['default']) if 'default' in p else ''} | {_cell(p.get('description', ''))} |"
                    for field, p in props.items()]
    return "\n".join(out) + "\n"


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "api.md", content=render(_schema())))
    return files
