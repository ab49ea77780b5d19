"""A job handler behind HTTP, for `triage worker --http`: answers by the payload's `outcome`.

    ok            200
    fatal         400 with a reason
    transient     503 on the first attempt, then 200
    retry_after   429 with `Retry-After: <seconds>` on the first attempt, then 200
    hang          no answer for 30 s on the first attempt, then 200
    slow_body     200 at once, then a body that never ends (4 bytes of the 100 announced)

Prints its port on the first line of stdout. `GET /log` returns every job request received.
"""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = []
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        with LOCK:
            body = json.dumps(LOG).encode()
        self.answer(200, body, [("Content-Type", "application/json")])

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        payload = json.loads(raw)
        entry = {
            "at_ms": int(time.time() * 1000),
            "path": self.path,
            "content_type": self.headers.get("Content-Type"),
            "payload": payload,
        }
        entry.update({k.lower(): v for k, v in self.headers.items() if k.lower().startswith("x-triage-")})
        with LOCK:
            LOG.append(entry)
        first = entry.get("x-triage-attempt") == "1"
        outcome = payload.get("outcome", "ok")
        if outcome == "fatal":
            self.answer(400, b"bad payload: no such account")
        elif outcome == "transient" and first:
            self.answer(503, b"dependency down")
        elif outcome == "retry_after" and first:
            self.answer(429, b"slow down", [("Retry-After", str(payload.get("seconds", 2)))])
        elif outcome == "slow_body":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"done")
            self.wfile.flush()
            time.sleep(30)
        elif outcome == "hang" and first:
            time.sleep(30)
            self.answer(200)
        else:
            self.answer(200, b"done")


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(server.server_address[1], flush=True)
try:
    server.serve_forever()
except KeyboardInterrupt:
    sys.exit(0)
