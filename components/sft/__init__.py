"""The SFT stage: supervised fine-tuning on distilled, credit-labelled trajectories (entry point `stage.train_sft`)."""
