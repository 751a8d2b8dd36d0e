"""Pagoda's Kubernetes operator: InferenceService objects reconciled into GPU deployments."""
