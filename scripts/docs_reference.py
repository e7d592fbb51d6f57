"""MkDocs hook: writes the reference pages that the code defines, so they cannot drift from it.

- `reference/stages.md`: the stage table (`pipelines/stages.py` STAGES): each row's inputs, outputs, config
  section, placement, retries, caching;
- `reference/config.md`: every field of the run's config (`pipelines.config.PipelineConfig` and every model in
  it): type, default, description;
- `reference/recipes.md`: the registered recipes (`components.recipes`: the built-ins and installed plugins).

`python scripts/docs_reference.py [stages|config|recipes]` prints a page instead.
"""

from __future__ import annotations

import enum
import sys
import types
import typing

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

PAGES = {"stages": "reference/stages.md", "config": "reference/config.md", "recipes": "reference/recipes.md"}
GENERATED = "Generated at build time from the code (`scripts/docs_reference.py`); do not edit."


def _cell(text: object) -> str:
    return " ".join(str(text or "").split()).replace("|", "\\|")


def stages_page() -> str:
    from pipelines import stages

    out = [
        "# Stage table",
        "",
        f"{GENERATED} The table is `STAGES` in `pipelines/stages.py`: the local runner, "
        "the KFP pipeline and the Argo WorkflowTemplate are built from it, and a new stage is one row there "
        "(what each stage does: [Stages](../concepts/stages.md)).",
        "",
        "| stage | function | config | inputs | outputs | runs on | retries | cached |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in stages.STAGES:
        ins = ", ".join(f"`{arg}` ← `{ref}`" for arg, ref in s.inputs.items()) or "—"
        outs = ", ".join(f"`{name}` ({kind})" for name, kind in s.outputs.items())
        config = f"`{s.config}`" + (" (built from several sections)" if s.build_config else "")
        where = ["GPU when `resources.gpu`" if s.gpu else "CPU"]
        if s.distributed:
            where.append(f"a PyTorchJob when `{s.config}.launch` asks for more than one process")
        if s.resumable:
            where.append("resumable (its store on the run volume)")
        if s.store_volume:
            where.append("mounts the data store")
        func = f"`{s.run.__module__}.{s.run.__qualname__}`"
        out.append(
            f"| {s.name} | {func}: {_cell((s.run.__doc__ or '').strip().splitlines()[0] if s.run.__doc__ else '')} "
            f"| {config} | {ins} | {outs} | {'; '.join(where)} | {s.retries} | {'yes' if s.cache else 'no'} |"
        )
    out += [
        "",
        f"Around the stages, every runner has the steps `{stages.START}` (validate the config, open the MLflow "
        f"parent run), `{stages.REPORT}` (every stage's result into the results table) and `{stages.CLOSE}` (the "
        "exit handler).",
        "",
    ]
    return "\n".join(out)


def _type(annotation: object, models: dict[type, str]) -> str:
    """An annotation as text, models linked to their section of the page."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        models.setdefault(annotation, annotation.__name__)
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a, models) for a in args)
    if origin is typing.Annotated:
        return _type(args[0], models)
    if origin is not None:
        inner = ", ".join(_type(a, models) for a in args if a is not Ellipsis)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation)).replace("typing.", "")


def _default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "its defaults"
        return f"`{value!r}`" if value not in ([], {}) else f"`{value}` (empty)"
    if field.default is PydanticUndefined:
        return "required"
    value = field.default.value if isinstance(field.default, enum.Enum) else field.default
    return f"`{value!r}`"


def config_page() -> str:
    from pipelines.config import PipelineConfig

    out = [
        "# Configuration reference",
        "",
        f"{GENERATED} Every field of the run's config, `PipelineConfig` "
        "(`pipelines/config.py`) and each model in it, with its type, default and description. A preset "
        "changes some defaults: `orchard config --preset demo` prints a preset's resolved config, and "
        "`--set section.field=value` changes one field on any command.",
        "",
    ]
    models: dict[type, str] = {PipelineConfig: "PipelineConfig"}
    done: set[type] = set()
    while len(done) < len(models):
        model = next(m for m in models if m not in done)
        done.add(model)
        out += [f"## {model.__name__}", "", f"`{model.__module__}.{model.__qualname__}`", ""]
        doc = (model.__doc__ or "").strip()
        if doc:
            out += [" ".join(doc.split("\n\n")[0].split()), ""]
        out += ["| field | type | default | description |", "| --- | --- | --- | --- |"]
        for name, field in model.model_fields.items():
            out.append(
                f"| `{name}` | {_type(field.annotation, models)} | {_cell(_default(field))} "
                f"| {_cell(field.description)} |"
            )
        out.append("")
    return "\n".join(out)


def recipes_page() -> str:
    from components import recipes

    out = [
        "# Recipes",
        "",
        f"{GENERATED} The registered recipes: the built-ins (`components/recipes/__init__.py` "
        f"BUILT_IN) and every installed package's entry point in the group `{recipes.ENTRY_POINT_GROUP}` "
        "([add a recipe](../guides/add-a-recipe.md)). A recipe's name is what `recipe` (the config field, "
        "`--recipe`) accepts.",
        "",
        "| recipe | class | what it is |",
        "| --- | --- | --- |",
    ]
    for name in recipes.recipe_names():
        cls = recipes.recipe_class(name)
        doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip().split("\n\n")[0]
        out.append(f"| `{name}` | `{cls.__module__}.{cls.__qualname__}` | {_cell(doc)} |")
    out.append("")
    return "\n".join(out)


RENDER = {"stages": stages_page, "config": config_page, "recipes": recipes_page}


def on_files(files, config):
    """MkDocs hook: add the generated reference pages to the site."""
    from mkdocs.structure.files import File

    for key, page in PAGES.items():
        files.append(File.generated(config, page, content=RENDER[key]()))
    return files


if __name__ == "__main__":
    for key in sys.argv[1:] or list(RENDER):
        print(RENDER[key]())
