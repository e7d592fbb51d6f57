"""Prefix-fork sampling on real sandboxes: `EpisodeSource.fork` continues a resolved teacher trajectory
from a forked snapshot, records the prefix, and `episode_tokens` (what the RL stage sends TRL) puts no loss on the
prefix."""

import pytest

from components.core.episode.harness import HarnessConfig, run_episode
from components.core.data.schema import Outcome
from components.rl.config import RLConfig
from components.rl.rollout import EpisodeSource, episode_tokens


@pytest.mark.slow  # ~20 s on a loaded 2-core box: three real episodes and a tokenizer
def test_fork_continues_from_the_teacher_snapshot_and_the_prefix_has_no_loss(sandbox_service, sandbox_client):
    from components.core.policy.modeling import TokenizerConfig
    from components.tiny_model import build_tokenizer
    from components.recipes import get_recipe, get_scripted_teacher

    recipe = get_recipe("swe", difficulty=1)
    task = recipe.tasks("train", 1, seed=5)[0]
    harness = HarnessConfig(max_steps=12, snapshot_every_step=True)
    ref = run_episode(task, recipe, get_scripted_teacher("swe", 0.0, 0), sandbox_client, harness)
    assert ref.outcome is Outcome.resolved
    config = RLConfig(harness=HarnessConfig(max_steps=12), sandbox=sandbox_service.connection())
    source = EpisodeSource(
        {task.id: task}, recipe, get_scripted_teacher("swe", 0.0, 1), sandbox_client, config, references={task.id: ref}
    )
    assert source.has_prefix(task.id) and not EpisodeSource({}, recipe, None, None, config).has_prefix(task.id)

    (forked,) = source.fork(task.id, 1, 0.5)
    traj = forked.payload
    prefix_len = traj.metadata["prefix_len"]
    turns = sum(s.role == "assistant" for s in ref.steps)
    assert traj.metadata["from_snapshot"] and 0 < prefix_len < len(traj.steps)
    assert sum(s.role == "assistant" for s in traj.steps[:prefix_len]) == max(1, min(turns - 1, round(turns / 2)))
    assert forked.prefix_steps == sum(s.role == "tool" for s in ref.steps[:prefix_len]) > 0
    assert forked.env_steps == sum(s.role == "tool" for s in traj.steps[prefix_len:]) > 0
    assert forked.reward == 1.0 and forked.forked

    (plain,) = source(task.id, 1)
    assert (plain.prefix_steps, plain.forked) == (0, False) and plain.env_steps > 0
    tokenizer = build_tokenizer(TokenizerConfig(corpus_tasks=4))
    f_ids, f_mask = episode_tokens(forked, tokenizer, max_len=100_000)
    p_ids, p_mask = episode_tokens(plain, tokenizer, max_len=100_000)
    from components.core.rendering.tokens import render_trajectory

    # episode_tokens renders in the format the episode was sampled in (the scripted teacher's text protocol)
    rendered = render_trajectory(traj, tokenizer, loss_on="assistant", tool_format=traj.metadata["tool_format"])
    assert not any(m for m, i in zip(f_mask, rendered.step_index) if i < prefix_len)
    assert any(m for m, i in zip(f_mask, rendered.step_index) if i >= prefix_len)
    assert sum(p_mask) == sum(
        render_trajectory(
            plain.payload, tokenizer, loss_on="assistant", tool_format=plain.payload.metadata["tool_format"]
        ).loss_mask
    )
