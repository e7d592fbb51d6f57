# ghcr.io/orchard/stage-runtime:<version> — the CPU stages (provision, distill, credit, evaluate, report).
# Build from the repository root:
#   docker build -f pipelines/images/stage-runtime.Dockerfile -t ghcr.io/orchard/stage-runtime:0.1.0 .
# Contains kfp and this project, so KFP components run with install_kfp_package=False and Argo steps
# run `python -m pipelines.steps <step>`. Sandboxes are NOT run here: stages reach the sandbox service
# over HTTP (ORCHARD_SANDBOX_URL / the sandbox_url parameter, token from a Secret).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    MPLBACKEND=Agg HF_HUB_OFFLINE=1
RUN useradd --create-home --uid 1000 orchard
WORKDIR /opt/orchard

# Dependencies first (cached layer), with the CPU torch build the constraints pin.
COPY pyproject.toml constraints.txt README.md ./
COPY sandbox_service ./sandbox_service
COPY components ./components
COPY pipelines ./pipelines
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -c constraints.txt . \
    && python -c "import kfp, components, pipelines"

USER orchard
WORKDIR /home/orchard
ENTRYPOINT []
CMD ["python", "-m", "pipelines.steps", "--help"]
