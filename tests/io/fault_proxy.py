"""A fault-injecting HTTP proxy on 127.0.0.1 in front of an S3 endpoint (moto's server), for the
remote-read tests: each GET of an object's bytes can be answered 503, dropped, delayed, cut short,
or bit-flipped, while every other request (listing, HEAD, PUT) passes through untouched.

    proxy = FaultProxy(upstream_host, upstream_port)   # .port: point endpoint_override here
    proxy.fault = "503" | "drop" | "slow" | "short" | "flip" | None
    proxy.until = time.monotonic() + 10                  # optional: the fault ends then (a burst)
    proxy.times = 2                                      # optional: the fault hits this many requests, then ends
    proxy.every_read = True                              # every GET and HEAD, not only ranged GETs
    proxy.gets                                           # requests the fault applied to (a failed open's cost)
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("503", "drop", "slow", "short", "flip")


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int, slow_seconds: float = 12.0):
        self.upstream = (upstream_host, upstream_port)
        self.fault: str | None = None
        self.slow_seconds = slow_seconds
        self.until: float | None = None
        self.times: int | None = None
        self.every_read = False
        self.gets = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                ranged = self.command == "GET" and "Range" in self.headers
                fault = proxy._take() if ranged or (proxy.every_read and self.command in ("GET", "HEAD")) else None
                if fault == "drop":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if fault == "503":
                    payload = b"<Error><Code>ServiceUnavailable</Code></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if fault == "slow":
                    time.sleep(proxy.slow_seconds)
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                if fault == "flip" and data:
                    data = bytes([data[0] ^ 1]) + data[1:]
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", resp.getheader("Content-Length", "0") if self.command == "HEAD"
                                 else str(len(data)))  # HEAD: the object's size, no body
                self.end_headers()
                if fault == "short":  # the promised length, half of it sent, then the connection closed
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.wfile.write(data)

            def _forward_quietly(self):
                try:
                    self._forward()
                except OSError:  # the client gave up (a timed-out try) or the upstream is gone: nothing to say
                    self.close_connection = True

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward_quietly

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a request still sleeping ("slow") when the test ended: never a traceback in a later test

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _take(self) -> str | None:
        """The fault for one request (counted in .gets), None once its burst or its count is over."""
        with self._lock:
            if self.until is not None and time.monotonic() >= self.until:
                self.fault = self.until = None
            if self.times is not None:
                if self.times <= 0:
                    self.fault = self.times = None
                else:
                    self.times -= 1
            if self.fault is not None:
                self.gets += 1
            return self.fault

    def reset(self):
        self.fault, self.until, self.times, self.every_read, self.gets = None, None, None, False, 0

    def close(self):
        self.server.shutdown()
        self.server.server_close()
