"""The test side of the AWS sinks (run with `scripts/aws python tools/aws/client.py ENDPOINT CMD ...`):
boto3 against a local moto_server, to create destinations and read back what outboxd sent.

  create-queue NAME [fifo] [ATTR=VALUE...]
                               create an SQS queue (FIFO when asked, NAME must then end .fifo)
                               with those attributes; prints its URL
  send-message URL BODY [GROUP]
                               send one message (with GROUP as its group id, on a FIFO queue)
  create-queue-max NAME BYTES  create a standard SQS queue with MaximumMessageSize BYTES
  set-queue-max URL BYTES      set an SQS queue's MaximumMessageSize to BYTES
  queue-count URL              print the queue's ApproximateNumberOfMessages (nothing received)
  create-topic NAME [fifo]     create an SNS topic (FIFO when asked, NAME must then end .fifo);
                               prints its ARN
  subscribe-queue ARN URL      subscribe the SQS queue URL to the topic ARN with raw message
                               delivery (the body is the message, attributes kept)
  drain-queue URL [SECONDS]    receive and delete every message until the queue has stayed empty
                               for SECONDS (default 2); prints one JSON object a line: body
                               (base64), attributes {name: base64 of the value}, group, dedup
  iam-setup                    an IAM user "outboxd" allowed sqs:*, a user "outboxd-assumer"
                               allowed sts:AssumeRole only, each with an access key, and a role
                               "outboxd-role" allowed sqs:* that the assumer (and a web identity)
                               may assume; prints {"key", "secret", "role", "assumer_key",
                               "assumer_secret"} as JSON (before `auth on`)
  sts-issued                   the secret keys and session tokens moto's STS has handed out so
                               far, from its state (/moto-api/data.json): [{"secret", "token"}]
  auth on|off                  moto checks every request's signature and IAM permissions from now
                               on (on), or takes any credentials again (off)
  ceiling sqs|sns DEST N SIZE KEYS [fifo]
                               moto's own ceiling (bench/sqs.sh): N messages of SIZE bytes sent to
                               the queue URL (SendMessageBatch) or topic ARN (PublishBatch) 10 a
                               call, $CALLS calls at a time (default 1: one after another); on a
                               FIFO one with the group id
                               k<i % KEYS> and a deduplication id each; prints "N SECONDS"
"""
import base64
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import boto3


def client(endpoint, service):
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


def create_queue(endpoint, name, *opts):
    attrs = dict(o.split("=", 1) for o in opts if o != "fifo")
    if "fifo" in opts:
        attrs["FifoQueue"] = "true"
    print(client(endpoint, "sqs").create_queue(QueueName=name, Attributes=attrs)["QueueUrl"])


def send_message(endpoint, url, body, group=None):
    extra = {"MessageGroupId": group} if group else {}
    client(endpoint, "sqs").send_message(QueueUrl=url, MessageBody=body, **extra)


def create_queue_max(endpoint, name, max_bytes):
    attrs = {"MaximumMessageSize": max_bytes}
    print(client(endpoint, "sqs").create_queue(QueueName=name, Attributes=attrs)["QueueUrl"])


def set_queue_max(endpoint, url, max_bytes):
    client(endpoint, "sqs").set_queue_attributes(QueueUrl=url, Attributes={"MaximumMessageSize": max_bytes})


def queue_count(endpoint, url):
    print(client(endpoint, "sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]["ApproximateNumberOfMessages"])


def create_topic(endpoint, name, fifo=""):
    attrs = {"FifoTopic": "true"} if fifo == "fifo" else {}
    print(client(endpoint, "sns").create_topic(Name=name, Attributes=attrs)["TopicArn"])


def subscribe_queue(endpoint, arn, url):
    queue_arn = client(endpoint, "sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    client(endpoint, "sns").subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn,
                                      Attributes={"RawMessageDelivery": "true"})


def attr_bytes(v):
    if "BinaryValue" in v:
        return v["BinaryValue"]
    return v.get("StringValue", "").encode()


def drain_queue(endpoint, url, quiet="2"):
    sqs = client(endpoint, "sqs")
    idle_until = time.time() + float(quiet)
    while time.time() < idle_until:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                                  MessageAttributeNames=["All"], AttributeNames=["All"])
        msgs = got.get("Messages", [])
        if not msgs:
            time.sleep(0.2)
            continue
        idle_until = time.time() + float(quiet)
        for m in msgs:
            a = m.get("Attributes", {})
            print(json.dumps({
                "body": base64.b64encode(m["Body"].encode()).decode(),
                "attributes": {k: base64.b64encode(attr_bytes(v)).decode()
                               for k, v in m.get("MessageAttributes", {}).items()},
                "group": a.get("MessageGroupId"),
                "dedup": a.get("MessageDeduplicationId"),
            }), flush=True)
        sqs.delete_message_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(msgs)])


def allow(action):
    return json.dumps({"Version": "2012-10-17",
                       "Statement": [{"Effect": "Allow", "Action": [action], "Resource": "*"}]})


def iam_setup(endpoint):
    iam = client(endpoint, "iam")
    iam.create_user(UserName="outboxd")
    iam.put_user_policy(UserName="outboxd", PolicyName="sqs", PolicyDocument=allow("sqs:*"))
    key = iam.create_access_key(UserName="outboxd")["AccessKey"]
    # The user that assumes the role may do nothing else: only the role's keys can send.
    iam.create_user(UserName="outboxd-assumer")
    iam.put_user_policy(UserName="outboxd-assumer", PolicyName="assume", PolicyDocument=allow("sts:AssumeRole"))
    assumer = iam.create_access_key(UserName="outboxd-assumer")["AccessKey"]
    trust = json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:user/outboxd-assumer"},
         "Action": "sts:AssumeRole"},
        {"Effect": "Allow", "Principal": {"Federated": "arn:aws:iam::123456789012:oidc-provider/oidc.example"},
         "Action": "sts:AssumeRoleWithWebIdentity"}]})
    role = iam.create_role(RoleName="outboxd-role", AssumeRolePolicyDocument=trust)["Role"]["Arn"]
    iam.put_role_policy(RoleName="outboxd-role", PolicyName="sqs", PolicyDocument=allow("sqs:*"))
    print(json.dumps({"key": key["AccessKeyId"], "secret": key["SecretAccessKey"], "role": role,
                      "assumer_key": assumer["AccessKeyId"], "assumer_secret": assumer["SecretAccessKey"]}))


def sts_issued(endpoint):
    import urllib.request
    data = json.loads(urllib.request.urlopen(f"{endpoint}/moto-api/data.json").read())
    roles = data.get("sts", {}).get("AssumedRole", [])
    print(json.dumps([{"secret": r["secret_access_key"], "token": r["session_token"]} for r in roles]))


def auth(endpoint, state):
    import urllib.request
    count = {"on": "0", "off": "inf"}[state]
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=count.encode(), method="POST",
                                                  headers={"Content-Type": "text/plain"})).read()


def ceiling(endpoint, service, dest, n, size, keys, fifo=""):
    c = client(endpoint, service)
    n, body, keys = int(n), "x" * int(size), int(keys)
    calls = int(os.environ.get("CALLS", "1"))

    def send(first):
        batch = []
        for i in range(first, min(first + 10, n)):
            e = {"Id": str(i - first)}
            e["MessageBody" if service == "sqs" else "Message"] = body
            if fifo == "fifo":
                e["MessageGroupId"] = f"k{i % keys}"
                e["MessageDeduplicationId"] = str(i)
            batch.append(e)
        if service == "sqs":
            out = c.send_message_batch(QueueUrl=dest, Entries=batch)
        else:
            out = c.publish_batch(TopicArn=dest, PublishBatchRequestEntries=batch)
        if out.get("Failed"):
            sys.exit(f"{len(out['Failed'])} messages failed: {out['Failed'][0]}")

    start = time.monotonic()
    # CALLS calls in flight at once (boto3's clients are thread-safe); consecutive batches hold
    # distinct groups when KEYS >= 10 * CALLS, so no group has two messages in flight.
    with ThreadPoolExecutor(calls) as pool:
        list(pool.map(send, range(0, n, 10)))
    print(n, round(time.monotonic() - start, 3))


COMMANDS = {"ceiling": ceiling, "iam-setup": iam_setup, "sts-issued": sts_issued, "auth": auth, "create-queue": create_queue, "create-queue-max": create_queue_max, "drain-queue": drain_queue,
            "send-message": send_message,
            "set-queue-max": set_queue_max, "create-topic": create_topic, "subscribe-queue": subscribe_queue,
            "queue-count": queue_count}

if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] not in COMMANDS:
        sys.exit(__doc__)
    COMMANDS[sys.argv[2]](sys.argv[1], *sys.argv[3:])
