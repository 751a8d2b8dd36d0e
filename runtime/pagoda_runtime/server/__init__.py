"""The OpenAI-compatible HTTP server over the async engine, with Kubernetes health, metrics and drain."""
