"""The quiet console (`components/core/console.py`) and the runner's console (`pipelines/run_console.py`).

Quiet mode changes process-wide state (warning filters, logger levels, transformers' progress callback), so
its checks run in a fresh interpreter each."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

from components.core.console import summary_line

SCRIPT_HEAD = """
import warnings, sys
warnings.simplefilter("default")
from components.core import console
"""


def _run(body: str, quiet: bool) -> str:
    code = SCRIPT_HEAD + ("console.quiet()\n" if quiet else "") + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


WARNINGS = """
import warnings
def raise_from(module, category, message):
    exec(compile(f"import warnings\\nwarnings.warn({message!r}, {category.__name__}, stacklevel=1)", module, "exec"),
         {"__name__": module})
raise_from("mlflow.types.utils", UserWarning, "Hint: Inferred schema contains integer column(s). ...")
raise_from("transformers.training_args", FutureWarning, "`gradient_checkpointing` is deprecated and will be removed")
raise_from("transformers.modeling_utils", FutureWarning, "`is_gradient_checkpointing` is deprecated and will go")
raise_from("mlflow.types.utils", UserWarning, "Some other MLflow warning")
raise_from("somewhere.else", UserWarning, "Hint: Inferred schema contains integer column(s), elsewhere")
import logging, mlflow
logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow database tables...")
"""


def test_quiet_drops_the_known_noise_and_nothing_else():
    loud = _run(WARNINGS, quiet=False)
    assert "Inferred schema contains integer" in loud and "`gradient_checkpointing` is deprecated" in loud
    assert "`is_gradient_checkpointing` is deprecated" in loud
    quiet = _run(WARNINGS, quiet=True)
    assert "`gradient_checkpointing` is deprecated" not in quiet and "is_gradient_checkpointing" not in quiet
    assert "Inferred schema contains integer column(s). ..." not in quiet
    assert "Some other MLflow warning" in quiet  # matched by message, not by module alone
    assert "integer column(s), elsewhere" in quiet  # nor by message alone
    assert "Creating initial MLflow database tables" not in quiet


TRAINER = """
import torch
from torch import nn
from transformers import Trainer, TrainingArguments

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Linear(2, 1)
    def forward(self, x, labels):
        return {"loss": ((self.w(x).squeeze(-1) - labels) ** 2).mean()}

data = [{"x": torch.ones(2), "labels": torch.tensor(1.0)}] * 8
args = TrainingArguments(output_dir="/tmp/orchard-console-test", max_steps=3, per_device_train_batch_size=2,
                         logging_steps=1, report_to="none", use_cpu=True, save_strategy="no")
trainer = Trainer(model=Tiny(), args=args, train_dataset=data)
trainer.train()
print("history", sum(1 for h in trainer.state.log_history if "loss" in h))
"""


def test_a_trainer_prints_one_summary_line_per_step_instead_of_its_log_dict():
    loud = _run(TRAINER, quiet=False)
    assert "{'loss'" in loud  # transformers' own progress callback prints the raw dictionary
    quiet = _run(TRAINER, quiet=True)
    assert "{'loss'" not in quiet and "'grad_norm'" not in quiet
    for step in (1, 2, 3):
        assert f"step {step}/3: loss " in quiet, quiet
    assert "trained 3 step(s) in " in quiet and "history 3" in quiet  # the log history is untouched


def test_the_summary_line_reads_the_figures_first():
    logs = {
        "loss": 0.01234,
        "grad_norm": 1.5,
        "learning_rate": 5e-05,
        "reward": -0.5,
        "reward_std": 0.7,
        "completions/mean_length": 12.0,
        "epoch": 0.25,
        "num_tokens": 434.0,
    }
    assert summary_line(logs, 2, 5) == "step 2/5: loss 0.0123, reward -0.5, reward std 0.7, grad norm 1.5, lr 5e-05"
    assert summary_line({"train_runtime": 1.069, "train_loss": 0.0}, 5, 5) == "trained 5 step(s) in 1.1 s"
    assert summary_line({"reward": None}, 1, 1) == "step 1/1: no figures logged"


def test_piped_output_keeps_tables_at_full_width():
    from pipelines.report import RunReport, EvalRow, to_rich
    from pipelines.run_console import PIPED_WIDTH, make_console

    buffer = io.StringIO()
    console = make_console(file=buffer)
    assert not console.is_terminal and console.width == PIPED_WIDTH
    report = RunReport(
        rows=[
            EvalRow(
                policy=p,
                resolved_rate=0.3125,
                resolved_rate_ci95=(0.105, 0.596),
                resolved=5,
                evaluated=16,
                pass_at_k=0.3125,
                infra_error_rate=0.0,
                mean_steps=6.0,
                hidden_pass_fraction=0.406,
            )
            for p in ("teacher", "untrained", "sft", "rl")
        ]
    )
    console.print(to_rich(report))
    rows = [line for line in buffer.getvalue().splitlines() if "31.2% [10.5, 59.6]" in line]
    assert len(rows) == 4  # one line per policy: no cell wrapped onto a second line
    assert "hidden" in buffer.getvalue()  # every column at full width


def test_a_narrow_terminal_drops_columns_never_wraps_a_cell():
    from rich.console import Console

    from pipelines.report import RICH_COLUMNS, RunReport, EvalRow, to_rich

    report = RunReport(
        rows=[
            EvalRow(
                policy="teacher",
                resolved_rate=0.3125,
                resolved_rate_ci95=(0.105, 0.596),
                resolved=5,
                evaluated=16,
                pass_at_k=0.3125,
                infra_error_rate=0.0,
                mean_steps=6.0,
                hidden_pass_fraction=0.406,
            )
        ]
    )
    for width, kept in ((80, 6), (60, 4)):
        buffer = io.StringIO()
        Console(file=buffer, width=width).print(to_rich(report, width=width))
        lines = buffer.getvalue().splitlines()
        assert max(len(line) for line in lines) <= width
        (row,) = [line for line in lines if "teacher" in line]
        assert "31.2% [10.5, 59.6]" in row and "5 / 16" in row  # whole cells, on the policy's line
        header = next(line for line in lines if "policy" in line)
        assert [c in header for c in RICH_COLUMNS] == [True] * kept + [False] * (len(RICH_COLUMNS) - kept), header
