"""The test and bench side of --sink kinesis (run with `scripts/aws python tools/aws/kinesis.py
ENDPOINT CMD ...`): boto3 against a local moto_server, to create streams, read back what outboxd
wrote, and measure the server's own ceiling.

  create-stream NAME [SHARDS]   create a provisioned stream (default 2 shards), wait until ACTIVE,
                                print its ARN
  read-stream NAME              every record of every shard from TRIM_HORIZON, shard by shard in
                                sequence order: one JSON object a line: shard, seq, pk, data
                                (base64)
  ceiling NAME RECORDS BYTES [KEYS]
                                put RECORDS records of BYTES bytes with PutRecords (500 a call,
                                KEYS partition keys, default 1000) as fast as one client goes;
                                prints "records seconds"
"""
import base64
import json
import sys
import time

import boto3


def client(endpoint):
    return boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


def create_stream(endpoint, name, shards="2"):
    k = client(endpoint)
    k.create_stream(StreamName=name, ShardCount=int(shards))
    for _ in range(300):
        s = k.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
        if s["StreamStatus"] == "ACTIVE":
            print(s["StreamARN"])
            return
        time.sleep(0.1)
    sys.exit(f"stream {name} not ACTIVE after 30 s")


def read_stream(endpoint, name):
    k = client(endpoint)
    shards = k.list_shards(StreamName=name)["Shards"]
    for shard in shards:
        sid = shard["ShardId"]
        it = k.get_shard_iterator(StreamName=name, ShardId=sid, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while it:
            out = k.get_records(ShardIterator=it, Limit=10000)
            for r in out["Records"]:
                print(json.dumps({"shard": sid, "seq": r["SequenceNumber"], "pk": r["PartitionKey"],
                                  "data": base64.b64encode(r["Data"]).decode()}))
            if not out["Records"] and out.get("MillisBehindLatest", 0) == 0:
                break
            it = out.get("NextShardIterator")


def ceiling(endpoint, name, records, size, keys="1000"):
    k = client(endpoint)
    records, size, keys = int(records), int(size), int(keys)
    data = b"x" * size
    start = time.monotonic()
    sent = 0
    while sent < records:
        n = min(500, records - sent)
        batch = [{"Data": data, "PartitionKey": f"k{(sent + i) % keys}"} for i in range(n)]
        out = k.put_records(StreamName=name, Records=batch)
        if out.get("FailedRecordCount"):
            sys.exit(f"{out['FailedRecordCount']} records failed")
        sent += n
    print(records, round(time.monotonic() - start, 3))


COMMANDS = {"create-stream": create_stream, "read-stream": read_stream, "ceiling": ceiling}

if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] not in COMMANDS:
        sys.exit(__doc__)
    COMMANDS[sys.argv[2]](sys.argv[1], *sys.argv[3:])
