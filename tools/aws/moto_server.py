"""moto's server (scripts/aws start runs this instead of the plain `moto_server`), with four changes.

Kinesis: moto numbers a shard's records as "the highest sequence number so far, plus one", and its
threaded server runs PutRecords calls side by side: two calls writing to one shard at once can take
the same number, and the later record replaces the earlier one. outboxd's Kinesis sink keeps
several calls in flight (one record of a key at a time, many keys at once), so under load a test
read a stream one record short: a loss that AWS would not have made. A lock around a shard's
append makes each one whole, as Kinesis's own are.

SQS: each message sent reads its queue's `attributes` up to four times (for the one attribute
ContentBasedDeduplication), and moto builds that dict whole each time, counting the queue's
visible, delayed and in-flight messages with a clock read per message. A send so costs O(messages
already in the queue) with a large constant: 10,000 messages into one queue took minutes, a FIFO
queue (more reads per message) far longer, and outboxd's 15 s attempt timeout fired under
`bench/run sqs`. While moto stores a message, `attributes` answers that one attribute only (nothing for a standard
queue, as moto's own lists it for FIFO queues only); every
other read (GetQueueAttributes, the counts the tests read) is moto's own. What is stored, and how
FIFO deduplication decides, is unchanged.

STS: with IAM authentication on (`client.py auth on`, or INITIAL_NO_AUTH_ACTION_COUNT), moto
checks every request's signature, AssumeRoleWithWebIdentity's too, and fails on it for want of an
Authorization header. AWS takes that call unsigned (the web identity token is the credential; it
is how IRSA's pods get their first keys), so it is let through unsigned here too. moto does not
verify the token itself. And moto answers a request it refuses (a wrong signature, an unknown
key) in its XML error form even to SQS's JSON protocol, which the SDK cannot read (no error code,
only "HTTP 403"); AWS answers such a request in JSON, with the code in `__type`: so does this.
Nothing else in moto is changed.
"""

import json
import re
import sys
import threading

from moto.kinesis import models
from moto.server import main
from moto.core.authorization import ActionAuthenticatorMixin
from moto.core.responses import BaseResponse
from moto.sqs import models as sqs_models

_APPEND = threading.Lock()
_put_record = models.Shard.put_record


def put_record(self, *args, **kwargs):
    with _APPEND:
        return _put_record(self, *args, **kwargs)


models.Shard.put_record = put_record

# Per thread (moto's server answers each request on a thread of its own): inside a send or not.
_SENDING = threading.local()
_attributes = sqs_models.Queue.attributes.fget


def attributes(self):
    if getattr(_SENDING, "depth", 0) == 0:
        return _attributes(self)
    # moto's own lists ContentBasedDeduplication for FIFO queues only (a standard queue with it
    # set would otherwise get content-based deduplication ids it never has on AWS).
    if not self.fifo_queue:
        return {}
    value = getattr(self, "content_based_deduplication", False)
    if isinstance(value, bool):
        value = str(value).lower()
    return {"ContentBasedDeduplication": value}


def sending(call):
    def wrapped(self, *args, **kwargs):
        _SENDING.depth = getattr(_SENDING, "depth", 0) + 1
        try:
            return call(self, *args, **kwargs)
        finally:
            _SENDING.depth -= 1

    return wrapped


sqs_models.Queue.attributes = property(attributes)
# SendMessageBatch validates every entry (reading `attributes`) before it sends each one.
for _name in ("send_message", "send_message_batch"):
    setattr(sqs_models.SQSBackend, _name, sending(getattr(sqs_models.SQSBackend, _name)))

_authenticate = ActionAuthenticatorMixin._authenticate_and_authorize_normal_action


def authenticate(self, *args, **kwargs):
    unsigned = "Authorization" not in self.headers
    if unsigned and self._get_action() == "AssumeRoleWithWebIdentity":
        return None
    return _authenticate(self, *args, **kwargs)


ActionAuthenticatorMixin._authenticate_and_authorize_normal_action = authenticate

_call_action = BaseResponse.call_action
_CODE = re.compile(r"<Code>([^<]+)</Code>")
_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")


def call_action(self):
    status, headers, body = _call_action(self)
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
    json_protocol = "X-Amz-Target" in self.headers
    if json_protocol and status in (401, 403) and text.lstrip().startswith("<"):
        code = _CODE.search(text)
        if code:
            message = _MESSAGE.search(text)
            body = json.dumps({"__type": code.group(1), "message": message.group(1) if message else ""})
            headers = dict(headers, **{"Content-Type": "application/x-amz-json-1.0"})
            headers.pop("content-type", None)
            headers.pop("Content-Length", None)
            headers.pop("content-length", None)
    return status, headers, body


BaseResponse.call_action = call_action

if __name__ == "__main__":
    sys.exit(main())
