"""Generated protocol code (from proto/millstream.proto) and record conversion."""

from __future__ import annotations

from runtime.record import Record
from runtime.wire import millstream_pb2 as pb

# Bounded message sizes on every channel and server (runtime/delivery.py cuts deliveries
# well below it).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.enable_retries", 0),
]
# Servers also bound the calls one connection may have open at once (review S8): more wait
# in the caller's transport instead of each taking memory here. A sender has one delivery
# in flight per destination tablet, so this is far above what a healthy peer uses.
MAX_STREAMS_PER_CONNECTION = 256
SERVER_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION)]


def to_proto(r: Record) -> pb.Record:
    return pb.Record(key=r.key, value=r.value, timestamp=r.timestamp, id=r.id)


def from_proto(p: pb.Record) -> Record:
    return Record(p.key, p.value, p.timestamp, p.id)
