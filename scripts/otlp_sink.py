"""An OTLP/HTTP traces sink for the cold-start benchmark with tracing on: it takes every
`POST /v1/traces` and answers 200 with an empty ExportTraceServiceResponse, as a collector
layer beside the function would, and counts the requests it took on standard error at exit.

Usage: otlp_sink.py PORT
"""

import http.server
import signal
import sys

port = int(sys.argv[1])
state = {"exports": 0}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        state["exports"] += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()


def stop(*_):
    print(f"otlp sink: {state['exports']} exports", file=sys.stderr)
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
