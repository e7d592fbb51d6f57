"""A local policy that samples through an in-process vLLM engine (TRL's colocated `LLM`).

Prompt rendering, stop and suppressed tokens, context limits and the result shape are
`LocalTransformersPolicy`'s; only `_sample` differs: one `LLM.generate` over the batch's prompt ids.
The engine is the one TRL's GRPOTrainer builds with `use_vllm=True, vllm_mode="colocate"` (its
`trainer.vllm_generation.llm`), created with `logprobs_mode="processed_logprobs"`, so the logprobs are
under the sampling distribution (temperature applied) as ours are; TRL pushes the trained weights into
it before each step's rollout, so episodes are sampled on-policy.

Not exercised on this project's machines (no GPU, vLLM not installable): `scripts/gpu_check.sh` runs it.
"""

from __future__ import annotations

from typing import Any

from components.core.policy.local import LocalTransformersPolicy
from components.core.policy.base import GenerationConfig


class VLLMPolicy(LocalTransformersPolicy):
    """`Policy` whose turns are sampled by `llm` (a `vllm.LLM` holding the same weights as `model`)."""

    def __init__(self, llm: Any, model: Any, tokenizer: Any, device: str = "cuda", tool_format: str | None = None):
        super().__init__(model, tokenizer, device=device, tool_format=tool_format, kv_reuse=False)  # vLLM caches itself
        self.llm = llm

    def _sample(
        self, prompts: list[list[int]], caps: list[int], config: GenerationConfig, seed: int | None
    ) -> list[tuple[list[int], list[float]]]:
        from vllm import SamplingParams

        params = [
            SamplingParams(
                n=1,
                max_tokens=cap,
                temperature=config.temperature,
                top_p=config.top_p if config.temperature > 0 else 1.0,
                stop_token_ids=list(self._stop_ids),
                stop=list(config.stop) or None,
                logprobs=0,
                # the header's special tokens never start a turn inside a turn (as `suppress_tokens` in HF generate)
                logit_bias={i: -100.0 for i in self._suppress} or None,
                skip_special_tokens=False,
                seed=None if seed is None else seed + row,
            )
            for row, cap in enumerate(caps)
        ]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sampling_params=params, use_tqdm=False)
        rows = []
        for out in outputs:
            sample = out.outputs[0]
            ids = list(sample.token_ids)
            logprobs = [lp[t].logprob if lp and t in lp else 0.0 for t, lp in zip(ids, sample.logprobs or [])]
            if isinstance(sample.stop_reason, int) and (not ids or ids[-1] != sample.stop_reason):
                # a stop token vLLM left out of the ids: the turn ends with it, as in HF generate (logprob unknown)
                ids.append(sample.stop_reason)
                logprobs.append(0.0)
            rows.append((ids, logprobs + [0.0] * (len(ids) - len(logprobs))))
        return rows
