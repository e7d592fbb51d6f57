#!/usr/bin/env bash
# One command on a machine with one NVIDIA GPU: a venv with the project + vLLM, then SFT and GRPO with
# vLLM (colocate) rollouts in sandboxes on a small Qwen3 checkpoint; prints tokens/s, episodes/min and
# peak GPU memory as one table (scripts/gpu_check.py; its figures also go to $OUT/gpu_check.json).
#
#   bash scripts/gpu_check.sh                 # everything, default sizes
#   bash scripts/gpu_check.sh --dry-run       # install, then check prerequisites and print the plan
#   VENV=/opt/venv-gpu OUT=/tmp/gc bash scripts/gpu_check.sh --rl-steps 5
#
# Why vLLM is pinned here and not in pyproject.toml/constraints.txt: TRL 1.16 accepts vLLM 0.22-0.31;
# vllm 0.31.0 pins torch==2.13.0 (our version, but its CUDA build) and needs transformers<5.18,
# huggingface_hub<2, fastapi<0.137 and numpy<2.4, while constraints.txt pins transformers 5.24.0,
# huggingface_hub 2.4.0, fastapi 0.165.0, numpy 2.4 and the CPU torch. So the GPU venv takes vLLM's
# versions of those seven packages and constraints.txt for everything else (checked with pip's resolver
# on a CPU machine; this script has NOT been run on a GPU).
set -euo pipefail

VLLM_VERSION="0.31.0"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv-gpu}"
OUT="${OUT:-$ROOT/build/gpu_check}"
PYTHON="${PYTHON:-python3}"
# constraints.txt pins that vLLM's own pins replace in the GPU venv (see above)
VLLM_OWNED="torch|transformers|torchvision|torchaudio|fastapi|huggingface[-_]hub|numpy"

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: nvidia-smi not found; this script needs a machine with an NVIDIA GPU and its driver" >&2
    [[ " $* " == *" --dry-run "* ]] || exit 1
else
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "gpu_check: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
constraints="$VENV/constraints-gpu.txt"
grep -v -i -E "^($VLLM_OWNED)==" "$ROOT/constraints.txt" > "$constraints"
echo "vllm==$VLLM_VERSION" >> "$constraints"
echo "torch==2.13.0" >> "$constraints"  # PyPI's default build of this version is the CUDA one

"$VENV/bin/pip" install --upgrade --quiet pip
echo "gpu_check: installing the project + vllm==$VLLM_VERSION (minutes; vLLM brings CUDA torch)"
"$VENV/bin/pip" install --quiet -c "$constraints" "vllm==$VLLM_VERSION" -e "$ROOT[trl]"

# The sandbox service's system packages (local backend), as on any machine that runs it.
if [[ -x "$ROOT/scripts/install-system-deps.sh" && "$(id -u)" == "0" ]]; then
    bash "$ROOT/scripts/install-system-deps.sh"
fi

cd "$ROOT"
exec "$VENV/bin/python" scripts/gpu_check.py --out "$OUT" "$@"
