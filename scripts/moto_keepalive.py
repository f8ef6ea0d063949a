"""moto's server application behind waitress, which keeps HTTP/1.1 connections alive.

moto's own server (werkzeug) closes the connection after every response, so each request pays a
new TCP connection on the client side, which a client of real DynamoDB and SQS does not. The
benchmarks use this server so their CPU figures measure the function, not reconnection.

Usage: moto_keepalive.py PORT
"""

import sys

import waitress
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

app = DomainDispatcherApplication(create_backend_app)
# Enough connections for a thousand requests in flight at once (the default is 100).
waitress.serve(
    app,
    host="127.0.0.1",
    port=int(sys.argv[1]),
    threads=16,
    connection_limit=2000,
    _quiet=True,
)
