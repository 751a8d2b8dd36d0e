"""A stand-in for the runtime's LoRA API on loopback, with vLLM's bodies and status codes: GET
/v1/models (adapters carry their parent and, as root, the path they were loaded from), POST
/v1/load_lora_adapter (400 for a name already served or a folder it refuses), POST
/v1/unload_lora_adapter (404 for a name not served); with an API key, 401 to a call without it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BASE = "llama"


class FakeRuntime:
    def __init__(
        self,
        refuse: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
    ) -> None:
        self.adapters: dict[str, str] = {}  # name -> path
        self.refuse = refuse or {}  # path -> the 400's message
        self.calls: list[tuple[str, str]] = []  # (endpoint, adapter name)
        runtime = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self, code: int, body) -> None:
                data = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
                self.send_response(code)
                self.send_header(
                    "Content-Type", "application/json" if not isinstance(body, str) else "text/plain"
                )
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, code: int, message: str) -> None:
                self._answer(code, {"error": {"message": message, "type": "BadRequestError", "code": code}})

            def _refused_key(self) -> bool:
                if api_key is None or self.headers.get("Authorization") == f"Bearer {api_key}":
                    return False
                self._error(401, "Missing or incorrect API key; send it as 'Authorization: Bearer <key>'.")
                return True

            def do_GET(self) -> None:
                if self._refused_key():
                    return
                cards = [{"id": BASE, "object": "model", "root": f"/models/{BASE}", "parent": None}]
                cards += [
                    {"id": name, "object": "model", "root": path, "parent": BASE}
                    for name, path in runtime.adapters.items()
                ]
                self._answer(200, {"object": "list", "data": cards})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self._refused_key():
                    return
                name = body["lora_name"]
                runtime.calls.append((self.path, name))
                if self.path == "/v1/load_lora_adapter":
                    if name in runtime.adapters:
                        return self._error(400, f"The lora adapter '{name}' has already been loaded.")
                    if body["lora_path"] in runtime.refuse:
                        return self._error(400, runtime.refuse[body["lora_path"]])
                    runtime.adapters[name] = body["lora_path"]
                    return self._answer(200, f"Success: LoRA adapter '{name}' added successfully.")
                if name not in runtime.adapters:
                    return self._error(404, f"The lora adapter '{name}' cannot be found.")
                del runtime.adapters[name]
                return self._answer(200, f"Success: LoRA adapter '{name}' removed successfully.")

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://{host}:{self.port}"

    def __enter__(self) -> FakeRuntime:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_) -> None:
        self.server.shutdown()
        self.server.server_close()
