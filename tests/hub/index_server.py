"""A package index on 127.0.0.1 speaking PyPI's simple API (PEP 503) and its JSON API.

``projects`` maps a normalized name to its JSON ``info`` (``name``, ``summary``, ``home_page``,
``project_urls``); ``None`` serves the project in the simple API only, as an index without a
JSON API would.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_SIMPLE = re.compile(r"^/simple/([^/]+)/?$")
_JSON = re.compile(r"^/pypi/([^/]+)/json/?$")


class IndexServer:
    """The index; ``url`` is its root, ``url + "/simple"`` what pip's ``index-url`` names."""

    def __init__(self) -> None:
        self.projects: dict[str, dict[str, Any] | None] = {}
        self.requests: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> IndexServer:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, path: str) -> tuple[int, str, bytes]:
        self.requests.append(path)
        simple, api = _SIMPLE.match(path), _JSON.match(path)
        if simple and simple[1] in self.projects:
            links = f'<a href="../../files/{simple[1]}-1.0.tar.gz">{simple[1]}-1.0.tar.gz</a>'
            return 200, "text/html", f"<html><body>{links}</body></html>".encode()
        if api and self.projects.get(api[1]) is not None:
            return 200, "application/json", json.dumps({"info": self.projects[api[1]]}).encode()
        return 404, "text/plain", b"Not Found"


def _handler(index: IndexServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            status, kind, data = index.answer(self.path)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
