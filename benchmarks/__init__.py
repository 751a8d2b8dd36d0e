"""Repository tooling beside the results it writes: the sweeps, profiles and micro-benchmarks that
are not `pagoda-runtime bench`, and the writer of BENCHMARKS.md's tables. Run from the repository
root, e.g. `python -m benchmarks.step_profile`; the runtime never imports it."""
