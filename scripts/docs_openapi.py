"""MkDocs hook: writes the sandbox service API reference (docs page `api/reference.md`) from the service's OpenAPI
schema.

The schema comes from the FastAPI app itself (`sandbox_service.server.app.create_app(...).openapi()`): the app is built
but never started (no backend starts, no sandbox is created), so the page always matches the routes in the code.
`python scripts/docs_openapi.py` prints the page instead (and `--json` the raw schema).
"""

from __future__ import annotations

import json
import sys
import tempfile

PAGE = "api/reference.md"
METHODS = ("get", "put", "post", "delete", "patch")


def openapi_schema() -> dict:
    """The service's OpenAPI schema, from an app built on a throw-away state directory."""
    from sandbox_service.server.app import create_app
    from sandbox_service.config import ServiceConfig

    with tempfile.TemporaryDirectory(prefix="orchard-docs-") as state:
        return create_app(ServiceConfig(state_dir=state, token="docs")).openapi()


def _ref(schema: dict) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    if schema.get("type") == "array":
        return f"array of {_ref(schema.get('items', {}))}"
    if "anyOf" in schema:
        return " or ".join(_ref(s) for s in schema["anyOf"])
    return f"`{schema.get('type', 'any')}`"


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def render(schema: dict) -> str:
    """The reference as Markdown: every route with its parameters, body and responses, then every model."""
    out = [
        f"# API reference: {schema['info']['title']} {schema['info']['version']}",
        "",
        "Generated at build time from the service's OpenAPI schema (`scripts/docs_openapi.py`); do not edit. "
        "Errors are JSON `{code, message}`. The overview is [the sandbox service API](index.md).",
        "",
    ]
    for path, item in schema["paths"].items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            out += [f"## `{method.upper()} {path}`", ""]
            if op.get("summary"):
                out += [f"**{op['summary']}**", ""]
            if op.get("description"):
                out += [op["description"].strip(), ""]
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | type | required | description |", "| --- | --- | --- | --- | --- |"]
                out += [
                    f"| `{p['name']}` | {p['in']} | {_ref(p.get('schema', {}))} | {p.get('required', False)} "
                    f"| {_cell(p.get('description'))} |"
                    for p in params
                ]
                out.append("")
            body = op.get("requestBody", {}).get("content", {})
            for media, spec in body.items():
                out += [f"Body ({media}): {_ref(spec.get('schema', {}))}", ""]
            responses = op.get("responses", {})
            if responses:
                out += ["| status | description |", "| --- | --- |"]
                out += [f"| {code} | {_cell(r.get('description'))} |" for code, r in responses.items()]
                out.append("")
    models = schema.get("components", {}).get("schemas", {})
    if models:
        out += ["## Models", ""]
    for name, model in sorted(models.items()):
        out += [f"### {name}", ""]
        if model.get("description"):
            out += [model["description"].strip(), ""]
        props = model.get("properties", {})
        if props:
            required = set(model.get("required", []))
            out += ["| field | type | required | description |", "| --- | --- | --- | --- |"]
            out += [
                f"| `{f}` | {_ref(s)} | {f in required} | {_cell(s.get('description'))} |" for f, s in props.items()
            ]
            out.append("")
        if "enum" in model:
            out += ["One of: " + ", ".join(f"`{v}`" for v in model["enum"]), ""]
    return "\n".join(out)


def on_files(files, config):
    """MkDocs hook: add the generated reference page to the site."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render(openapi_schema())))
    return files


if __name__ == "__main__":
    s = openapi_schema()
    print(json.dumps(s, indent=2) if "--json" in sys.argv else render(s))
