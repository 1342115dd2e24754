#!/usr/bin/env python3
"""A minimal OTLP metrics receiver for the end-to-end tests: independent of
the agent's Rust code, built on the official generated protobuf classes
(opentelemetry-proto) and grpcio.

    otlp_receiver.py [--grpc-port P] [--http-port P]
                     [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]

Serves gRPC `MetricsService/Export` and/or HTTP/protobuf `POST /v1/metrics`
(gzip bodies accepted) on 127.0.0.1, prints `{"ready": true, ...}` once
listening, then one JSON line per received request on stdout, flushed.

With `--tls-cert`/`--tls-key` (PEM) both servers speak TLS only (grpcio's
SSL credentials; Python's `ssl` for HTTP); with `--tls-client-ca` they also
require a client certificate issued by that CA (mTLS). Failed handshakes
are reported on stderr, not stdout.
"""

import argparse
import gzip
import json
import ssl
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.metrics.v1 import metrics_pb2

LOCK = threading.Lock()
TEMPORALITY = {
    metrics_pb2.AGGREGATION_TEMPORALITY_UNSPECIFIED: "unspecified",
    metrics_pb2.AGGREGATION_TEMPORALITY_DELTA: "delta",
    metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE: "cumulative",
}


def emit(obj):
    with LOCK:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def any_value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attrs(v.kvlist_value.values)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attrs(kvs):
    return {kv.key: any_value(kv.value) for kv in kvs}


def number(p):
    kind = p.WhichOneof("value")
    return getattr(p, kind) if kind else None


def metric(m):
    kind = m.WhichOneof("data")
    out = {"name": m.name, "unit": m.unit, "description": m.description, "type": kind}
    if kind in ("sum", "gauge"):
        data = getattr(m, kind)
        if kind == "sum":
            out["temporality"] = TEMPORALITY.get(data.aggregation_temporality, "?")
            out["is_monotonic"] = data.is_monotonic
        out["points"] = [
            {
                "attributes": attrs(p.attributes),
                "value": number(p),
                "start": p.start_time_unix_nano,
                "time": p.time_unix_nano,
            }
            for p in data.data_points
        ]
    elif kind == "histogram":
        out["temporality"] = TEMPORALITY.get(m.histogram.aggregation_temporality, "?")
        out["points"] = [
            {
                "attributes": attrs(p.attributes),
                "count": p.count,
                "sum": p.sum if p.HasField("sum") else None,
                "bucket_counts": list(p.bucket_counts),
                "explicit_bounds": list(p.explicit_bounds),
                "start": p.start_time_unix_nano,
                "time": p.time_unix_nano,
            }
            for p in m.histogram.data_points
        ]
    elif kind == "exponential_histogram":
        data = m.exponential_histogram
        out["temporality"] = TEMPORALITY.get(data.aggregation_temporality, "?")
        out["points"] = [
            {
                "attributes": attrs(p.attributes),
                "count": p.count,
                "sum": p.sum if p.HasField("sum") else None,
                "scale": p.scale,
                "zero_count": p.zero_count,
                "zero_threshold": p.zero_threshold,
                "offset": p.positive.offset,
                "bucket_counts": list(p.positive.bucket_counts),
                "negative_counts": list(p.negative.bucket_counts),
                "start": p.start_time_unix_nano,
                "time": p.time_unix_nano,
            }
            for p in data.data_points
        ]
    return out


def report(transport, req, headers):
    emit(
        {
            "transport": transport,
            "headers": headers,
            "resource_metrics": [
                {
                    "resource": attrs(rm.resource.attributes),
                    "scopes": [sm.scope.name for sm in rm.scope_metrics],
                    "metrics": [metric(m) for sm in rm.scope_metrics for m in sm.metrics],
                }
                for rm in req.resource_metrics
            ],
        }
    )


class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def Export(self, request, context):
        headers = {k: v for k, v in context.invocation_metadata() if not k.startswith(":")}
        report("grpc", request, headers)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class Http(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/metrics":
            self.send_error(404)
            return
        if self.headers.get("Content-Encoding", "").lower() == "gzip":
            body = gzip.decompress(body)
        req = metrics_service_pb2.ExportMetricsServiceRequest()
        try:
            req.ParseFromString(body)
        except Exception as e:  # noqa: BLE001 - report and refuse
            emit({"error": str(e)})
            self.send_error(400)
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        report("http", req, headers)
        resp = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(resp)))
        self.end_headers()
        self.wfile.write(resp)

    def log_message(self, *args):
        pass


class TlsHttpServer(ThreadingHTTPServer):
    """An HTTPS server: the TLS handshake runs in the request's thread, and
    a failed one is a line on stderr."""

    def __init__(self, addr, handler, context):
        super().__init__(addr, handler)
        self.context = context

    def finish_request(self, request, client_address):
        try:
            conn = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            sys.stderr.write(f"TLS handshake with {client_address} failed: {e}\n")
            sys.stderr.flush()
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            conn.close()


def read(path):
    with open(path, "rb") as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpc-port", type=int)
    ap.add_argument("--http-port", type=int)
    ap.add_argument("--tls-cert", help="server certificate (PEM): serve TLS only")
    ap.add_argument("--tls-key", help="server private key (PEM)")
    ap.add_argument("--tls-client-ca", help="require client certificates issued by this CA")
    a = ap.parse_args()
    tls = a.tls_cert is not None
    if tls != (a.tls_key is not None) or (a.tls_client_ca and not tls):
        ap.error("--tls-cert and --tls-key go together; --tls-client-ca needs them")
    if a.grpc_port:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
        if tls:
            creds = grpc.ssl_server_credentials(
                [(read(a.tls_key), read(a.tls_cert))],
                root_certificates=read(a.tls_client_ca) if a.tls_client_ca else None,
                require_client_auth=bool(a.tls_client_ca),
            )
            server.add_secure_port(f"127.0.0.1:{a.grpc_port}", creds)
        else:
            server.add_insecure_port(f"127.0.0.1:{a.grpc_port}")
        server.start()
    if a.http_port:
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(a.tls_cert, a.tls_key)
            if a.tls_client_ca:
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(a.tls_client_ca)
            httpd = TlsHttpServer(("127.0.0.1", a.http_port), Http, context)
        else:
            httpd = ThreadingHTTPServer(("127.0.0.1", a.http_port), Http)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
    emit(
        {
            "ready": True,
            "grpc_port": a.grpc_port,
            "http_port": a.http_port,
            "tls": tls,
            "mtls": bool(a.tls_client_ca),
        }
    )
    threading.Event().wait()


if __name__ == "__main__":
    main()
