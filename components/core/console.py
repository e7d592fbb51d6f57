"""What a pipeline run prints: quiet by default (what a researcher reads), everything with `--verbose`.

Quiet (`quiet()`, called once by the CLI before a run) leaves each stage's own progress bar (on a terminal; none
when the output goes to a file or a pipe) and the runner's lines, and removes what says nothing about the run:
- warnings the libraries raise on every call for things we do on purpose, each matched by its module and the start
  of its message (never a whole category): MLflow's integer-column schema hint on every dataset we log (task
  seeds and difficulties are whole numbers, never missing) and transformers' renames (`gradient_checkpointing` ->
  `activation_checkpointing`) that TRL still calls; MLflow's "dataset source can be interpreted in multiple
  ways" is not raised at all (`components.core.tracking` names the source);
- library INFO logs (MLflow's database set-up, transformers' and datasets' notices) and Hugging Face's
  "Loading weights" / "Writing model shards" bars;
- the stage tables a stage prints when it runs on its own (an evaluation's metric table): the runner prints one
  line per stage instead (`stage_tables()`);
- a Trainer's raw log dictionaries, one per optimizer step (TRL's GRPO prints ~20 keys): one line per step with
  the figures read first (loss, reward, entropy, KL, gradient norm, learning rate) instead.

Verbose (`--verbose`) changes nothing: every warning, log and table as the libraries print them.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers.trainer_callback import ProgressCallback

# (category, module regex, message regex): the warnings quiet mode drops, each for a reason in the docstring.
QUIET_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    (UserWarning, r"mlflow\.types\..*", r"Hint: Inferred schema contains integer column"),
    (FutureWarning, r"transformers\..*", r"`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated"),
)
QUIET_LOGGERS = ("mlflow", "transformers", "datasets", "httpx", "alembic", "trl")

_state = {"quiet": False}


def quiet() -> None:
    """Quiet console for the rest of this process (module docstring); idempotent. Imports transformers' Trainer
    (seconds): call it once the run's cheap checks passed."""
    if _state["quiet"]:
        return
    _state["quiet"] = True
    for category, module, message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    import mlflow  # noqa: F401 - mlflow sets its loggers' levels when first imported: import it, then override

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # transformers' own bars (loading weights, writing shards) follow the hub's switch
    import transformers.trainer

    # The Trainer picks its progress callback from this module attribute when it is built (transformers swaps in
    # its notebook bar the same way): ours keeps the bar and prints one line per step instead of the log dict.
    transformers.trainer.DEFAULT_PROGRESS_CALLBACK = _summary_progress()


def no_bars_when_piped() -> None:
    """When stderr is a log file or a pipe, where a bar's redraws are noise: tqdm's own switch (TQDM_DISABLE) for
    every bar that does not set `disable` itself. tqdm reads it when first imported: call this before."""
    if not sys.stderr.isatty():
        os.environ.setdefault("TQDM_DISABLE", "1")


def is_quiet() -> bool:
    return _state["quiet"]


def stage_tables() -> bool:
    """Whether a stage prints its own summary table (False under a quiet pipeline run: the runner says it)."""
    return not _state["quiet"]


def summary_line(logs: dict[str, Any], step: int, max_steps: int) -> str:
    """One line for a Trainer's log dictionary: the step and the figures a researcher reads first."""
    names = (
        ("loss", "loss"),
        ("reward", "reward"),
        ("reward_std", "reward std"),
        ("entropy", "entropy"),
        ("kl", "kl"),
        ("grad_norm", "grad norm"),
        ("learning_rate", "lr"),
    )
    parts = []
    for key, label in names:
        value = logs.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{label} {value:.3g}")
    if "train_runtime" in logs:
        return f"trained {step} step(s) in {float(logs['train_runtime']):.1f} s"
    return f"step {step}/{max_steps}: " + (", ".join(parts) or "no figures logged")


def _summary_progress() -> type[ProgressCallback]:
    """transformers' ProgressCallback whose log lines are `summary_line`s, not the raw log dictionary."""
    from transformers.trainer_callback import ProgressCallback

    class SummaryProgressCallback(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and self.training_bar is not None and logs:
                self.training_bar.write(summary_line(logs, state.global_step, state.max_steps))

    return SummaryProgressCallback
