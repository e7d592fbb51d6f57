"""One episode: the harness, the recipe contract, step results and the blame rule."""
