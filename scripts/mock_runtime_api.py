"""A minimal Lambda Runtime API for the cold-start benchmark.

Each worker process run makes three requests: GET next (gets the event), POST response, GET next
again. The second GET is answered by closing the connection, which makes the runtime's loop end
and the process exit, so a tool such as hyperfine can time start-to-exit of the real binary.

Usage: mock_runtime_api.py PORT EVENT_FILE
"""

import http.server
import sys
import time

port, event_file = int(sys.argv[1]), sys.argv[2]
with open(event_file, "rb") as f:
    EVENT = f.read()
state = {"serve_event": True, "responses": 0}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if not self.path.endswith("/runtime/invocation/next"):
            self.send_error(404)
            return
        if not state["serve_event"]:
            state["serve_event"] = True
            self.close_connection = True
            return
        state["serve_event"] = False
        deadline = int(time.time() * 1000) + 60_000
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(EVENT)))
        self.send_header("Lambda-Runtime-Aws-Request-Id", f"bench-{time.time_ns()}")
        self.send_header("Lambda-Runtime-Deadline-Ms", str(deadline))
        self.send_header("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:123456789012:function:worker")
        self.send_header("Lambda-Runtime-Trace-Id", "Root=1-00000000-000000000000000000000000")
        self.end_headers()
        self.wfile.write(EVENT)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        state["responses"] += 1
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()


http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
