# ghcr.io/orchard/stage-runtime-gpu:<version> — the training stages (SFT, RL) on an NVIDIA GPU node.
#   docker build -f pipelines/images/stage-runtime-gpu.Dockerfile -t ghcr.io/orchard/stage-runtime-gpu:0.1.0 .
# Same project as stage-runtime, with the CUDA build of the pinned torch version (SFT's Trainer
# uses the GPU when torch sees one).
FROM nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    MPLBACKEND=Agg HF_HUB_OFFLINE=1
RUN apt-get update && apt-get install -y --no-install-recommends python3.12 python3.12-venv \
    && rm -rf /var/lib/apt/lists/* && python3.12 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /opt/orchard

COPY pyproject.toml constraints.txt README.md ./
COPY sandbox_service ./sandbox_service
COPY components ./components
COPY pipelines ./pipelines
# The CUDA wheel of the same torch version first; the constraints' other pins apply as usual.
RUN TORCH=$(sed -n 's/^torch==\([0-9.]*\).*/\1/p' constraints.txt) \
    && pip install "torch==${TORCH}" --index-url https://download.pytorch.org/whl/cu126 \
    && grep -v -E '^torch==' constraints.txt > /tmp/constraints-gpu.txt \
    && pip install -c /tmp/constraints-gpu.txt . \
    && python -c "import kfp, components, pipelines"

RUN useradd --create-home --uid 1000 orchard
USER orchard
WORKDIR /home/orchard
CMD ["python", "-m", "pipelines.steps", "--help"]
