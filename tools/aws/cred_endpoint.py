#!/usr/bin/env python3
"""A loopback stand-in for the two credential sources AWS runs beside a workload, for
tests/aws_credential_endpoints.rs: the ECS/EKS container credentials endpoint and the EC2 instance
metadata service (IMDSv2). It serves keys the test got from moto's STS, so what outboxd signs with
is checked by moto (IAM authentication on) exactly as AWS would check it.

  cred_endpoint.py assume ENDPOINT ROLE_ARN
      AssumeRole at moto (ENDPOINT) with the keys in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY;
      prints {"AccessKeyId", "SecretAccessKey", "Token"} as JSON. (The role's keys, not an IAM
      user's: both sources always hand out a session token, and moto refuses a user's key that
      comes with one.)
  cred_endpoint.py serve CREDS_FILE
      serve the keys in CREDS_FILE (that JSON; an optional "Authorization" the container endpoint
      then requires) on 127.0.0.1, a free port, printed on stdout's first line. One request per
      line on stderr (method, path; never a key). Until killed.

Paths served:
  GET /creds                                         the container endpoint's document
                                                     (AWS_CONTAINER_CREDENTIALS_FULL_URI)
  PUT /latest/api/token                              an IMDSv2 session token, with the
                                                     x-aws-ec2-metadata-token-ttl-seconds header
  GET /latest/meta-data/iam/security-credentials/    the role name (token required)
  GET /latest/meta-data/iam/security-credentials/R   the instance profile's document

Secrets are passed in a file (never argv, which `ps` shows).
"""
import datetime
import json
import sys
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROLE = "outboxd-instance-role"
IMDS_CREDS = "/latest/meta-data/iam/security-credentials/"


def assume(endpoint, role_arn):
    import boto3

    sts = boto3.client("sts", endpoint_url=endpoint, region_name="us-east-1")
    c = sts.assume_role(RoleArn=role_arn, RoleSessionName="outboxd-endpoint")["Credentials"]
    print(json.dumps({"AccessKeyId": c["AccessKeyId"], "SecretAccessKey": c["SecretAccessKey"],
                      "Token": c["SessionToken"]}))


def stamp(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def serve(creds_file):
    with open(creds_file) as f:
        creds = json.load(f)
    imds_token = uuid.uuid4().hex

    def document(imds):
        now = datetime.datetime.now(datetime.timezone.utc)
        doc = {"AccessKeyId": creds["AccessKeyId"], "SecretAccessKey": creds["SecretAccessKey"],
               "Token": creds["Token"], "Expiration": stamp(now + datetime.timedelta(hours=1))}
        if imds:
            doc.update({"Code": "Success", "LastUpdated": stamp(now), "Type": "AWS-HMAC"})
        return json.dumps(doc).encode()

    class Handler(BaseHTTPRequestHandler):
        def reply(self, status, body, headers=()):
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self):
            if self.path != "/latest/api/token":
                return self.reply(404, b"not found")
            ttl = self.headers.get("x-aws-ec2-metadata-token-ttl-seconds")
            if not ttl:
                return self.reply(400, b"missing x-aws-ec2-metadata-token-ttl-seconds")
            self.reply(200, imds_token.encode(), [("x-aws-ec2-metadata-token-ttl-seconds", ttl)])

        def do_GET(self):
            if self.path == "/creds":
                want = creds.get("Authorization")
                if want is not None and self.headers.get("Authorization") != want:
                    return self.reply(401, b"unauthorized")
                return self.reply(200, document(False), [("Content-Type", "application/json")])
            if self.path.startswith(IMDS_CREDS):
                if self.headers.get("x-aws-ec2-metadata-token") != imds_token:
                    return self.reply(401, b"")
                if self.path == IMDS_CREDS:
                    return self.reply(200, ROLE.encode())
                if self.path == IMDS_CREDS + ROLE:
                    return self.reply(200, document(True), [("Content-Type", "text/plain")])
            self.reply(404, b"not found")

        def log_message(self, fmt, *args):
            # "GET /creds HTTP/1.1" 200: the request line names no key.
            sys.stderr.write(fmt % args + "\n")
            sys.stderr.flush()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "assume":
        assume(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit(__doc__)
