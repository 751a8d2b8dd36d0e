"""The API key the operator sends to the pods when it loads adapters, read from the Secret that
runtime.apiKeySecretRef names: each way it can be missing says what to do."""

from __future__ import annotations

import base64

import pytest
from kubernetes import client
from operator_specs import spec
from pagoda_operator.runtime_api_key import KeyUnavailable, read_api_key

REF = {"name": "api", "key": "token"}


class SecretsKube:
    """Kube.get for Secrets: the stored ones by name, or the apiserver's refusal."""

    def __init__(self, secrets: dict[str, dict], refusal: client.ApiException | None = None):
        self.secrets, self.refusal, self.asked = secrets, refusal, []

    def get(self, kind, namespace, name):
        self.asked.append((kind, namespace, name))
        if self.refusal is not None:
            raise self.refusal
        return self.secrets.get(name)


def secret(**data: bytes) -> dict:
    return {"kind": "Secret", "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}


def test_the_key_is_read_from_the_named_secret_in_the_services_namespace():
    kube = SecretsKube({"api": secret(token=b"s3cret\n", other=b"x")})
    assert read_api_key(kube, spec(runtime={"apiKeySecretRef": REF}), "ml") == "s3cret"
    assert kube.asked == [("Secret", "ml", "api")]


def test_no_api_key_reads_no_secret():
    kube = SecretsKube({})
    assert read_api_key(kube, spec(), "ml") is None and kube.asked == []


@pytest.mark.parametrize(
    ("kube", "message"),
    [
        (
            SecretsKube({}),
            "the Secret api that runtime.apiKeySecretRef names is not in namespace ml: create it",
        ),
        (
            SecretsKube({"api": secret(other=b"x")}),
            r"the Secret api has no key token \(runtime.apiKeySecretRef.key\): add it",
        ),
        (SecretsKube({"api": {"kind": "Secret"}}), "the Secret api has no key token"),
        (SecretsKube({"api": secret(token=b"  \n")}), "the key token of the Secret api is not one line"),
        (SecretsKube({"api": secret(token=b"a\nb")}), "the key token of the Secret api is not one line"),
        (
            SecretsKube({}, client.ApiException(status=403, reason="Forbidden")),
            r"could not read the Secret api .*\(403: .*\): grant its ServiceAccount get on secrets",
        ),
    ],
)
def test_a_key_that_cannot_be_read_says_what_is_missing(kube, message):
    with pytest.raises(KeyUnavailable, match=message):
        read_api_key(kube, spec(runtime={"apiKeySecretRef": REF}), "ml")
