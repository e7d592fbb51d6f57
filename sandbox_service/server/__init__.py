"""The service's HTTP layer: the FastAPI app and its routes, auth, middleware, the pty route, file transfers."""
