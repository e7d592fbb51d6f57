"""PipelineConfig: one pipeline run as one typed object that *embeds* each stage's own config.

There is no second set of knobs: `config.sft` is a `components.sft.stage.SFTConfig`, `config.rl` a
`components.rl.stage.RLConfig`, and so on, so a field added to a stage's config is a pipeline setting at
once (in presets, `--set`, `orchard config show`, MLflow params) with its own name and description.
`--set sft.steps=400` and `--set rl.rollout.group_size=8` use the stage configs' field names.

Fields the pipeline owns (one value for the whole run) are copied into every stage config that has
a field of that name, and may not be set per stage:
  recipe, seed        -> each stage's `recipe` / `seed`
  model               -> the init-policy stage's config (`model.path`: a checkpoint; None: the tiny
                         model `model.tiny`, also `sft.model`); its load options (`model.device`,
                         `model.dtype`, `model.attn_implementation`) -> every stage's `load`
  sandbox_url         -> each stage's `sandbox.url` (the token never enters the config: it comes from
                         the environment, i.e. a Secret on the cluster, when the stage runs)

Presets ("quick": plain `orchard run`, a few minutes, shows learning; "demo": the `make demo` run, < 15 min on 2
CPU cores; "tiny": a smoke test of the wiring for tests, under a minute, shows no learning; "smol": SmolLM2-135M-
Instruct with a powered evaluation, hours) are nested overrides on top of the stage configs' own defaults.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sandbox_service.connection import SandboxConnection
from components.core.data.episode_traces import TraceConfig
from components.core.policy.modeling import InitPolicyConfig, LoadOptions, ModelConfig
from components.recipes import RecipeName
from components.core.rendering.tool_formats import ToolFormatSetting
from components.accumulate import RetrainConfig
from components.credit.stage import CreditConfig
from components.distill import DistillConfig
from components.evaluate import EvalConfig
from components.promote import PromotionConfig
from components.provision import ProvisionConfig
from components.rl.config import RLConfig
from components.sft.stage import SFTConfig

# Top-level fields copied into the stage configs (see the module docstring).
SHARED_FIELDS = ("recipe", "seed")
# Sections that belong to the run, not to a stage.
_RUN_SECTIONS = ("failure", "resources", "harness")


class ConfigError(ValueError):
    """A bad preset, --set, recipe or config file: the message is one line saying what to change."""


class FailurePolicy(BaseModel):
    """When a stage fails instead of handing its output on (a bad rollout is data; a bad stage is not)."""

    model_config = ConfigDict(extra="forbid")
    max_infra_error_rate: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="A stage fails when at least this share of its episodes ended in infrastructure errors "
        "(1.0: only when all of them did).",
    )
    per_stage: dict[str, float] = Field(
        default_factory=dict, description="Per-stage overrides of max_infra_error_rate, by stage name."
    )
    reasons_shown: int = Field(3, ge=1, description="Distinct infrastructure-error reasons quoted in the failure.")

    def limit(self, stage: str) -> float:
        return self.per_stage.get(stage, self.max_infra_error_rate)


class RunHarness(BaseModel):
    """Harness settings that are one value for the whole run (`--set harness.tool_format=hermes`)."""

    model_config = ConfigDict(extra="forbid")
    tool_format: ToolFormatSetting | None = Field(
        None,
        description="The trained model's tool-call format, copied into sft.tool_format, "
        "rl.harness.tool_format and evaluate.harness.tool_format (None: those three as set).",
    )


# Kubernetes quantities: a CPU count or millicores ("2", "500m"); memory with a binary suffix ("8Gi", "512Mi").
_CPU = r"^[0-9]+(\.[0-9]+)?m?$"
_MEMORY = r"^[0-9]+(Ki|Mi|Gi|Ti)$"


class PodResources(BaseModel):
    """What the pods of a run ask the cluster for (compiled into the KFP/Argo YAML: requests are not run
    parameters). `gpu` is the one definition of "the GPU stages get a GPU" (`Stage.wants_gpu`)."""

    model_config = ConfigDict(extra="forbid")
    gpu: bool = Field(
        True,
        description="The GPU-capable stages (sft, rl) request nvidia.com/gpu (one per process), use the GPU "
        "image and go to the GPU nodes (ClusterConfig.gpu_node_selector/tolerations). False: "
        "they run on CPU on any node (the demo and tiny presets).",
    )
    stage_cpu: str = Field("2", pattern=_CPU, description="CPU request of each CPU stage (provision, distill, ...).")
    stage_memory: str = Field("8Gi", pattern=_MEMORY, description="Memory request and limit of each CPU stage.")
    train_cpu: str = Field("4", pattern=_CPU, description="CPU request of sft and rl (per PyTorchJob replica).")
    train_memory: str = Field(
        "16Gi", pattern=_MEMORY, description="Memory request and limit of sft and rl (per PyTorchJob replica)."
    )
    step_cpu: str = Field(
        "250m", pattern=_CPU, description="CPU request of the light steps: start, report, close-run, job launchers."
    )
    step_memory: str = Field("1Gi", pattern=_MEMORY, description="Memory request and limit of the light steps.")


class PipelineConfig(BaseModel):
    """Every setting of one pipeline run; the stage sections are the stages' own configs."""

    model_config = ConfigDict(extra="forbid")

    # --- The run -------------------------------------------------------------------------------
    preset: str = Field("demo", description="Preset the config started from (recorded for provenance).")
    recipe: RecipeName = Field(
        "swe",
        description="Task recipe of every stage: swe, gui, claw or a recipe "
        "another package registers (docs/guides/add-a-recipe.md).",
    )
    seed: int = Field(0, description="Seed of every stage (tasks, teacher, sampling, initialisation, data order).")
    sandbox_url: str | None = Field(None, description="Sandbox service URL (None: the local runner starts one).")
    tracking_uri: str | None = Field(None, description="MLflow URI (None: sqlite:///<runs dir>/mlflow.db).")
    experiment: str = Field("orchard", description="MLflow experiment.")
    register_model_name: str | None = Field(
        "orchard-policy",
        description="Registered model the promotion gate registers a promoted model under "
        "(None: no gate, nothing registered); copied to promote.model_name.",
    )
    failure: FailurePolicy = Field(default_factory=FailurePolicy, description="When a stage fails loudly.")
    resources: PodResources = Field(
        default_factory=PodResources, description="On a cluster: each pod's requests, and whether sft/rl get a GPU."
    )
    retrain: RetrainConfig = Field(
        default_factory=RetrainConfig, description="Scheduled retraining (accumulate stage; init-policy's start_from)."
    )
    harness: RunHarness = Field(
        default_factory=RunHarness, description="Harness settings of every stage that samples the trained model."
    )
    traces: TraceConfig | None = Field(
        None,
        description="Episodes as MLflow traces in every stage that has them (evaluate, evaluate_teacher, rl), "
        "e.g. traces.enabled=false (None: each stage's own `traces`).",
    )

    # --- The stages' own configs (one section per stage; names as in pipelines/stages.py) -------
    provision: ProvisionConfig = Field(default_factory=ProvisionConfig, description="provision stage.")
    model: InitPolicyConfig = Field(
        default_factory=InitPolicyConfig,
        description="init-policy stage: a checkpoint (path) or the tiny model; load options.",
    )
    distill: DistillConfig = Field(default_factory=DistillConfig, description="distill stage.")
    credit: CreditConfig = Field(default_factory=CreditConfig, description="credit stage.")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="sft stage.")
    rl: RLConfig = Field(default_factory=RLConfig, description="rl stage.")
    evaluate: EvalConfig = Field(
        default_factory=EvalConfig, description="evaluate-untrained, evaluate-sft and evaluate-rl stages."
    )
    evaluate_teacher: EvalConfig = Field(
        default_factory=lambda: EvalConfig(policy="scripted"),
        description="evaluate-teacher stage: the reference row (scripted teacher, or an endpoint).",
    )
    promote: PromotionConfig = Field(
        default_factory=PromotionConfig, description="promote stage: when the final model replaces the champion."
    )

    @model_validator(mode="after")
    def _share_run_fields(self) -> PipelineConfig:
        # The pipeline's recipe/seed/model/sandbox URL win; the token is never stored (see docstring).
        sandbox = SandboxConnection(url=self.sandbox_url, token=None) if self.sandbox_url else None
        # The tiny architecture's seed is the run's seed too, and its tokenizer learns the run's recipe's tasks
        # (unless the user chose the corpus): a Claw run must not train a SWE vocabulary.
        tokenizer = self.model.tiny.tokenizer
        if "corpus_recipes" not in tokenizer.model_fields_set:
            tokenizer = tokenizer.model_copy(update={"corpus_recipes": [self.recipe]})
        self.model = self.model.model_copy(
            update={"tiny": self.model.tiny.model_copy(update={"seed": self.seed, "tokenizer": tokenizer})}
        )
        for name in stage_sections():
            stage = getattr(self, name)
            update: dict[str, Any] = {f: getattr(self, f) for f in SHARED_FIELDS if f in type(stage).model_fields}
            if "sandbox" in type(stage).model_fields:
                update["sandbox"] = sandbox or stage.sandbox.model_copy(update={"token": None})
            if (
                name != "model"
                and type(stage).model_fields.get("model") is not None
                and type(stage).model_fields["model"].annotation is ModelConfig
            ):
                update["model"] = self.model.tiny
            if name != "model" and "load" in type(stage).model_fields:
                update["load"] = LoadOptions(**{f: getattr(self.model, f) for f in LoadOptions.model_fields})
            setattr(self, name, stage.model_copy(update=update))
        # The student is sampled in one tool format: SFT renders its data in the one RL and evaluation sample in.
        if self.harness.tool_format is not None:
            fmt = self.harness.tool_format
            self.sft = self.sft.model_copy(update={"tool_format": fmt})
            for name in ("rl", "evaluate"):
                section = getattr(self, name)
                setattr(
                    self,
                    name,
                    section.model_copy(update={"harness": section.harness.model_copy(update={"tool_format": fmt})}),
                )
        if self.traces is not None:
            for name in ("evaluate", "evaluate_teacher", "rl"):
                setattr(self, name, getattr(self, name).model_copy(update={"traces": self.traces}))
        formats = {
            "sft.tool_format": self.sft.tool_format,
            "rl.harness.tool_format": self.rl.harness.tool_format,
            "evaluate.harness.tool_format": self.evaluate.harness.tool_format,
        }
        if len(set(formats.values())) > 1:
            raise ValueError(
                f"one tool format for the trained model, got {formats}; set all three at once with "
                "harness.tool_format=..."
            )
        _check_imported_tasks(self)
        # The data store is one setting (retrain.data_store); provision draws its new task seeds from it.
        self.provision = self.provision.model_copy(update={"data_store": self.retrain.data_store})
        if self.register_model_name:  # one name for the registered model
            self.promote = self.promote.model_copy(update={"model_name": self.register_model_name})
        return self

    def updated(self, **overrides: Any) -> PipelineConfig:
        """A validated copy with overrides merged field by field (unlike model_copy, shared fields follow)."""
        plain = {k: v.model_dump() if isinstance(v, BaseModel) else v for k, v in overrides.items()}
        return validate(deep_merge(self.model_dump(), plain))

    @classmethod
    def preset_config(cls, name: str, **overrides: Any) -> PipelineConfig:
        """A named preset with overrides (nested dicts or models, merged field by field)."""
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}")
        plain = {k: v.model_dump() if isinstance(v, BaseModel) else v for k, v in overrides.items()}
        return validate(with_preset(name, plain))


def _check_imported_tasks(config: PipelineConfig) -> None:
    """Imported tasks (SWE-bench) carry no reference fix: a scripted teacher cannot solve them."""
    if config.provision.source.kind == "generator":
        return
    scripted = [
        name
        for name, kind in (
            ("distill.teacher", config.distill.teacher),
            ("evaluate_teacher.policy", config.evaluate_teacher.policy),
        )
        if kind == "scripted"
    ]
    teacher = config.credit.monte_carlo.teacher
    if config.credit.estimator == "monte_carlo" and (teacher is None or teacher.kind == "scripted"):
        scripted.append("credit.monte_carlo.teacher")
    if scripted:
        raise ValueError(
            f"provision.source is {config.provision.source.kind!r} (imported tasks), but {', '.join(scripted)} "
            f"{'uses' if len(scripted) == 1 else 'use'} the scripted teacher, which only solves generated tasks; give "
            "each an endpoint: distill.teacher=openai "
            "with distill.openai={...}, evaluate_teacher.policy=openai with evaluate_teacher.endpoint={...}, "
            'credit.monte_carlo.teacher={"kind": "openai", "endpoint": {...}} or credit.estimator=judge'
        )


def stage_sections() -> list[str]:
    """PipelineConfig fields that are a stage's own config."""
    return [
        n
        for n, f in PipelineConfig.model_fields.items()
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel) and n not in _RUN_SECTIONS
    ]


def deep_merge(base: dict, override: dict) -> dict:
    """`override` on top of `base`; nested dicts merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def overrides_of(config: PipelineConfig) -> dict[str, Any]:
    """The dotted settings where `config` departs from its preset (what `--set` changed), e.g. for a
    compiled pipeline's `overrides_json` default, so a run without parameters gets the compiled config."""

    def flat(data: dict, prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in data.items():
            if isinstance(value, dict) and value:
                out |= flat(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value
        return out

    preset = flat(PipelineConfig.preset_config(config.preset).model_dump(mode="json"))
    return {k: v for k, v in flat(config.model_dump(mode="json")).items() if preset.get(k, object()) != v}


def dotted_to_nested(values: dict[str, Any]) -> dict:
    """{"sft.steps": 400} -> {"sft": {"steps": 400}} (keys without dots pass through)."""
    out: dict = {}
    for key, value in values.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key}: {part} is both a value and a section")
        node[parts[-1]] = dotted_to_nested(value) if isinstance(value, dict) else value
    return out


def parse_set(items: list[str]) -> dict:
    """`["sft.steps=400", "recipe=gui"]` -> nested overrides; values are JSON when they parse, else strings."""
    flat: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects KEY=VALUE (e.g. sft.steps=400), got {item!r}")
        try:
            flat[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            flat[key.strip()] = raw
    _refuse_shared_per_stage(flat)
    return dotted_to_nested(flat)


def _refuse_shared_per_stage(flat: dict[str, Any]) -> None:
    for key in flat:
        parts = key.split(".")
        if len(parts) == 2 and parts[0] in stage_sections() and parts[1] in (*SHARED_FIELDS, "sandbox"):
            raise ConfigError(
                f"--set {key}: {parts[1]} is one value for the whole run; "
                f"set it at the top level (--set {parts[1]}=...)"
            )
        if key == "provision.data_store":
            raise ConfigError(
                "--set provision.data_store: the data store is one setting for the whole run; "
                "set retrain.data_store=..."
            )


def validate(data: dict) -> PipelineConfig:
    """PipelineConfig from plain data; a validation error becomes one ConfigError line per problem."""
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"]) or "config"
            # a section's own check (a model validator) says what it needs: the section's dump adds nothing
            given = (
                "" if err["type"] == "missing" or isinstance(err.get("input"), dict) else f" (got {err.get('input')!r})"
            )
            hint = "; `orchard config show` lists the fields" if err["type"] == "extra_forbidden" else ""
            problems.append(f"{where}: {err['msg'].removeprefix('Value error, ')}{given}{hint}")
        raise ConfigError("; ".join(problems)) from None


def resolve(
    preset: str = "demo",
    sets: list[str] | None = None,
    config_file: str | Path | None = None,
    overrides: dict | None = None,
) -> PipelineConfig:
    """The run's config: a preset, then a JSON/YAML file of overrides, then `overrides`, then `--set` items."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {', '.join(sorted(PRESETS))}")
    data: dict = {}
    if config_file:
        data = deep_merge(data, dotted_to_nested(_read_file(Path(config_file))))
    if overrides:
        data = deep_merge(data, dotted_to_nested(overrides))
    return validate(with_preset(preset, deep_merge(data, parse_set(sets or []))))


def with_preset(name: str, user: dict) -> dict:
    """Preset `name` under the user's settings. A preset's `provision.recipe_options` are written for its own
    recipe (the demo's bug families and package names are SWE's): when the user picks another recipe they are
    left out, so `--preset tiny --set recipe=claw` gets Claw's defaults instead of SWE's options."""
    preset = deep_merge({"preset": name}, PRESETS[name])
    chosen = user.get("recipe", user.get("provision", {}).get("recipe"))
    own = preset.get("recipe", preset.get("provision", {}).get("recipe", PipelineConfig.model_fields["recipe"].default))
    if chosen is not None and chosen != own and "recipe_options" in preset.get("provision", {}):
        preset["provision"] = {k: v for k, v in preset["provision"].items() if k != "recipe_options"}
    return deep_merge(preset, user)


def _read_file(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    import yaml

    try:
        data = yaml.safe_load(path.read_text())  # YAML is a superset of JSON: both load here
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML/JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings, got {type(data).__name__}")
    return data


# The demo (`make demo`): a schedule that learns in ~10 minutes on 2 CPU cores (docs/changelog.md, "What `make demo`
# shows"). Difficulty 1 tasks of two bug families (six templates whose fix lines hold no task-specific
# names) in repositories named one of two packages, so ~40 teacher trajectories give each template several
# examples; held-out tasks are new repositories that no train seed can produce (components/core/data/splits.py: the
# suite holds 37 held-out repositories at these settings), and 16 validation tasks are there to tune on. With all
# eight package names the tiny model does not learn in minutes to copy the name into its paths (the SFT
# ablation's main failure); with two it must still read it. Teacher error rate 0.1: resolved trajectories
# with few wrong edits. RL runs BAR on the SFT model; each policy is evaluated on 16 held-out tasks, k = 4 at
# RL's temperature and greedy. The report says whether RL beat SFT (paired interval) and how far RL moved it.
_DEMO: dict[str, Any] = {
    "provision": {
        "n_train": 40,
        "n_heldout": 16,
        "n_validation": 16,
        "difficulty": 1,
        "recipe_options": {"families": ["off_by_one", "wrong_operator"], "packages": ["mathkit", "listutil"]},
    },
    "model": {
        "tiny": {
            "hidden_size": 128,
            "num_hidden_layers": 2,
            "num_experts": 4,
            "tokenizer": {"vocab_size": 2048, "corpus_tasks": 64},
        }
    },
    "distill": {
        "teacher": "scripted",
        "error_rate": 0.1,
        "attempts_per_task": 1,
        "max_parallel": 2,
        "harness": {"max_steps": 12, "generation": {"max_new_tokens": 256}},
    },
    # k = 3 continuations per key state with the noise bar on (z = 2): a step is credited when all three flip from
    # failure to success (components/credit/monte_carlo.py, departure 2), which a flat value curve does for 1-2 % of
    # its steps; k = 1 with the bar off (the earlier setting) credited 16-22 %. 3x the continuations of k = 1.
    "credit": {
        "estimator": "monte_carlo",
        "max_trajectories": 3,
        "segments": {"epsilon": 0.05},
        "monte_carlo": {"k": 3, "stride": 3, "teacher_error_rate": 0.2, "max_steps": 8, "parallel": 2},
    },
    "sft": {
        "mode": "credited",
        "steps": 200,
        "learning_rate": 3e-3,
        "batch_size": 8,
        "max_len": 1024,
        "warmup_steps": 6,
    },
    # RL that does real work in minutes: 20 updates of 8 prompts each on the SFT model, TRL's GRPO with
    # BAR groups of 2 from up to 4 attempts (a group needs one success and one failure), refill pulling up to 2
    # more prompts a step to replace uniform ones, the pool baseline. A step then costs at most 10 prompts x 4 = 40
    # episodes (a third of the prompts give a mixed group at T = 0.5), so the budget of 800 bounds the demo's time
    # and never ends RL before its 20 steps (with up to 10 more prompts a step, 54 episodes a step: the budget
    # ended RL after 15 updates). Learning rate 1e-4 with KL 0.01 to the
    # SFT model: the learning benchmark's settings (scripts/bench_learning.py, docs/results.md), fixed before any
    # held-out evaluation and not tuned on one; Adam then moves a weight by up to ~2e-3 over the run where SFT moved
    # it by ~3e-3 a step, so RL can change the policy without erasing it (at 5e-5 and 5 updates it moved nothing).
    # T = 0.5: at T = 1 the demo's SFT model garbles a token of its 50-token edit in nearly every episode (0 of 40
    # resolved on training tasks it resolves greedily), so no group is mixed.
    "rl": {
        "steps": 20,
        "rollout_budget": 800,
        "learning_rate": 1e-4,
        "kl_coef": 0.01,
        "temperature": 0.5,
        "rollout": {
            "sampler": "bar",
            "group_size": 2,
            "max_rollouts_per_prompt": 4,
            "stride": 2,
            "batch_prompts": 8,
            "max_prompts_per_batch": 2,
            "refill": True,
        },
        "harness": {"max_steps": 8, "generation": {"max_new_tokens": 128}},
    },
    # Each policy on the 16 held-out tasks: k = 4 attempts at RL's training temperature (pass@1 per task from four
    # samples; the same attempt seeds for every model) and one greedy attempt. One model's turns are batched over
    # 8 concurrent episodes (batch_local).
    "evaluate": {
        "k": 4,
        "temperature": 0.5,
        "greedy": True,
        "workers": 8,
        "batch_local": True,
        "harness": {"max_steps": 8, "generation": {"max_new_tokens": 128}},
    },
    "evaluate_teacher": {
        "policy": "scripted",
        "k": 1,
        "scripted_error_rate": 0.1,
        "workers": 2,
        "harness": {"max_steps": 12, "generation": {"max_new_tokens": 128}},
    },
    # The tiny model trains on CPU in minutes: no GPU, and requests a 2-4 core node (kind, CI) can grant.
    "resources": {
        "gpu": False,
        "stage_cpu": "500m",
        "stage_memory": "2Gi",
        "train_cpu": "1",
        "train_memory": "3Gi",
        "step_cpu": "100m",
        "step_memory": "512Mi",
    },
}

_TINY: dict[str, Any] = deep_merge(
    _DEMO,
    {
        "provision": {"n_train": 4, "n_heldout": 3, "n_validation": 2, "difficulty": [1]},
        "distill": {"harness": {"max_steps": 10}},
        # k = 1: the continuations run (the wiring is exercised) but the noise bar credits no step at one pair.
        "credit": {"max_trajectories": 2, "monte_carlo": {"k": 1, "stride": 3, "max_steps": 6}},
        "sft": {
            "steps": 4,
            "batch_size": 2,
            "max_len": 1024,
            "warmup_steps": 0,
        },  # at 512 the cut dropped 75% of the loss
        # The wiring, not learning: one small update and one greedy attempt per task.
        "rl": {
            "steps": 1,
            "rollout_budget": 4,
            "learning_rate": 5e-5,
            "kl_coef": 0.0,
            "rollout": {"group_size": 2, "max_rollouts_per_prompt": 2, "stride": 2, "batch_prompts": 1},
            "harness": {"max_steps": 4, "generation": {"max_new_tokens": 64}},
        },
        "evaluate": {
            "k": 1,
            "temperature": 0.0,
            "greedy": False,
            "workers": 4,
            "harness": {"max_steps": 4, "generation": {"max_new_tokens": 64}},
        },
        "evaluate_teacher": {"harness": {"max_steps": 10, "generation": {"max_new_tokens": 64}}},
        "resources": {"stage_cpu": "250m", "stage_memory": "1Gi", "train_cpu": "500m", "train_memory": "2Gi"},
    },
)

# The quick preset (plain `orchard run`): the first run of someone new, minutes on a laptop, that shows learning and
# the promotion gate's decision. The demo's tasks, tiny model, teacher, SFT and evaluation, the training known to
# learn (docs/results-log.md: SFT 5 and 6 of 16 held-out tasks from 0 untrained, the gate promotes at p = 0.031; with
# 24 training tasks and 150 steps SFT resolved 2 of 12 in a trial, too few for the gate), and a short RL run
# (2 steps, 16 episodes) so that every stage runs and is seen: the demo's RL is sized to do real work in its
# 10 minutes, this one only shows the stage (its two updates may cost the SFT model a task, and the gate judges
# the last trained model: docs/getting-started.md shows such a run). Estimate (pipelines/estimate.py): about 2.5
# minutes on the idle
# 2-core development machine.
_QUICK: dict[str, Any] = deep_merge(
    _DEMO,
    {
        "rl": {
            "steps": 2,
            "rollout_budget": 16,
            "learning_rate": 5e-5,
            "kl_coef": 0.0,
            "temperature": 0.5,
            "rollout": {
                "sampler": "bar",
                "group_size": 4,
                "max_rollouts_per_prompt": 8,
                "stride": 4,
                "batch_prompts": 1,
                "max_prompts_per_batch": 32,
            },
            "harness": {"max_steps": 8, "generation": {"max_new_tokens": 128}},
        },
        # One greedy attempt per task: the quick run shows the stages, not a powered comparison.
        "evaluate": {"k": 1, "temperature": 0.0, "greedy": False, "workers": 4},
    },
)

# The smol preset: a real pretrained chat model (SmolLM2-135M-Instruct, converted from its PyPI wheel on first
# use: components/core/policy/named_models.py) through every stage, sized so that RL can show a difference from SFT
# with power. Untrained it answers in prose (0 tool calls): SFT teaches the protocol, RL must make it
# fix more bugs. The two single-line bug families of the demo at difficulty 1: the SFT model resolves some and
# fails others, which is what makes RL groups mixed. Not a CPU demo: hours on 2 cores (scripts/bench_smol_rl.py).
# - Evaluation with power: 100 held-out tasks in 100 distinct repositories, none reachable from a train seed, from
#   one fixed seed (the same held-out digest for every run seed; 50 validation tasks to tune on), k = 4 attempts
#   each at the RL temperature (pass@1 per task from 4 samples; intervals clustered by task and repository).
# - RL: >= 1,000 episodes over all 200 training prompts, 8 prompts per optimizer step, BAR groups of 8 from up
#   to 16 in waves of 4 with early abandon (a prompt whose first waves all fail is dropped when the posterior
#   says the rest would too) and history (a prompt never solved in its last visit is skipped, GRESO-style);
#   refill replaces each group so dropped by a kept group of another prompt, so a step keeps its 8 groups.
#   Temperature 0.7 (not 1.0: at 1.0 a small model garbles the exact edit lines; not greedy: groups must vary).
#   60 steps is an upper bound: the episode budget ends the run (about 12-15 updates). Learning rate 5e-6 and
#   the temperature are untuned first choices (no full run on this machine yet).
# - SFT: full fine-tuning at 5e-5 (a pretrained model, not one from scratch); `--set sft.lora='{"r": 16}'`
#   trains LoRA adapters instead (merged when saved).
_SMOL: dict[str, Any] = {
    "model": {"path": "smollm2-135m-instruct"},
    "provision": {
        "n_train": 200,
        "n_heldout": 100,
        "n_validation": 50,
        "heldout_seed": 1_000_003,
        "difficulty": 1,
        "recipe_options": {"families": ["off_by_one", "wrong_operator"]},
    },
    "distill": {
        "teacher": "scripted",
        "error_rate": 0.1,
        "attempts_per_task": 1,
        "max_parallel": 4,
        "harness": {"max_steps": 12, "generation": {"max_new_tokens": 256}},
    },
    "credit": {
        "estimator": "monte_carlo",
        "max_trajectories": 40,
        "segments": {"epsilon": 0.05},
        "monte_carlo": {"k": 4, "stride": 2, "teacher_error_rate": 0.2, "max_steps": 8, "parallel": 4},
    },
    "sft": {
        "mode": "credited",
        "steps": 300,
        "learning_rate": 5e-5,
        "batch_size": 8,
        "max_len": 2048,
        "warmup_steps": 20,
    },
    "rl": {
        "steps": 60,
        "rollout_budget": 1200,
        "learning_rate": 5e-6,
        "temperature": 0.7,
        "max_len": 4096,
        "rollout": {
            "sampler": "bar",
            "group_size": 8,
            "max_rollouts_per_prompt": 16,
            "stride": 4,
            "batch_prompts": 8,
            "early_stop": True,
            "history": True,
            "refill": True,
        },
        "harness": {"max_steps": 10, "generation": {"max_new_tokens": 256}},
    },
    "evaluate": {
        "k": 4,
        "temperature": 0.7,
        "workers": 4,
        "batch_local": True,
        "harness": {"max_steps": 10, "generation": {"max_new_tokens": 256}},
    },
    "evaluate_teacher": {
        "policy": "scripted",
        "k": 1,
        "scripted_error_rate": 0.1,
        "workers": 2,
        "harness": {"max_steps": 12, "generation": {"max_new_tokens": 256}},
    },
}

PRESETS: dict[str, dict[str, Any]] = {"quick": _QUICK, "demo": _DEMO, "tiny": _TINY, "smol": _SMOL}
