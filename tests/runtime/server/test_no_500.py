"""Property-based: no request body, however wrong, makes the server answer 500 or break the OpenAI shape.

The run against the real server process lives in test_real_server.py, sharing its process.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from .conftest import MODEL, fake_app, wait_ready
from .request_strategies import check_response, request_bodies


@pytest.fixture(scope="module")
def fake_client():
    app, _ = fake_app()
    with TestClient(app, raise_server_exceptions=False) as client:
        wait_ready(client)
        yield client


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=request_bodies(MODEL))
def test_fake_engine_never_500(fake_client, request):
    path, body = request
    r = fake_client.post(path, content=body, headers={"content-type": "application/json"})
    check_response(r.status_code, r.headers.get("content-type", ""), r.content)
