"""An OpenID Connect issuer on loopback, as a cluster's service-account issuer looks to an STS: its
discovery document and signing keys over HTTP, and RS256 tokens signed with openssl (no JWT library
needed)."""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class OidcIssuer:
    def __init__(self, folder: Path):
        self.key = folder / "issuer.key"
        subprocess.run(["openssl", "genrsa", "-out", str(self.key), "2048"], check=True, capture_output=True)
        modulus = subprocess.run(
            ["openssl", "rsa", "-in", str(self.key), "-noout", "-modulus"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        self.jwks = {
            "keys": [
                {
                    "kty": "RSA",
                    "alg": "RS256",
                    "use": "sig",
                    "kid": "pagoda-test",
                    "n": _b64(bytes.fromhex(modulus.split("=", 1)[1])),
                    "e": _b64((65537).to_bytes(3, "big")),
                }
            ]
        }
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                documents = {
                    "/.well-known/openid-configuration": {
                        "issuer": issuer.url,
                        "jwks_uri": f"{issuer.url}/keys",
                        "response_types_supported": ["id_token"],
                        "subject_types_supported": ["public"],
                        "id_token_signing_alg_values_supported": ["RS256"],
                    },
                    "/keys": issuer.jwks,
                }
                body = json.dumps(documents.get(self.path, {})).encode()
                self.send_response(200 if self.path in documents else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def config_url(self) -> str:
        return f"{self.url}/.well-known/openid-configuration"

    def token(self, audience: str, **claims) -> str:
        """A projected service-account token as the kubelet mounts one, with more claims."""
        now = int(time.time())
        header = {"alg": "RS256", "kid": "pagoda-test", "typ": "JWT"}
        payload = {
            "iss": self.url,
            "sub": "system:serviceaccount:ml:model-reader",
            "aud": audience,
            "iat": now,
            "nbf": now,
            "exp": now + 600,
            **claims,
        }
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(payload).encode())}"
        signature = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", str(self.key)],
            input=signing_input.encode(),
            check=True,
            capture_output=True,
        ).stdout
        return f"{signing_input}.{_b64(signature)}"

    def __enter__(self) -> OidcIssuer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
