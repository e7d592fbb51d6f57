"""Shared building blocks of every stage, grouped by job: `policy` (the policy contract and its implementations,
checkpoints, the teacher), `rendering` (chat templates, tool-call formats, token-level rendering), `data` (records,
stores, splits, traces), `episode` (the harness, the recipe contract, the blame rule), `statistics` (intervals,
pass@k); beside them MLflow tracking, console output, distributed launch, interrupts and the stage error."""
