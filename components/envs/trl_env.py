"""TRL `environment_factory` classes for every registered recipe: `environment_class(name)`, `ENVIRONMENTS[name]`;
the built-ins also as `SWEEnvironment`, `GUIEnvironment`, `ClawEnvironment`.

TRL's GRPOTrainer (trl 1.16, experimental `environment_factory`) makes one instance per rollout and exposes
every public method as a tool, `reset(**row)` starts an episode (its string is appended to the prompt) and
`get_reward()` scores the finished rollout. Here the tools are the recipe's own (`RecipeBase.tools()`, built
into methods with typed signatures and docstrings, which TRL turns into JSON schemas), each call runs in the
episode's sandbox through `RecipeSession`, and `get_reward()` asks the recipe's verifier. An infrastructure
failure makes `get_reward()` return None, which TRL treats as unscorable (advantage 0), never as reward 0.

    from components.envs.trl_env import SWEEnvironment
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=ds,   # rows may carry task_index / task_id
                          environment_factory=SWEEnvironment.factory(EnvConfig(recipe="swe")))

Tokenizers with our chat format (components/core/policy/modeling.py) need `prepare_tokenizer` first: TRL parses
tool calls with a response template it only knows for public model families.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator, Mapping
from typing import Any, Callable

from components.core.policy.modeling import CHAT_TEMPLATE
from components.core.episode.recipe_base import ToolSpec
from components.envs.session import EnvConfig, SharedEnv
from components.recipes import get_recipe, recipe_class, recipe_names

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list[str],
    "object": dict,
}

# Response template of our chat format (ChatML with Hermes tool calls, components/core/rendering/chat_templates.py) for
# transformers >= 5.13 response parsing, in the shape TRL uses for Qwen3: free text, then
# `<tool_call>\n{json}\n</tool_call>` calls, up to `<|im_end|>`.
ORCHARD_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>\n",
            "close_pattern": r"\n</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def prepare_tokenizer(tokenizer):
    """Our response template (how TRL parses tool calls back out of a completion) and left padding, for
    tokenizers built by `components.core.policy.modeling`: their chat template already renders `tool_calls`
    (public model families get their response template from TRL itself)."""
    if tokenizer.chat_template != CHAT_TEMPLATE:
        raise ValueError(
            "prepare_tokenizer is for tokenizers with orchard's chat template; public model families "
            "(Qwen3, Llama 3, ...) get their response template from TRL itself"
        )
    tokenizer.response_template = ORCHARD_RESPONSE_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def _tool_method(spec: ToolSpec) -> Callable[..., str]:
    """A method named after the tool whose signature and Google-style docstring describe its arguments."""
    props: dict[str, dict] = spec.parameters.get("properties", {})
    required = set(spec.parameters.get("required", []))
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    doc_args = []
    for name, prop in sorted(props.items(), key=lambda kv: kv[0] not in required):  # required ones first
        kind = _JSON_TYPES.get(prop.get("type", "string"), str)
        annotations[name] = kind if name in required else kind | None
        default = inspect.Parameter.empty if name in required else None
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotations[name]
            )
        )
        extra = f" (one of {prop['enum']})" if "enum" in prop else ""
        doc_args.append(f"    {name}: {prop.get('description') or name.replace('_', ' ')}{extra}")

    def tool(self, *args: Any, **kwargs: Any) -> str:
        bound = inspect.signature(tool).bind(self, *args, **kwargs)
        arguments = {k: v for k, v in bound.arguments.items() if k != "self" and v is not None}
        return self._call(spec.name, arguments)

    tool.__name__ = tool.__qualname__ = spec.name
    tool.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    tool.__annotations__ = annotations
    args_doc = ("\n\nArgs:\n" + "\n".join(doc_args)) if doc_args else ""
    tool.__doc__ = f"{spec.description}{args_doc}\n\nReturns:\n    The tool's output."
    return tool


class RecipeToolEnv:
    """Base of the per-recipe classes. Only `reset`, `get_reward` and the tools are public (TRL exposes every
    public method as a tool)."""

    recipe_name: str = ""

    def __init__(self, shared: SharedEnv):
        self._shared = shared
        self._session = shared.session()

    @classmethod
    def factory(cls, config: EnvConfig | None = None) -> Callable[[], "RecipeToolEnv"]:
        """The zero-argument `environment_factory` TRL wants; instances share one client and task suite."""
        config = config or EnvConfig(recipe=cls.recipe_name)
        if config.recipe != cls.recipe_name:
            raise ValueError(f"{cls.__name__} serves recipe {cls.recipe_name!r}, not {config.recipe!r}")
        shared = SharedEnv(config)
        return lambda: cls(shared)

    def reset(
        self, task_id: str | None = None, task_index: int | None = None, seed: int | None = None, **_row: Any
    ) -> str:
        """Start an episode on a task (from the dataset row's `task_id` / `task_index`, else drawn by `seed`);
        returns the task with the recipe's instructions, appended to the prompt."""
        out = self._session.reset(task_id=task_id, task_index=task_index, seed=seed)
        if out.infra_error:
            return f"(The environment failed to start: {out.infra_error})"
        return f"{self._session.system_prompt()}\n\n{out.output}"

    def get_reward(self) -> float | None:
        """1.0 resolved / 0.0 not, from the recipe's verifier on the episode's final state; None when the
        infrastructure failed (TRL leaves such rollouts out of the advantage)."""
        if self._session.task is None:
            return None
        return self._session.verify().reward

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        if self._session.last is not None and self._session.last.done:
            return "The episode is over; no more tool calls are needed."
        out = self._session.step(name, arguments)
        if out.infra_error:
            return f"Environment error: {out.infra_error}"
        return out.output


def environment_class(recipe_name: str) -> type[RecipeToolEnv]:
    """The TRL environment class of a registered recipe (built on first use; `SWEEnvironment` is
    `environment_class("swe")`). Kept per recipe class, so a name registered anew (`recipes.refresh()`) gets
    its new recipe's tools."""
    return _environment_class(recipe_name, recipe_class(recipe_name))


@functools.cache
def _environment_class(recipe_name: str, recipe: type) -> type[RecipeToolEnv]:
    class_name = _CLASS_NAMES.get(
        recipe_name, "".join(p.title() for p in recipe_name.replace("-", "_").split("_")) + "Environment"
    )
    tools = {spec.name: _tool_method(spec) for spec in get_recipe(recipe_name).tools()}
    clash = set(tools) & {"reset", "get_reward", "factory"}
    if clash:
        raise ValueError(f"recipe {recipe_name} has tools named like environment methods: {sorted(clash)}")
    return type(
        class_name,
        (RecipeToolEnv,),
        {
            "recipe_name": recipe_name,
            "__module__": __name__,
            "__doc__": f"TRL environment of the {recipe_name} recipe.",
            **tools,
        },
    )


_CLASS_NAMES = {"swe": "SWEEnvironment", "gui": "GUIEnvironment", "claw": "ClawEnvironment"}


class _Environments(Mapping[str, type[RecipeToolEnv]]):
    """Every registered recipe's environment class by recipe name, built when first asked for."""

    def __getitem__(self, name: str) -> type[RecipeToolEnv]:
        if name not in recipe_names():
            raise KeyError(name)
        return environment_class(name)

    def __iter__(self) -> Iterator[str]:
        return iter(recipe_names())

    def __len__(self) -> int:
        return len(recipe_names())


ENVIRONMENTS: Mapping[str, type[RecipeToolEnv]] = _Environments()


def __getattr__(name: str) -> Any:
    """`SWEEnvironment`, `GUIEnvironment`, `ClawEnvironment`: the built-in recipes' classes, by their names."""
    for recipe_name, class_name in _CLASS_NAMES.items():
        if name == class_name:
            return environment_class(recipe_name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
