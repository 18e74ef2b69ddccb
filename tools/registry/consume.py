"""A stock-client consumer for records framed for a Confluent-compatible schema registry.

Run with the virtualenv scripts/registry builds (scripts/registry python tools/registry/consume.py
...). It reads a topic from the beginning with confluent-kafka's DeserializingConsumer and the
Schema Registry deserializers (AvroDeserializer, ProtobufDeserializer, JSONDeserializer),
which fetch each writer schema by id from the registry (GET /schemas/ids/{id}, for Protobuf with
?format=serialized), and prints one JSON line per record:

  {"topic", "partition", "offset", "key", "key_schema_id", "headers": {...}, "schema_id", "value"}

(Protobuf adds "message_indexes"). Formats:

  avro          Avro binary datum behind the 5-byte header
  protobuf      message-index varints and the message behind the header; the message class is
                built at run time from the registry's schema (no generated code): the writer
                schema's FileDescriptorProto goes into a DescriptorPool, the message indexes pick
                the descriptor, and the stock ProtobufDeserializer decodes with that class

Apicurio Registry 3.3.3 cannot serve what ProtobufDeserializer asks for: GET /schemas/ids/{id}
?format=serialized answers a .proto registered as text with the raw FileDescriptorProto bytes as
a (lossy) UTF-8 string instead of base64, and a schema registered as base64 (confluent-kafka's own
ProtobufSerializer does that) with 500. So the client below answers format=serialized itself: it
fetches the schema as stored (GET /schemas/ids/{id}, references by GET /subjects/{s}/versions/{v})
and, for .proto text, compiles it with protoc (grpcio-tools) into the base64 FileDescriptorProto a
Confluent registry would return. Everything else, framing included, is the stock deserializer.
  json-schema   UTF-8 JSON behind the header, validated against the registry's JSON Schema
  json          plain JSON, no registry (schema_id is null)

Framing is checked strictly for the registry formats: the value must start with magic byte 0 and
a 4-byte big-endian schema id in the payload (schema ids in headers, or magic byte 1, are refused;
outboxd writes the prefix form only). Keys are UTF-8 strings unless --key-format says otherwise.
Exit status: 0 after --count records (or, without --count, when --timeout passes); 1 with a
one-line error on a decode failure or when fewer than --count records came within --timeout.
"""

import argparse
import base64
import binascii
import datetime
import decimal
import importlib.resources
import json
import os
import tempfile
import struct
import sys
import time
import uuid

from confluent_kafka import DeserializingConsumer, KafkaError
from confluent_kafka.error import ConsumeError, KeyDeserializationError, ValueDeserializationError
from confluent_kafka.schema_registry import RegisteredSchema, Schema, SchemaRegistryClient, prefix_schema_id_deserializer
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
# The pool set-up ProtobufDeserializer itself uses (well-known types, referenced schemas, the
# base64 FileDescriptorProto of format=serialized); private helpers of the pinned 2.16.1.
from confluent_kafka.schema_registry._sync.protobuf import _resolve_named_schema
from confluent_kafka.schema_registry.common.protobuf import _init_pool, _str_to_proto
from google.protobuf import descriptor_pb2, descriptor_pool, json_format
from google.protobuf.message_factory import GetMessageClass

FORMATS = ("avro", "protobuf", "json-schema", "json")


class Fail(Exception):
    pass


def read_varint(data, pos):
    """A zigzag LEB128 varint at data[pos:], as confluent-kafka writes the message indexes."""
    shift = value = 0
    while True:
        if pos >= len(data):
            raise Fail("truncated message-index varint")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1), pos


def framing(data, protobuf):
    """(schema_id, message_indexes or None) from a Confluent wire-format payload; Fail if not one."""
    if data is None:
        raise Fail("null payload")
    if len(data) < 5:
        raise Fail(f"payload of {len(data)} bytes is shorter than the 5-byte Confluent header")
    if data[0] != 0:
        raise Fail(f"magic byte is {data[0]}, expected 0")
    schema_id = struct.unpack(">I", data[1:5])[0]
    if not protobuf:
        return schema_id, None
    count, pos = read_varint(data, 5)
    if count == 0:
        return schema_id, [0]
    if count < 0:
        raise Fail(f"negative message-index count {count}")
    indexes = []
    for _ in range(count):
        i, pos = read_varint(data, pos)
        indexes.append(i)
    return schema_id, indexes


class SerializedProtobufClient(SchemaRegistryClient):
    """The stock client, but format=serialized for PROTOBUF is computed here (see the module doc)."""

    def __init__(self, conf):
        super().__init__(conf)
        self._serialized = {}

    def get_schema(self, schema_id, subject_name=None, fmt=None, reference_format=None):
        if fmt != "serialized":
            return super().get_schema(schema_id, subject_name, fmt, reference_format)
        key = ("id", schema_id)
        if key not in self._serialized:
            self._serialized[key] = self._to_serialized(super().get_schema(schema_id, subject_name))
        return self._serialized[key]

    def get_version(self, subject_name, version="latest", deleted=False, fmt=None):
        if fmt != "serialized":
            return super().get_version(subject_name, version, deleted, fmt)
        key = ("version", subject_name, version)
        if key not in self._serialized:
            reg = super().get_version(subject_name, version, deleted)
            self._serialized[key] = RegisteredSchema(
                schema_id=reg.schema_id, guid=reg.guid, schema=self._to_serialized(reg.schema),
                subject=reg.subject, version=reg.version)
        return self._serialized[key]

    def get_latest_version(self, subject_name, fmt=None):
        if fmt != "serialized":
            return super().get_latest_version(subject_name, fmt)
        reg = super().get_latest_version(subject_name)
        return RegisteredSchema(schema_id=reg.schema_id, guid=reg.guid, schema=self._to_serialized(reg.schema),
                                subject=reg.subject, version=reg.version)

    def _to_serialized(self, schema):
        if schema.schema_type != "PROTOBUF":
            return schema
        text = schema.schema_str
        try:  # already a base64 FileDescriptorProto (as confluent-kafka's serializer registers)
            descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=True))
            return schema
        except (binascii.Error, ValueError, Exception):
            pass
        with tempfile.TemporaryDirectory(prefix="consume-proto-") as d:
            self._write_tree(d, "registry_schema.proto", schema, set())
            out = os.path.join(d, "set.pb")
            from grpc_tools import protoc
            include = str(importlib.resources.files("grpc_tools") / "_proto")
            rc = protoc.main(["protoc", f"-I{d}", f"-I{include}", "--include_imports",
                              f"--descriptor_set_out={out}", os.path.join(d, "registry_schema.proto")])
            if rc != 0:
                raise Fail(f"protoc could not compile the registry's schema (exit {rc}; its message is above)")
            fds = descriptor_pb2.FileDescriptorSet.FromString(open(out, "rb").read())
        main = next(f for f in fds.file if f.name == "registry_schema.proto")
        return Schema(base64.b64encode(main.SerializeToString()).decode(), "PROTOBUF", schema.references)

    def _write_tree(self, d, name, schema, seen):
        """Write schema as d/name and its references (fetched as stored) under their import names."""
        path = os.path.join(d, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(schema.schema_str)
        for ref in schema.references or []:
            if ref.name in seen or ref.name.startswith("google/protobuf/"):
                continue
            seen.add(ref.name)
            reg = super().get_version(ref.subject, ref.version)
            self._write_tree(d, ref.name, reg.schema, seen)


class DynamicProtobuf:
    """A ProtobufDeserializer per (schema id, message indexes), its class built from the registry."""

    def __init__(self, client, conf):
        self.client = client
        self.conf = conf
        self.cache = {}

    def _message_class(self, schema_id, indexes):
        schema = self.client.get_schema(schema_id, fmt="serialized")
        pool = descriptor_pool.DescriptorPool()
        _init_pool(pool)
        _resolve_named_schema(schema, self.client, pool)
        fd_proto = _str_to_proto("default", schema.schema_str)
        pool.Add(fd_proto)
        messages, prefix = fd_proto.message_type, fd_proto.package
        name = None
        for i in indexes:
            if i < 0 or i >= len(messages):
                raise Fail(f"message index {indexes} out of range for schema id {schema_id}")
            name = f"{prefix}.{messages[i].name}" if prefix else messages[i].name
            prefix, messages = name, messages[i].nested_type
        return GetMessageClass(pool.FindMessageTypeByName(name))

    def __call__(self, data, ctx):
        if data is None:
            return None
        schema_id, indexes = framing(data, True)
        check_type(self.client, schema_id, "PROTOBUF")
        key = (schema_id, tuple(indexes))
        des = self.cache.get(key)
        if des is None:
            des = ProtobufDeserializer(self._message_class(schema_id, indexes), self.conf, self.client)
            self.cache[key] = des
        msg = des(data, ctx)
        return {
            "schema_id": schema_id,
            "message_indexes": indexes,
            "value": json_format.MessageToDict(msg, preserving_proto_field_name=True),
        }


class Framed:
    """A stock deserializer behind a strict framing check that also reports the schema id."""

    def __init__(self, inner, client, schema_type):
        self.inner = inner
        self.client = client
        self.schema_type = schema_type

    def __call__(self, data, ctx):
        if data is None:
            return None
        schema_id, _ = framing(data, False)
        check_type(self.client, schema_id, self.schema_type)
        return {"schema_id": schema_id, "value": self.inner(data, ctx)}


def check_type(client, schema_id, expected):
    """The registry's type of schema_id must be the one the format expects (Avro reports none)."""
    actual = client.get_schema(schema_id).schema_type or "AVRO"
    if actual != expected:
        raise Fail(f"schema id {schema_id} has type {actual}, not {expected}")


def plain_json(data, ctx):
    if data is None:
        return None
    return {"schema_id": None, "value": json.loads(data.decode("utf-8"))}


def deserializer(fmt, client):
    conf = {"subject.name.strategy.type": "TOPIC", "schema.id.deserializer": prefix_schema_id_deserializer}
    if fmt == "string":
        return lambda data, ctx: None if data is None else {"value": data.decode("utf-8")}
    if fmt == "bytes":
        return lambda data, ctx: None if data is None else {"value": base64.b64encode(data).decode()}
    if fmt == "json":
        return plain_json
    if client is None:
        raise Fail(f"--registry is needed for {fmt}")
    if fmt == "avro":
        return Framed(AvroDeserializer(client, conf=conf), client, "AVRO")
    if fmt == "json-schema":
        return Framed(JSONDeserializer(None, schema_registry_client=client, conf=conf), client, "JSON")
    if fmt == "protobuf":
        return DynamicProtobuf(client, conf)
    raise Fail(f"unknown format {fmt}")


def to_json(o):
    if isinstance(o, (bytes, bytearray)):
        return base64.b64encode(bytes(o)).decode()
    if isinstance(o, (datetime.datetime, datetime.date, datetime.time)):
        return o.isoformat()
    if isinstance(o, (decimal.Decimal, uuid.UUID)):
        return str(o)
    raise TypeError(f"cannot print a {type(o).__name__}")


def header_value(v):
    if v is None:
        return None
    try:
        return v.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(v).decode()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    p.add_argument("--topic", required=True)
    p.add_argument("--registry", help="registry base URL, e.g. http://127.0.0.1:PORT/apis/ccompat/v7")
    p.add_argument("--basic-auth", metavar="USER:PASSFILE", help="registry credentials (password: PASSFILE's first line)")
    p.add_argument("--ca", help="CA file (PEM) for an https registry")
    p.add_argument("--format", required=True, choices=FORMATS, help="value format")
    p.add_argument("--key-format", default="string", choices=FORMATS + ("string", "bytes"))
    p.add_argument("--isolation", default="read_committed", choices=("read_committed", "read_uncommitted"))
    p.add_argument("--count", type=int, help="records to read; fewer within --timeout is an error")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
    p.add_argument("--group", help="consumer group id (default: a fresh one, nothing committed)")
    p.add_argument("--kafka", action="append", default=[], metavar="KEY=VALUE", help="extra librdkafka setting")
    a = p.parse_args()

    client = None
    if a.registry:
        sr = {"url": a.registry}
        if a.basic_auth:
            user, _, passfile = a.basic_auth.partition(":")
            with open(passfile) as f:
                sr["basic.auth.user.info"] = f"{user}:{f.readline().rstrip(chr(13) + chr(10))}"
        if a.ca:
            sr["ssl.ca.location"] = a.ca
        client = SerializedProtobufClient(sr)

    conf = {
        "bootstrap.servers": a.bootstrap,
        "group.id": a.group or f"registry-consume-{uuid.uuid4()}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": a.isolation,
        "key.deserializer": deserializer(a.key_format, client),
        "value.deserializer": deserializer(a.format, client),
    }
    for kv in a.kafka:
        k, _, v = kv.partition("=")
        conf[k] = v
    consumer = DeserializingConsumer(conf)
    consumer.subscribe([a.topic])
    got = 0
    deadline = time.monotonic() + a.timeout
    try:
        while (a.count is None or got < a.count) and time.monotonic() < deadline:
            try:
                msg = consumer.poll(min(0.5, max(0.0, deadline - time.monotonic())))
            except (KeyDeserializationError, ValueDeserializationError) as e:
                m = e.kafka_message
                where = f"{m.topic()}[{m.partition()}]@{m.offset()}" if m is not None else "?"
                which = "key" if isinstance(e, KeyDeserializationError) else "value"
                cause = e.args[0].str() if e.args and hasattr(e.args[0], "str") else e
                raise Fail(f"{where}: cannot decode the {which} as {a.format if which == 'value' else a.key_format}: {cause}")
            except ConsumeError as e:
                raise Fail(f"consume error: {e}")
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise Fail(f"consume error: {msg.error()}")
            key, value = msg.key(), msg.value()
            headers = {}
            for name, v in msg.headers() or []:
                headers[name] = header_value(v)
            rec = {
                "topic": msg.topic(),
                "partition": msg.partition(),
                "offset": msg.offset(),
                "key": None if key is None else key["value"],
                "key_schema_id": None if key is None else key.get("schema_id"),
                "headers": headers,
                "schema_id": None if value is None else value["schema_id"],
            }
            if value is not None and "message_indexes" in value:
                rec["message_indexes"] = value["message_indexes"]
            rec["value"] = None if value is None else value["value"]
            print(json.dumps(rec, default=to_json), flush=True)
            got += 1
    finally:
        consumer.close()
    if a.count is not None and got < a.count:
        raise Fail(f"read {got} of {a.count} records from {a.topic} within {a.timeout:g} s")


if __name__ == "__main__":
    try:
        main()
    except Fail as e:
        print(f"consume.py: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
