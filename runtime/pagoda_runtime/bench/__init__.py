"""Benchmarks of the runtime: `pagoda-runtime bench ...`."""
