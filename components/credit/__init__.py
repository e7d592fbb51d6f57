"""The credit stage: per-step credit on unresolved trajectories (entry point `stage.label_credit`)."""
