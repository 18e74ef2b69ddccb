"""A fault-injecting proxy in front of a local SQS (moto) for the AWS sinks' tests:

  throttle_proxy.py UPSTREAM PORTFILE STATSFILE [SHARE] [sns-entries]

listens on a free loopback port (written to PORTFILE) and forwards every request to UPSTREAM
(http://127.0.0.1:PORT). Of SNS's PublishBatch calls a SHARE is answered 400 Throttled without
reaching the server. Of the SendMessageBatch calls (SQS's JSON protocol), a SHARE (default
0.3) is answered 400 ThrottlingException without reaching the server, and as many again reach it
with a random part of their entries taken out, which come back in the answer's Failed list as a
per-entry throttle (RequestThrottled, SenderFault false): SQS stored the others. STATSFILE gets
"whole=N entries=M" after each injection.

Kinesis PutRecords calls (JSON 1.1, X-Amz-Target Kinesis_20131202.PutRecords) get the same: a SHARE
is answered 400 ProvisionedThroughputExceededException, as many again reach the server without a
random part of their records, which come back in the answer's Records, at their places, with
ErrorCode ProvisionedThroughputExceededException (the partial failure): Kinesis stored the others.

With "sns-entries", PublishBatch calls are not throttled whole: a SHARE of them reach the server
with a random part of their entries taken out, answered in Failed as Throttled (SenderFault
false); and an entry whose message holds "refuse-pvi" or "refuse-ip" never reaches it and is
answered Failed ParameterValueInvalid or InvalidParameter (SenderFault true), as SNS refuses one
message of a batch.

With "kinesis-refuse", nothing is throttled at random: a Kinesis record whose data holds "refuse-me"
never reaches the server and is answered ErrorCode ValidationException at its place (the others
reach it), as a record refused for good.

With "hot:KEY:N", nothing is throttled at random: a Kinesis record whose PartitionKey is KEY, or an
SQS entry whose MessageGroupId is KEY, is answered as a per-entry throttle (the call's other
entries reach the server) the first N times it is sent. Each time an entry of KEY is sent, a line
"<unix time> refused|passed" is appended to STATSFILE.hot: the spacing of a hot key's retries while
the others are stored.
"""
import json
import random
import re
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

UPSTREAM, PORTFILE, STATSFILE = sys.argv[1], sys.argv[2], sys.argv[3]
SHARE = float(sys.argv[4]) if len(sys.argv) > 4 else 0.3
SNS_ENTRIES = len(sys.argv) > 5 and sys.argv[5] == "sns-entries"
REFUSE = len(sys.argv) > 5 and sys.argv[5] == "kinesis-refuse"
HOT = sys.argv[5].split(":", 2)[1:] if len(sys.argv) > 5 and sys.argv[5].startswith("hot:") else None
hot_seen = [0]
stats = {"whole": 0, "entries": 0}
lock = threading.Lock()
# PutRecords calls go to moto side by side, as a client sends them: moto's own race on a shard's
# sequence numbers is closed in tools/aws/moto_server.py, which the harness runs.


def hot(key):
    """Whether this entry of the hot key is refused; logs the attempt."""
    if HOT is None or key != HOT[0]:
        return False
    import time
    with lock:
        hot_seen[0] += 1
        refuse = hot_seen[0] <= int(HOT[1])
        with open(STATSFILE + ".hot", "a") as f:
            f.write(f"{time.time():.3f} {'refused' if refuse else 'passed'}\n")
    return refuse


def count(kind, n=1):
    with lock:
        stats[kind] += n
        with open(STATSFILE, "w") as f:
            f.write(f"whole={stats['whole']} entries={stats['entries']}\n")


class Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, headers, body):
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def forward(self, body):
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        req = urllib.request.Request(UPSTREAM + self.path, data=body, headers=headers, method=self.command)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, list(r.headers.items()), r.read()
        except urllib.error.HTTPError as e:
            return e.code, list(e.headers.items()), e.read()

    def do_GET(self):
        self.answer(*self.forward(None))

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        target = self.headers.get("X-Amz-Target", "")
        if SNS_ENTRIES and b"Action=PublishBatch" in body:
            self.answer(*sns_entries(self, body))
            return
        # SNS (the query protocol): a SHARE of PublishBatch calls is answered Throttled.
        if b"Action=PublishBatch" in body and random.random() < SHARE:
            count("whole")
            err = ("<ErrorResponse xmlns=\"https://sns.amazonaws.com/doc/2010-03-31/\"><Error><Type>Sender</Type>"
                   "<Code>Throttled</Code><Message>Rate exceeded (injected)</Message></Error>"
                   "<RequestId>injected</RequestId></ErrorResponse>")
            self.answer(400, [("Content-Type", "text/xml")], err.encode())
            return
        if target == "Kinesis_20131202.PutRecords":
            if REFUSE:
                self.refuse_records(body)
            elif HOT is not None:
                self.hot_entries(target, body)
            else:
                self.put_records(body)
            return
        if HOT is not None and target == "AmazonSQS.SendMessageBatch":
            self.hot_entries(target, body)
            return
        if target.endswith(".SendMessageBatch"):
            roll = random.random()
            if roll < SHARE:
                count("whole")
                err = json.dumps({"__type": "com.amazonaws.sqs#ThrottlingException", "message": "Rate exceeded (injected)"})
                self.answer(400, [("Content-Type", "application/x-amz-json-1.0"),
                                  ("x-amzn-query-error", "ThrottlingException;Sender")], err.encode())
                return
            if roll < 2 * SHARE:
                req = json.loads(body)
                entries = req.get("Entries", [])
                dropped = [e for e in entries if random.random() < 0.4]
                if dropped:
                    count("entries", len(dropped))
                    kept = [e for e in entries if e not in dropped]
                    failed = [{"Id": e["Id"], "SenderFault": False, "Code": "RequestThrottled",
                               "Message": "injected"} for e in dropped]
                    if not kept:
                        out = {"Successful": [], "Failed": failed}
                        self.answer(200, [("Content-Type", "application/x-amz-json-1.0")], json.dumps(out).encode())
                        return
                    req["Entries"] = kept
                    status, headers, up = self.forward(json.dumps(req).encode())
                    if status == 200:
                        out = json.loads(up)
                        out["Failed"] = out.get("Failed", []) + failed
                        up = json.dumps(out).encode()
                    self.answer(status, headers, up)
                    return
        self.answer(*self.forward(body))


    def refuse_records(self, body):
        """PutRecords with the records holding "refuse-me" refused (see the module doc)."""
        import base64
        req = json.loads(body)
        records = req.get("Records", [])
        refused = [b"refuse-me" in base64.b64decode(r.get("Data", "")) for r in records]
        if not any(refused):
            self.answer(*self.forward(body))
            return
        kept = [r for r, x in zip(records, refused) if not x]
        stored = []
        if kept:
            req["Records"] = kept
            status, headers, up = self.forward(json.dumps(req).encode())
            if status != 200:
                self.answer(status, headers, up)
                return
            stored = json.loads(up)["Records"]
        out, it = [], iter(stored)
        for x in refused:
            out.append({"ErrorCode": "ValidationException", "ErrorMessage": "refused (injected)"} if x else next(it))
        ans = {"FailedRecordCount": sum(1 for r in out if "ErrorCode" in r), "Records": out}
        self.answer(200, [("Content-Type", "application/x-amz-json-1.1")], json.dumps(ans).encode())

    def hot_entries(self, target, body):
        """A call with the hot key's entries answered as throttled (see the module doc)."""
        req = json.loads(body)
        kinesis = target.startswith("Kinesis")
        items = req.get("Records" if kinesis else "Entries", [])
        refused = [hot(e.get("PartitionKey" if kinesis else "MessageGroupId")) for e in items]
        if not any(refused):
            self.answer(*self.forward(body))
            return
        kept = [e for e, r in zip(items, refused) if not r]
        up = {"Records": [], "Successful": [], "Failed": []}
        if kept:
            req["Records" if kinesis else "Entries"] = kept
            status, headers, raw = self.forward(json.dumps(req).encode())
            if status != 200:
                self.answer(status, headers, raw)
                return
            up.update(json.loads(raw))
        if kinesis:
            out, it = [], iter(up["Records"])
            for r in refused:
                out.append({"ErrorCode": "ProvisionedThroughputExceededException",
                            "ErrorMessage": "Rate exceeded for shard (injected, hot key)"} if r else next(it))
            ans = {"FailedRecordCount": sum(refused) + up.get("FailedRecordCount", 0), "Records": out}
            self.answer(200, [("Content-Type", "application/x-amz-json-1.1")], json.dumps(ans).encode())
        else:
            failed = up.get("Failed", []) + [{"Id": e["Id"], "SenderFault": False, "Code": "RequestThrottled",
                                              "Message": "injected, hot group"} for e, r in zip(items, refused) if r]
            ans = {"Successful": up.get("Successful", []), "Failed": failed}
            self.answer(200, [("Content-Type", "application/x-amz-json-1.0")], json.dumps(ans).encode())

    def put_records(self, body):
        json11 = [("Content-Type", "application/x-amz-json-1.1")]
        roll = random.random()
        if roll < SHARE:
            count("whole")
            err = {"__type": "ProvisionedThroughputExceededException", "message": "Rate exceeded (injected)"}
            self.answer(400, json11, json.dumps(err).encode())
            return
        if roll >= 2 * SHARE:
            self.answer(*self.forward(body))
            return
        req = json.loads(body)
        records = req.get("Records", [])
        dropped = [random.random() < 0.4 for _ in records]
        if not any(dropped):
            self.answer(*self.forward(body))
            return
        count("entries", sum(dropped))
        kept = [r for r, d in zip(records, dropped) if not d]
        stored = []
        if kept:
            req["Records"] = kept
            status, headers, up = self.forward(json.dumps(req).encode())
            if status != 200:
                self.answer(status, headers, up)
                return
            stored = json.loads(up)["Records"]
        out, it = [], iter(stored)
        for d in dropped:
            out.append({"ErrorCode": "ProvisionedThroughputExceededException",
                         "ErrorMessage": "Rate exceeded for shard (injected)"} if d else next(it))
        failed = sum(1 for r in out if "ErrorCode" in r)
        self.answer(200, json11, json.dumps({"FailedRecordCount": failed, "Records": out}).encode())


def sns_entries(proxy, body):
    """A PublishBatch call with some entries answered Failed (see the module doc)."""
    pairs = urllib.parse.parse_qsl(body.decode(), keep_blank_values=True)
    prefix = "PublishBatchRequestEntries.member."
    members, rest = {}, []
    for k, v in pairs:
        if k.startswith(prefix):
            n, _, field = k[len(prefix):].partition(".")
            members.setdefault(int(n), []).append((field, v))
        else:
            rest.append((k, v))
    failed, kept = [], []
    throttle = random.random() < SHARE
    for n in sorted(members):
        fields = dict(members[n])
        msg = fields.get("Message", "")
        if "refuse-pvi" in msg or "refuse-ip" in msg:
            code = "ParameterValueInvalid" if "refuse-pvi" in msg else "InvalidParameter"
            failed.append((fields["Id"], code, "true"))
        elif throttle and random.random() < 0.4:
            count("entries")
            failed.append((fields["Id"], "Throttled", "false"))
        else:
            kept.append(members[n])
    xml_failed = "".join(
        f"<member><Id>{i}</Id><Code>{c}</Code><Message>injected</Message><SenderFault>{f}</SenderFault></member>"
        for i, c, f in failed)
    ns = "https://sns.amazonaws.com/doc/2010-03-31/"
    if not kept:
        out = (f'<PublishBatchResponse xmlns="{ns}"><PublishBatchResult><Successful></Successful>'
               f"<Failed>{xml_failed}</Failed></PublishBatchResult><ResponseMetadata><RequestId>injected"
               "</RequestId></ResponseMetadata></PublishBatchResponse>")
        return 200, [("Content-Type", "text/xml")], out.encode()
    renumbered = list(rest)
    for n, fields in enumerate(kept, 1):
        renumbered.extend((f"{prefix}{n}.{f}", v) for f, v in fields)
    status, headers, up = proxy.forward(urllib.parse.urlencode(renumbered).encode())
    if status != 200 or not failed:
        return status, headers, up
    text = up.decode()
    if re.search(r"<Failed\s*/>", text):
        text = re.sub(r"<Failed\s*/>", f"<Failed>{xml_failed}</Failed>", text, count=1)
    elif "<Failed>" in text:
        text = text.replace("<Failed>", "<Failed>" + xml_failed, 1)
    else:
        text = text.replace("</PublishBatchResult>", f"<Failed>{xml_failed}</Failed></PublishBatchResult>", 1)
    return status, headers, text.encode()


server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
with open(PORTFILE + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os
os.rename(PORTFILE + ".tmp", PORTFILE)
server.serve_forever()
