"""A GPU cluster in a box: ``python -m bench.sim run`` (real LOTA nodes in racks, simulated
GPUs reading through them, a report with plots) and ``python -m bench.sim model`` (the
cluster-scale trace model)."""
