"""Scripts that train, evaluate and publish the model; run from a checkout as `python -m training.<script>`."""
