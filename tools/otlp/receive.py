"""A minimal OTLP/HTTP trace receiver for tests, on the official opentelemetry-proto messages.

Run with the virtualenv scripts/registry builds (it pins opentelemetry-proto and protobuf):

    scripts/registry python tools/otlp/receive.py --port PORT --out FILE

It answers POST /v1/traces (Content-Type application/x-protobuf) by decoding the body as an
ExportTraceServiceRequest, appending one JSON line per span to FILE (trace_id, span_id and
parent_span_id in lowercase hex; name; kind; start and end in Unix nanoseconds; attributes as a
string map; status code; the resource's service.name), and answering an empty
ExportTraceServiceResponse. Anything it cannot decode gets HTTP 400 and a line on stderr.
"""

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def value(v):
    kind = v.WhichOneof("value")
    return str(getattr(v, kind)) if kind else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            try:
                req = ExportTraceServiceRequest.FromString(body)
            except Exception as e:  # noqa: BLE001 - report any decode failure
                print(f"receive.py: undecodable request: {e}", file=sys.stderr)
                self.send_error(400)
                return
            lines = []
            for rs in req.resource_spans:
                service = {a.key: value(a.value) for a in rs.resource.attributes}.get("service.name", "")
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        lines.append(json.dumps({
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent_span_id": s.parent_span_id.hex(),
                            "name": s.name,
                            "kind": s.kind,
                            "start": s.start_time_unix_nano,
                            "end": s.end_time_unix_nano,
                            "attributes": {a.key: value(a.value) for a in s.attributes},
                            "status": s.status.code,
                            "service": service,
                            "scope": ss.scope.name,
                        }))
            with open(args.out, "a", encoding="utf-8") as f:
                for line in lines:
                    f.write(line + "\n")
            out = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
