"""Policies: the contract, an OpenAI-compatible endpoint, local transformers and vLLM models, batching,
KV reuse, log-probabilities, checkpoints and named models, the teacher config."""
