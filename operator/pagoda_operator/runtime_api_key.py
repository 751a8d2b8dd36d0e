"""The API key the operator sends to a service's pods when it loads adapters: the value of the Secret
that runtime.apiKeySecretRef names, in the service's namespace, read at each adapter sync (so a
Secret created or fixed later is picked up) and never logged. Only that Secret is read: the operator
may `get` Secrets, never list or watch them."""

from __future__ import annotations

import base64
import binascii

from kubernetes import client

from pagoda_operator.kube import Kube, api_message
from pagoda_operator.models import InferenceServiceSpec, SecretKeyRef


class KeyUnavailable(Exception):
    """The key cannot be read; the sentence says what is missing and what to do."""


def key_in_secret(secret: dict | None, ref: SecretKeyRef, namespace: str) -> str:
    """The key in `secret` (as the apiserver returns it, None where there is none)."""
    if secret is None:
        raise KeyUnavailable(
            f"the Secret {ref.name} that runtime.apiKeySecretRef names is not in namespace {namespace}: "
            "create it, the operator sends its key to the pods to load the adapters"
        )
    encoded = (secret.get("data") or {}).get(ref.key)
    if encoded is None:
        raise KeyUnavailable(
            f"the Secret {ref.name} has no key {ref.key} (runtime.apiKeySecretRef.key): add it to the "
            "Secret or name the key that holds the pods' API key"
        )
    try:
        # A final newline (a Secret written from a file) cannot travel in a header; the runtime
        # drops it from the key it reads too (cli.api_key).
        key = base64.b64decode(encoded, validate=True).decode().strip()
    except (binascii.Error, UnicodeDecodeError):
        key = ""
    if not key or any(c in key for c in "\r\n"):
        raise KeyUnavailable(
            f"the key {ref.key} of the Secret {ref.name} is not one line of text: write the pods' API "
            "key there alone"
        )
    return key


def read_api_key(k: Kube, spec: InferenceServiceSpec, namespace: str) -> str | None:
    """The key the pods demand, None where the service sets none."""
    ref = spec.runtime.api_key_secret_ref
    if ref is None:
        return None
    try:
        secret = k.get("Secret", namespace, ref.name)
    except client.ApiException as exc:
        raise KeyUnavailable(
            f"the operator could not read the Secret {ref.name} that runtime.apiKeySecretRef names "
            f"({exc.status}: {api_message(exc)}): grant its ServiceAccount get on secrets, as the chart does"
        ) from exc
    return key_in_secret(secret, ref, namespace)
