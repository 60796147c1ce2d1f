"""A quiet HTTP handler that answers JSON: the base of the tests' fake agents."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

__all__ = ["JsonHandler"]


class JsonHandler(BaseHTTPRequestHandler):
    """Logs nothing; ``_answer`` sends ``payload`` as JSON with its length."""

    def log_message(self, *args) -> None:
        pass

    def _answer(self, code: int, payload) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
