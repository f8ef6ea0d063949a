"""moto's server with each DynamoDB request atomic, as DynamoDB's own are.

moto's server handles requests on threads, and its DynamoDB backend checks a condition and
applies the update as two steps on the shared item, with no lock: two conditional writes to one
item can interleave, and both be applied against the item as it was before either. DynamoDB
applies each write to an item atomically (a conditional write is checked and applied in one
step: "Condition expressions", Amazon DynamoDB Developer Guide). Here every DynamoDB request
(and DynamoDB Streams') runs under one lock, which is stricter than per item and harmless at a
test's rate; the other services run as moto runs them, on their own threads (an SQS long poll
never waits for the lock).

Usage: moto_atomic.py HOST PORT
"""

import sys
import threading

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple

moto = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()


def app(environ, start_response):
    if environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB"):
        with lock:
            # The whole answer is made under the lock, not only its start.
            return list(moto(environ, start_response))
    return moto(environ, start_response)


if __name__ == "__main__":
    run_simple(
        sys.argv[1],
        int(sys.argv[2]),
        app,
        threaded=True,
        request_handler=MotoRequestHandler,
    )
