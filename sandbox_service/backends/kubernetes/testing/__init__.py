"""A fake Kubernetes API server for the backend's tests (OpenAPI-validated bodies, watches, CRDs)."""
