# The two commands a new user needs: `make demo` and `make test`. Both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-all demo bench compile images clean

$(STAMP): pyproject.toml constraints.txt scripts/install-system-deps.sh
	./scripts/install-system-deps.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip setuptools wheel
	# constraints.txt pins every transitive version we tested with (torch==2.13.0 CPU build among them).
	$(PY) -m pip install -q -c constraints.txt -e '.[openenv,trl]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-all: $(STAMP)
	$(PY) -m pytest -q -m ''

demo: $(STAMP)
	$(PY) -m pipelines.cli demo

bench: $(STAMP)
	$(PY) -m sandbox_service.bench

# Every image the manifests and pipelines use, as <registry>/<name>:<tag> (pipelines/cluster.py).
# Builder: docker, podman or buildah, whichever is installed (BUILDER= forces one). BASE= replaces
# the public base images (e.g. a local Debian root, offline); OCI_ARCHIVE_DIR= also writes
# <name>.oci.tar archives (kind load image-archive, skopeo copy). Then compile with the same names:
#   make images REGISTRY=ghcr.io/you TAG=0.1.0 && make compile REGISTRY=ghcr.io/you TAG=0.1.0
# INJECTOR_PLATFORMS=linux/amd64,linux/arm64 builds the agent injector (the one image every node runs:
# sandbox pods land anywhere) as one multi-arch manifest list; the other images stay single-arch.
REGISTRY ?= orchard
TAG ?= 0.1.0
IMAGES := sandbox-service agent-injector mlflow stage-runtime stage-runtime-gpu

images:
	@$(foreach image,$(IMAGES),BUILDER="$(BUILDER)" BASE="$(BASE)" OCI_ARCHIVE_DIR="$(OCI_ARCHIVE_DIR)" \
	  PLATFORMS="$(if $(filter agent-injector,$(image)),$(INJECTOR_PLATFORMS))" \
	  ./scripts/build-image.sh $(image) $(REGISTRY)/$(image):$(TAG) &&) true

compile: $(STAMP)
	$(PY) -m pipelines.cli compile --out build/pipelines --image-registry $(REGISTRY) --image-tag $(TAG)

clean:
	rm -rf build .pytest_cache
