"""Serve one report file over HTTP, for a run on a remote machine (reach it through an SSH tunnel:
``ssh -L 8000:localhost:8000 HOST``). Standard library only; it binds to localhost by default."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def make_server(file: Path, host: str, port: int) -> ThreadingHTTPServer:
    """A server that answers ``GET /`` (and ``/report.html``) with ``file``, 404 elsewhere."""
    body = file.read_bytes()  # the page is written once; read it once

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
            if self.path not in ("/", "/" + file.name):
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per request would bury the URL the command printed

    return ThreadingHTTPServer((host, port), Handler)
