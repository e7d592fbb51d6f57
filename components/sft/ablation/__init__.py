"""The ablation the field asks for: what do unresolved trajectories add to SFT, whole or credited?

    python -m components.sft.ablation [--work-dir build/sft_ablation] [--quick] [--bugs 1,2] ...

One command: generate SWE tasks (level 1, one- and two-bug tasks mixed by default), distill a scripted
teacher with a high error rate (so there are unresolved trajectories), label credit (Monte-Carlo with
common random numbers), then train every arm on every seed and evaluate it on the held-out tasks:
  untrained | resolved_only | whole (= resolved + whole unresolved) | credited (= resolved + rise segments)

Budget rule (budget.py), stated once: the reference arm, resolved_only, trains `resolved_epochs` epochs over
the resolved trajectories: steps_ref = ceil(E · n_resolved / B) with B = batch_size · grad_accum, so it sees
L = steps_ref · B · (loss tokens of its data / its samples) loss tokens in expectation. With
`match="loss_tokens"` (default) every other arm trains round(L / (B · its mean loss tokens per sample))
steps, i.e. the same loss tokens as the reference within half a step; it then sees fewer epochs over the
resolved data than the reference (its batches also hold unresolved samples), and the table reports how
many. With `match="resolved_epochs"` every arm trains ceil(E · its samples / B) steps: the same epochs over
the resolved data, more loss tokens, also reported. One match cannot give both (the added data are extra
loss tokens by definition), so both figures are in the table and in each arm's MLflow run.

Estimate and intervals (report.py): each (arm, seed) is evaluated with k ≥ 4 sampled attempts per held-out
task (temperature > 0), giving per-task pass@1 = resolved / valid attempts. Per task, pass@1 is averaged
over seeds (the seeds are a second source of variance the task average should integrate over); the arm's
pass@1 is the mean over tasks with its interval (clustered by task), and arm vs resolved_only (and vs untrained)
is `paired_difference_ci` over the same tasks. Evaluation attempt seeds depend on the training seed, not
on the arm, so arms are also paired in their sampling noise. The table is printed whichever arm wins.

Every arm is one MLflow run (detached, so the seeds' SFT and evaluation runs, made in worker processes,
nest under it); the run ends by printing the `mlflow ui` command for its store. Arm/seed jobs go `--jobs`
at a time in separate processes (one torch thread each); finished ones are kept when a run is resumed.
A sandbox service is started on loopback unless --sandbox-url is given.
"""

from components.sft.ablation.budget import ArmPlan, plan_arms
from components.sft.ablation.config import ALL_ARMS, ARMS, AblationConfig, quick_config
from components.sft.ablation.report import ArmResult, arm_results, print_table, t_interval
from components.sft.ablation.run import run_ablation

__all__ = [
    "ALL_ARMS",
    "ARMS",
    "AblationConfig",
    "ArmPlan",
    "ArmResult",
    "arm_results",
    "plan_arms",
    "print_table",
    "quick_config",
    "run_ablation",
    "t_interval",
]
