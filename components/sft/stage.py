"""SFT stage: supervised fine-tuning of the policy on (credited) teacher trajectories.

One typed `SFTConfig` (logged to MLflow as params), the transformers `Trainer` for the loop, and a
callback that logs loss, learning rate, tokens/s and the masked-token fraction every step. Loss only on
the assistant tokens `data` selects for the mode; length-grouped batches keep padding low on CPU.
The result is a `save_pretrained` directory (model + tokenizer) that `load_policy_model` and
`LocalTransformersPolicy` read; `base_model_dir=None` starts from a fresh tiny model.

Distributed: launched by `torchrun` / `accelerate launch` (configs in configs/accelerate/: DDP, FSDP2,
DeepSpeed ZeRO-3) or a PyTorchJob, every rank runs `train_sft` and Trainer shards the data and syncs
gradients; only the main process opens the MLflow run and writes the model and the result.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from components.core.distributed import LaunchConfig, barrier, is_main_process, world_size
from components.core.interrupts import trainer_callback
from components.core.policy.modeling import (
    LoadOptions,
    ModelConfig,
    PolicySpec,
    load_policy,
    num_parameters,
    resolve_device,
)
from components.tiny_model import init_policy
from components.core.data.parquet_store import TrajectoryStore
from components.core.rendering.tool_formats import ToolFormatSetting
from components.core.tracking import TrackingConfig, curve, log_dataset_input, log_json, log_metrics, stage_run
from components.sft.data import DataStats, PadCollator, SampleDataset, SFTMode, build_samples


class LoraOptions(BaseModel):
    """LoRA adapters through peft: the base weights stay frozen, only the adapters train; they are merged into
    the weights when the model is saved, so every later stage loads an ordinary checkpoint."""

    model_config = ConfigDict(extra="forbid")
    r: int = Field(16, ge=1, description="Rank of each adapter.")
    alpha: float = Field(32.0, gt=0, description="lora_alpha: the adapter's update is scaled by alpha / r.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapters' input.")
    target_modules: list[str] | str = Field(
        "all-linear", description="peft target_modules ('all-linear': every linear layer but the output head)."
    )


class SFTConfig(BaseModel):
    """Everything that decides an SFT run."""

    model_config = ConfigDict(extra="forbid")
    mode: SFTMode = Field("credited", description="resolved_only | whole | credited (see components/sft/data.py).")
    steps: int = Field(200, ge=1, description="Optimizer steps.")
    learning_rate: float = Field(2e-3, gt=0, description="Peak learning rate (tiny models from scratch like it high).")
    lr_scheduler: str = Field("cosine", description="transformers scheduler name.")
    warmup_steps: int = Field(10, ge=0, description="Linear warm-up steps.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping.")
    batch_size: int = Field(8, ge=1, description="Samples per micro-batch.")
    grad_accum: int = Field(1, ge=1, description="Micro-batches per optimizer step.")
    max_len: int = Field(2048, ge=16, description="Tokens per sample; longer samples are cut at the end.")
    truncation_warning: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="Warn on the console when cutting at max_len drops more than this share "
        "of the loss-bearing tokens (a cut sample loses its later turns).",
    )
    truncation_limit: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Refuse to train when cutting at max_len drops more than this share of "
        "the loss-bearing tokens (raise max_len instead).",
    )
    tool_format: ToolFormatSetting = Field(
        "auto",
        description="The tool-call format the trained model is sampled in afterwards (the evaluation and RL "
        "harness's tool_format; auto = its chat template's own): SFT renders its data in it.",
    )
    lora: LoraOptions | None = Field(
        None, description="Train LoRA adapters (peft) instead of every weight; None = full fine-tuning."
    )
    bucketing: bool = Field(True, description="Group samples of similar length into a batch (less padding).")
    seed: int = Field(0, description="Seed of data order (and of the fresh model unless model.seed differs).")
    save_every: int | None = Field(None, ge=1, description="Also save a checkpoint every N steps.")
    num_threads: int | None = Field(None, ge=1, description="torch CPU threads (None = torch default).")
    bf16: bool = Field(False, description="bf16 mixed precision (GPUs with bf16; CPU autocast otherwise).")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward (less memory, ~30 % slower)."
    )
    model: ModelConfig = Field(
        default_factory=ModelConfig,
        description="The fresh model when no base is given (built as init-policy builds it: components/tiny_model.py).",
    )
    load: LoadOptions = Field(
        default_factory=LoadOptions, description="Device, dtype and attention kernel the base checkpoint trains with."
    )
    launch: LaunchConfig = Field(
        default_factory=LaunchConfig, description="Processes of the stage in a pipeline (> 1: a PyTorchJob)."
    )


class SFTResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_dir: str
    mode: SFTMode
    steps: int
    first_loss: float
    final_loss: float
    tokens_per_second: float
    train_seconds: float
    num_parameters: int
    data: DataStats
    losses: list[float] = Field(default_factory=list, description="The loss at every optimizer step (its curve).")
    metrics: dict[str, float] = Field(default_factory=dict)


class _StepMetrics:
    """Counts tokens per optimizer step (Trainer.compute_loss sees every micro-batch)."""

    def __init__(self) -> None:
        self.tokens = 0
        self.loss_tokens = 0
        self.t0 = time.perf_counter()
        self.history: list[dict[str, float]] = []


def _trainer_classes():
    from transformers import Trainer, TrainerCallback

    class CountingTrainer(Trainer):
        def __init__(self, *args, step_metrics: _StepMetrics, **kwargs):
            super().__init__(*args, **kwargs)
            self.step_metrics = step_metrics

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            self.step_metrics.tokens += int(inputs["attention_mask"].sum())
            self.step_metrics.loss_tokens += int((inputs["labels"] != -100).sum())
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    class MetricsCallback(TrainerCallback):
        def __init__(self, m: _StepMetrics, label: str) -> None:
            self.m = m
            self.label = label
            self.bar = None

        def on_train_begin(self, args, state, control, **kwargs):
            from tqdm.auto import tqdm

            # Trainer's own bar is off (it prints dicts); this one shows what a person watches: loss, tokens/s.
            self.bar = tqdm(total=state.max_steps, desc=f"sft ({self.label})", mininterval=2.0)

        def on_train_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.close()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return
            now = time.perf_counter()
            row = {
                "loss": float(logs["loss"]),
                "learning_rate": float(logs.get("learning_rate", 0.0)),
                "grad_norm": float(logs.get("grad_norm", 0.0)),
                "tokens_per_s": self.m.tokens / max(now - self.m.t0, 1e-9),
                "masked_token_fraction": 1.0 - self.m.loss_tokens / max(self.m.tokens, 1),
                "tokens": float(self.m.tokens),
            }
            self.m.history.append(row)
            log_metrics(
                {
                    curve(1, "loss"): row["loss"],
                    curve(2, "grad_norm"): row["grad_norm"],
                    curve(3, "learning_rate"): row["learning_rate"],
                    **{k: v for k, v in row.items() if k not in ("loss", "grad_norm", "learning_rate")},
                },
                step=state.global_step,
            )
            if self.bar is not None:
                self.bar.update(state.global_step - self.bar.n)
                self.bar.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_s']:.0f}", refresh=False)
            self.m.tokens = self.m.loss_tokens = 0
            self.m.t0 = now

    return CountingTrainer, MetricsCallback


def train_on_samples(
    config: SFTConfig, model, tokenizer, dataset: SampleDataset, work_dir: Path, save_to: Path | None = None
) -> _StepMetrics:
    """The Trainer loop over prepared samples (shared by train_sft and scripts/bench_sft.py).

    `save_to`: write the trained model and tokenizer there. Every rank must call it: under FSDP or
    ZeRO-3 each holds a shard, and `Trainer.save_model` gathers them and writes on the main process."""
    import torch
    from transformers import TrainingArguments

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    CountingTrainer, MetricsCallback = _trainer_classes()
    args = TrainingArguments(
        output_dir=str(work_dir),
        max_steps=config.steps,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.grad_accum,
        learning_rate=config.learning_rate,
        lr_scheduler_type=config.lr_scheduler,
        warmup_steps=config.warmup_steps,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        logging_steps=1,
        save_strategy="steps" if config.save_every else "no",
        save_steps=config.save_every or 500,
        report_to="none",
        use_cpu=resolve_device(config.load.device) == "cpu",
        seed=config.seed,
        data_seed=config.seed,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        train_sampling_strategy="group_by_length" if config.bucketing else "random",
        disable_tqdm=True,
        bf16=config.bf16,
        activation_checkpointing=config.gradient_checkpointing,
        # CPU processes (tests, laptops) talk over gloo; GPUs over NCCL, which accelerate picks itself.
        ddp_backend="gloo" if world_size() > 1 and not torch.cuda.is_available() else None,
    )
    metrics = _StepMetrics()
    trainer = CountingTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=PadCollator(tokenizer.pad_token_id),
        callbacks=[MetricsCallback(metrics, config.mode), trainer_callback()],
        step_metrics=metrics,
    )
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # our callback logs; the printer floods stdout with dicts
    metrics.t0 = time.perf_counter()
    trainer.train()
    if save_to is not None:
        trainer.save_model(str(save_to))
        if trainer.is_world_process_zero():
            tokenizer.save_pretrained(str(save_to))
    return metrics


def train_sft(
    config: SFTConfig,
    trajectories_dir: str | Path,
    out_model_dir: str | Path,
    base_model_dir: str | Path | None = None,
    tracking: TrackingConfig | None = None,
) -> SFTResult:
    """Fine-tune on the trajectory store; writes model + tokenizer to `out_model_dir`."""
    out = Path(out_model_dir)
    trajectories = TrajectoryStore(trajectories_dir).read()
    with tempfile.TemporaryDirectory(prefix="orchard-sft-start-") as start:
        if base_model_dir is None:  # no start given (scripts, tests): made by init-policy's own path, per process
            base_model_dir = init_policy(PolicySpec(), config.model, start)
        # loaded on the CPU: the Trainer places it on the device `load.device` resolves to
        model, tokenizer = load_policy(base_model_dir, spec=config.load.model_copy(update={"device": "cpu"}))
    tool_format = None if config.tool_format == "auto" else config.tool_format
    samples, stats = build_samples(trajectories, tokenizer, config.mode, config.max_len, tool_format)
    check_truncation(config, stats)
    if not samples:
        raise ValueError(
            f"no trainable samples in {trajectories_dir} for mode {config.mode!r} ({stats.model_dump()}); "
            "resolved_only needs resolved trajectories, credited needs resolved or credit-labelled ones"
        )
    main = is_main_process()
    with stage_run("sft", config, tracking if main else None):
        used = {s.trajectory_id for s in samples}
        log_dataset_input(
            [
                {"trajectory_id": t.id, "task_id": t.task_id, "outcome": t.outcome.value, "policy_id": t.policy_id}
                for t in trajectories
                if t.id in used
            ],
            trajectories_dir,
            name=f"sft-{config.mode}",
            context="training",
        )
        log_metrics(
            {f"data.{k}": v for k, v in stats.model_dump().items()}
            | {
                "data.loss_token_fraction": stats.loss_token_fraction,
                "num_parameters": num_parameters(model),
                "world_size": world_size(),
            }
        )
        if config.lora is not None:
            model = with_lora(model, config.lora)
            log_metrics({"trainable_parameters": num_parameters(model, trainable_only=True)})
        t0 = time.perf_counter()
        history = train_on_samples(
            config,
            model,
            tokenizer,
            SampleDataset(samples),
            out / "trainer",
            save_to=None if config.lora is not None else out,
        ).history
        seconds = time.perf_counter() - t0
        if config.lora is not None:
            model = model.merge_and_unload()  # an ordinary checkpoint for every later stage
            if main:
                model.save_pretrained(str(out))
                tokenizer.save_pretrained(str(out))
        # Tokens are counted on this rank; every rank trains on an equal share of each global batch.
        tokens = sum(h["tokens"] for h in history) * world_size()
        result = SFTResult(
            model_dir=str(out),
            mode=config.mode,
            steps=config.steps,
            first_loss=history[0]["loss"],
            final_loss=history[-1]["loss"],
            tokens_per_second=tokens / seconds,
            train_seconds=seconds,
            num_parameters=num_parameters(model),
            data=stats,
            losses=[h["loss"] for h in history],
        )
        result.metrics = {
            "first_loss": result.first_loss,
            "final_loss": result.final_loss,
            "tokens_per_second": result.tokens_per_second,
            "train_seconds": seconds,
            "samples": float(len(samples)),
            "loss_token_fraction": stats.loss_token_fraction,
            "tokens": float(tokens),
        }
        if main:  # one result, one set of logs: the other ranks only trained (and helped save)
            log_metrics({f"final.{k}": v for k, v in result.metrics.items()})
            (out / "sft_result.json").write_text(result.model_dump_json(indent=2))
            log_json(result.model_dump(mode="json"), "sft_result.json")
            _log_loss_curve(history)
        barrier()  # nobody returns (and reads the model) before it is written
    return result


class TruncationError(ValueError):
    """Cutting the samples at max_len would drop more of the training signal than `truncation_limit` allows."""


def check_truncation(config: SFTConfig, stats: DataStats) -> None:
    """Warn (console) above `truncation_warning`, refuse (TruncationError) above `truncation_limit`."""
    lost = stats.truncated_loss_fraction
    if lost <= config.truncation_warning:
        return
    what = (
        f"sft: cutting samples at max_len={config.max_len} drops {lost:.0%} of the loss-bearing tokens "
        f"({stats.truncated} sample(s) cut)"
    )
    if lost > config.truncation_limit:
        raise TruncationError(
            f"{what}, above truncation_limit {config.truncation_limit:.0%}: raise sft.max_len "
            "(or shorten the episodes: harness.max_steps)"
        )
    print(f"warning: {what}; raise sft.max_len to train on whole episodes", file=sys.stderr, flush=True)


def with_lora(model, options: LoraOptions):
    """`model` wrapped with trainable LoRA adapters (peft); every other weight frozen."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(
        model,
        LoraConfig(
            r=options.r,
            lora_alpha=options.alpha,  # type: ignore[arg-type]  # peft annotates int; the scale alpha / r takes a float
            lora_dropout=options.dropout,
            target_modules=options.target_modules,
            task_type="CAUSAL_LM",
        ),
    )


def _log_loss_curve(history: list[dict[str, float]]) -> None:
    import mlflow

    if mlflow.active_run() is None or not history:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from components.core.tracking import log_figure

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([h["loss"] for h in history])
    ax.set_xlabel("step")
    ax.set_ylabel("loss (assistant tokens)")
    ax.set_title("SFT loss")
    fig.tight_layout()
    log_figure(fig, "sft_loss.png")
    plt.close(fig)
