"""MLflow pyfunc wrapper for a `save_pretrained` policy directory (models-from-code file).

`mlflow.pyfunc.load_model(uri).predict(pd.DataFrame({"prompt": [...]}))` returns one completion
per prompt, generated greedily by the registered policy.
"""

from __future__ import annotations

import mlflow
from mlflow.pyfunc import PythonModel


class PolicyPyfunc(PythonModel):
    def load_context(self, context):  # noqa: D401 - MLflow hook
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = context.artifacts["model_dir"]
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path)
        self.model.eval()

    def predict(self, context, model_input, params=None):
        import torch

        max_new_tokens = int((params or {}).get("max_new_tokens", 64))
        prompts = list(model_input["prompt"]) if hasattr(model_input, "columns") else list(model_input)
        out = []
        for prompt in prompts:
            ids = self.tokenizer(prompt, return_tensors="pt").input_ids
            with torch.no_grad():
                gen = self.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
            out.append(self.tokenizer.decode(gen[0, ids.shape[1] :], skip_special_tokens=True))
        return out


mlflow.models.set_model(PolicyPyfunc())
