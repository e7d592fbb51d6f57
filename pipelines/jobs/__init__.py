"""Multi-process stages on a cluster: the PyTorchJob objects and the launcher step that runs and watches them."""
