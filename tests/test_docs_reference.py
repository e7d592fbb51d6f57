"""The generated reference pages (scripts/docs_reference.py, an MkDocs hook) cover what the code defines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]


def _hook():
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "scripts" / "docs_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_stage_page_has_one_row_per_stage_in_table_order():
    from pipelines import stages

    rows = [line.split("|")[1].strip() for line in _hook().stages_page().splitlines() if line.startswith("| ")][2:]
    assert rows == [s.name for s in stages.STAGES]


def test_the_config_page_documents_every_field_of_every_model_in_the_config():
    from pipelines.config import PipelineConfig

    page = _hook().config_page()
    sections = {block.split("\n", 1)[0]: block for block in page.split("\n## ")[1:]}
    models, todo = set(), [PipelineConfig]
    while todo:
        model = todo.pop()
        if model in models:
            continue
        models.add(model)
        block = sections[model.__name__]  # a model in the config with no section fails here
        for name, field in model.model_fields.items():
            assert f"| `{name}` |" in block, f"{model.__name__}.{name} is not documented"
            todo += [
                a
                for a in (field.annotation, *getattr(field.annotation, "__args__", ()))
                if isinstance(a, type) and issubclass(a, BaseModel)
            ]
    assert len(models) > 20


def test_the_recipe_page_lists_every_registered_recipe():
    from components.recipes import recipe_names

    page = _hook().recipes_page()
    assert [line.split("|")[1].strip(" `") for line in page.splitlines() if line.startswith("| `")] == recipe_names()
