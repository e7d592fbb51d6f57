"""The RL stage: group-relative RL on sandbox episodes (entry point `stage.train_rl`; the sampler is `sampling`)."""
