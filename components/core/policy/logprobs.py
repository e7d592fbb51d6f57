"""Per-token log-probabilities of a causal LM, as sampled (logits / temperature): the one definition the RL
stage (recomputed sampling logprobs) and the token-level export (`components/sft/tokens.py`) share."""

from __future__ import annotations


def token_logprobs(model, input_ids, attention_mask, temperature: float = 1.0):
    """log p(token_t | tokens_<t) for t >= 1, shape [B, T-1], under logits / temperature (as sampled)."""
    import torch.nn.functional as F

    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return -F.cross_entropy(logits.transpose(1, 2), input_ids[:, 1:], reduction="none")
