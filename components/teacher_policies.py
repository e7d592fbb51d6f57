"""The policies a teacher config makes (`components.core.policy.teacher.TeacherConfig`), for the stages that run a
teacher (distill's trajectories, credit's Monte-Carlo continuations): the recipe's scripted expert or an
OpenAI-compatible endpoint. Here, above the recipes, because a scripted teacher is the recipe's own."""

from __future__ import annotations

from typing import Callable

from components.core.policy.policies import OpenAICompatiblePolicy
from components.core.policy.base import Policy
from components.core.policy.teacher import TeacherConfig
from components.recipes import get_scripted_teacher


def teacher_factory(teacher: TeacherConfig, recipe: str, base_seed: int) -> Callable[[int], Policy]:
    """seed -> policy for a teacher config: a fresh (stateful) scripted teacher per episode, or one shared
    endpoint client."""
    if teacher.kind == "openai":
        shared = OpenAICompatiblePolicy(teacher.endpoint)
        return lambda seed: shared
    return lambda seed: get_scripted_teacher(recipe, teacher.error_rate, base_seed + seed)
