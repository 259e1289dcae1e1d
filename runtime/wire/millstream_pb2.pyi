from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SenderKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SENDER_UNSPECIFIED: _ClassVar[SenderKind]
    SENDER_INJECTOR: _ClassVar[SenderKind]
    SENDER_WORKER: _ClassVar[SenderKind]
SENDER_UNSPECIFIED: SenderKind
SENDER_INJECTOR: SenderKind
SENDER_WORKER: SenderKind

class Record(_message.Message):
    __slots__ = ("key", "value", "timestamp", "id")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    timestamp: int
    id: bytes
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., timestamp: _Optional[int] = ..., id: _Optional[bytes] = ...) -> None: ...

class ProducerOrder(_message.Message):
    __slots__ = ("producer", "after", "token")
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    producer: bytes
    after: int
    token: int
    def __init__(self, producer: _Optional[bytes] = ..., after: _Optional[int] = ..., token: _Optional[int] = ...) -> None: ...

class DeliverRequest(_message.Message):
    __slots__ = ("computation", "key_range", "token", "records", "sender", "orders", "columns", "sender_kind")
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    ORDERS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    SENDER_KIND_FIELD_NUMBER: _ClassVar[int]
    computation: str
    key_range: int
    token: int
    records: _containers.RepeatedCompositeFieldContainer[Record]
    sender: str
    orders: _containers.RepeatedCompositeFieldContainer[ProducerOrder]
    columns: Columns
    sender_kind: SenderKind
    def __init__(self, computation: _Optional[str] = ..., key_range: _Optional[int] = ..., token: _Optional[int] = ..., records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ..., sender: _Optional[str] = ..., orders: _Optional[_Iterable[_Union[ProducerOrder, _Mapping]]] = ..., columns: _Optional[_Union[Columns, _Mapping]] = ..., sender_kind: _Optional[_Union[SenderKind, str]] = ...) -> None: ...

class Columns(_message.Message):
    __slots__ = ("keys", "values", "timestamps", "producer", "seqs", "ids", "producers", "stream_names", "stream_index")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    SEQS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    STREAM_NAMES_FIELD_NUMBER: _ClassVar[int]
    STREAM_INDEX_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    values: _containers.RepeatedScalarFieldContainer[bytes]
    timestamps: _containers.RepeatedScalarFieldContainer[int]
    producer: bytes
    seqs: _containers.RepeatedScalarFieldContainer[int]
    ids: bytes
    producers: _containers.RepeatedScalarFieldContainer[bytes]
    stream_names: _containers.RepeatedScalarFieldContainer[str]
    stream_index: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., values: _Optional[_Iterable[bytes]] = ..., timestamps: _Optional[_Iterable[int]] = ..., producer: _Optional[bytes] = ..., seqs: _Optional[_Iterable[int]] = ..., ids: _Optional[bytes] = ..., producers: _Optional[_Iterable[bytes]] = ..., stream_names: _Optional[_Iterable[str]] = ..., stream_index: _Optional[_Iterable[int]] = ...) -> None: ...

class DeliverResponse(_message.Message):
    __slots__ = ("status", "detail", "worker_id", "report_seq", "routing_version", "duplicates")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OK: _ClassVar[DeliverResponse.Status]
        NOT_OWNER: _ClassVar[DeliverResponse.Status]
        BUSY: _ClassVar[DeliverResponse.Status]
        OUT_OF_ORDER: _ClassVar[DeliverResponse.Status]
    OK: DeliverResponse.Status
    NOT_OWNER: DeliverResponse.Status
    BUSY: DeliverResponse.Status
    OUT_OF_ORDER: DeliverResponse.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REPORT_SEQ_FIELD_NUMBER: _ClassVar[int]
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    status: DeliverResponse.Status
    detail: str
    worker_id: str
    report_seq: int
    routing_version: int
    duplicates: int
    def __init__(self, status: _Optional[_Union[DeliverResponse.Status, str]] = ..., detail: _Optional[str] = ..., worker_id: _Optional[str] = ..., report_seq: _Optional[int] = ..., routing_version: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...

class DeliverManyRequest(_message.Message):
    __slots__ = ("deliveries",)
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[DeliverRequest]
    def __init__(self, deliveries: _Optional[_Iterable[_Union[DeliverRequest, _Mapping]]] = ...) -> None: ...

class DeliverManyResponse(_message.Message):
    __slots__ = ("answers",)
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[DeliverResponse]
    def __init__(self, answers: _Optional[_Iterable[_Union[DeliverResponse, _Mapping]]] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ("worker_id", "frames_port")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    FRAMES_PORT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    frames_port: int
    def __init__(self, worker_id: _Optional[str] = ..., frames_port: _Optional[int] = ...) -> None: ...

class ReplicaEntry(_message.Message):
    __slots__ = ("index", "ops")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    index: int
    ops: bytes
    def __init__(self, index: _Optional[int] = ..., ops: _Optional[bytes] = ...) -> None: ...

class Writes(_message.Message):
    __slots__ = ("kinds", "keys", "values")
    KINDS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    kinds: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    values: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, kinds: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., values: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ReplicateRequest(_message.Message):
    __slots__ = ("computation", "key_range", "token", "entries", "sync", "follower", "term", "prev_term")
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    PREV_TERM_FIELD_NUMBER: _ClassVar[int]
    computation: str
    key_range: int
    token: int
    entries: _containers.RepeatedCompositeFieldContainer[ReplicaEntry]
    sync: bool
    follower: str
    term: int
    prev_term: int
    def __init__(self, computation: _Optional[str] = ..., key_range: _Optional[int] = ..., token: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[ReplicaEntry, _Mapping]]] = ..., sync: _Optional[bool] = ..., follower: _Optional[str] = ..., term: _Optional[int] = ..., prev_term: _Optional[int] = ...) -> None: ...

class ReplicateManyRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[ReplicateRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[ReplicateRequest, _Mapping]]] = ...) -> None: ...

class ReplicateManyResponse(_message.Message):
    __slots__ = ("answers",)
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[ReplicateResponse]
    def __init__(self, answers: _Optional[_Iterable[_Union[ReplicateResponse, _Mapping]]] = ...) -> None: ...

class ReplicateResponse(_message.Message):
    __slots__ = ("status", "index", "detail", "term")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OK: _ClassVar[ReplicateResponse.Status]
        STALE_TOKEN: _ClassVar[ReplicateResponse.Status]
        NEED_SNAPSHOT: _ClassVar[ReplicateResponse.Status]
        WRONG_WORKER: _ClassVar[ReplicateResponse.Status]
        NOT_YET: _ClassVar[ReplicateResponse.Status]
    OK: ReplicateResponse.Status
    STALE_TOKEN: ReplicateResponse.Status
    NEED_SNAPSHOT: ReplicateResponse.Status
    WRONG_WORKER: ReplicateResponse.Status
    NOT_YET: ReplicateResponse.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    status: ReplicateResponse.Status
    index: int
    detail: str
    term: int
    def __init__(self, status: _Optional[_Union[ReplicateResponse.Status, str]] = ..., index: _Optional[int] = ..., detail: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("computation", "key_range", "token", "index", "session", "file", "offset", "data", "done", "follower", "files")
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    computation: str
    key_range: int
    token: int
    index: int
    session: str
    file: str
    offset: int
    data: bytes
    done: bool
    follower: str
    files: _containers.RepeatedCompositeFieldContainer[FileDigest]
    def __init__(self, computation: _Optional[str] = ..., key_range: _Optional[int] = ..., token: _Optional[int] = ..., index: _Optional[int] = ..., session: _Optional[str] = ..., file: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., done: _Optional[bool] = ..., follower: _Optional[str] = ..., files: _Optional[_Iterable[_Union[FileDigest, _Mapping]]] = ...) -> None: ...

class FileDigest(_message.Message):
    __slots__ = ("name", "size", "sha256")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    sha256: str
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class ReadStateRequest(_message.Message):
    __slots__ = ("computation", "key_range", "token", "key", "state")
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    computation: str
    key_range: int
    token: int
    key: bytes
    state: str
    def __init__(self, computation: _Optional[str] = ..., key_range: _Optional[int] = ..., token: _Optional[int] = ..., key: _Optional[bytes] = ..., state: _Optional[str] = ...) -> None: ...

class ReadStateResponse(_message.Message):
    __slots__ = ("found", "value", "token", "states")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    found: bool
    value: bytes
    token: int
    states: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, found: _Optional[bool] = ..., value: _Optional[bytes] = ..., token: _Optional[int] = ..., states: _Optional[_Iterable[str]] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("computation", "key_range", "token")
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    computation: str
    key_range: int
    token: int
    def __init__(self, computation: _Optional[str] = ..., key_range: _Optional[int] = ..., token: _Optional[int] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("topology_json",)
    TOPOLOGY_JSON_FIELD_NUMBER: _ClassVar[int]
    topology_json: str
    def __init__(self, topology_json: _Optional[str] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("name", "tablets")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TABLETS_FIELD_NUMBER: _ClassVar[int]
    name: str
    tablets: int
    def __init__(self, name: _Optional[str] = ..., tablets: _Optional[int] = ...) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("address", "worker_id", "zone", "secret", "allowed_code")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_CODE_FIELD_NUMBER: _ClassVar[int]
    address: str
    worker_id: str
    zone: str
    secret: str
    allowed_code: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, address: _Optional[str] = ..., worker_id: _Optional[str] = ..., zone: _Optional[str] = ..., secret: _Optional[str] = ..., allowed_code: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("worker_id", "lease_ms", "secret")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    lease_ms: int
    secret: str
    def __init__(self, worker_id: _Optional[str] = ..., lease_ms: _Optional[int] = ..., secret: _Optional[str] = ...) -> None: ...

class HeldTablet(_message.Message):
    __slots__ = ("computation", "key_range", "token", "has_work", "oldest_work", "processed", "late", "dead_lettered", "backlog", "watermark", "slow", "load_median", "in_flight", "commits")
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    HAS_WORK_FIELD_NUMBER: _ClassVar[int]
    OLDEST_WORK_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_FIELD_NUMBER: _ClassVar[int]
    LATE_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    SLOW_FIELD_NUMBER: _ClassVar[int]
    LOAD_MEDIAN_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    COMMITS_FIELD_NUMBER: _ClassVar[int]
    computation: str
    key_range: int
    token: int
    has_work: bool
    oldest_work: int
    processed: int
    late: int
    dead_lettered: int
    backlog: int
    watermark: int
    slow: _containers.RepeatedCompositeFieldContainer[SlowCall]
    load_median: int
    in_flight: int
    commits: int
    def __init__(self, computation: _Optional[str] = ..., key_range: _Optional[int] = ..., token: _Optional[int] = ..., has_work: _Optional[bool] = ..., oldest_work: _Optional[int] = ..., processed: _Optional[int] = ..., late: _Optional[int] = ..., dead_lettered: _Optional[int] = ..., backlog: _Optional[int] = ..., watermark: _Optional[int] = ..., slow: _Optional[_Iterable[_Union[SlowCall, _Mapping]]] = ..., load_median: _Optional[int] = ..., in_flight: _Optional[int] = ..., commits: _Optional[int] = ...) -> None: ...

class SlowCall(_message.Message):
    __slots__ = ("key", "seconds", "running")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    seconds: float
    running: bool
    def __init__(self, key: _Optional[bytes] = ..., seconds: _Optional[float] = ..., running: _Optional[bool] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("worker_id", "drain", "secret")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    drain: bool
    secret: str
    def __init__(self, worker_id: _Optional[str] = ..., drain: _Optional[bool] = ..., secret: _Optional[str] = ...) -> None: ...

class LeaveResponse(_message.Message):
    __slots__ = ("primaries",)
    PRIMARIES_FIELD_NUMBER: _ClassVar[int]
    primaries: int
    def __init__(self, primaries: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "tablets", "report_seq", "problems", "secret", "routing_version")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TABLETS_FIELD_NUMBER: _ClassVar[int]
    REPORT_SEQ_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    tablets: _containers.RepeatedCompositeFieldContainer[HeldTablet]
    report_seq: int
    problems: _containers.RepeatedCompositeFieldContainer[TabletProblem]
    secret: str
    routing_version: int
    def __init__(self, worker_id: _Optional[str] = ..., tablets: _Optional[_Iterable[_Union[HeldTablet, _Mapping]]] = ..., report_seq: _Optional[int] = ..., problems: _Optional[_Iterable[_Union[TabletProblem, _Mapping]]] = ..., secret: _Optional[str] = ..., routing_version: _Optional[int] = ...) -> None: ...

class TabletProblem(_message.Message):
    __slots__ = ("computation", "key_range", "error", "attempts", "seconds")
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    computation: str
    key_range: int
    error: str
    attempts: int
    seconds: float
    def __init__(self, computation: _Optional[str] = ..., key_range: _Optional[int] = ..., error: _Optional[str] = ..., attempts: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("known", "routing_version", "input_watermarks", "reported", "lease_ms", "dropped", "sends_dropped")
    class InputWatermarksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ReportedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class DroppedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUT_WATERMARKS_FIELD_NUMBER: _ClassVar[int]
    REPORTED_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    SENDS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    known: bool
    routing_version: int
    input_watermarks: _containers.ScalarMap[str, int]
    reported: _containers.ScalarMap[str, int]
    lease_ms: int
    dropped: _containers.ScalarMap[str, int]
    sends_dropped: bool
    def __init__(self, known: _Optional[bool] = ..., routing_version: _Optional[int] = ..., input_watermarks: _Optional[_Mapping[str, int]] = ..., reported: _Optional[_Mapping[str, int]] = ..., lease_ms: _Optional[int] = ..., dropped: _Optional[_Mapping[str, int]] = ..., sends_dropped: _Optional[bool] = ...) -> None: ...

class InjectorReport(_message.Message):
    __slots__ = ("name", "stream", "watermark", "incarnation", "release", "idle", "retired")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    name: str
    stream: str
    watermark: int
    incarnation: str
    release: bool
    idle: bool
    retired: bool
    def __init__(self, name: _Optional[str] = ..., stream: _Optional[str] = ..., watermark: _Optional[int] = ..., incarnation: _Optional[str] = ..., release: _Optional[bool] = ..., idle: _Optional[bool] = ..., retired: _Optional[bool] = ...) -> None: ...

class InjectorResponse(_message.Message):
    __slots__ = ("reported",)
    class ReportedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    REPORTED_FIELD_NUMBER: _ClassVar[int]
    reported: _containers.ScalarMap[str, int]
    def __init__(self, reported: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Input(_message.Message):
    __slots__ = ("stream", "key_extractor")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    KEY_EXTRACTOR_FIELD_NUMBER: _ClassVar[int]
    stream: str
    key_extractor: str
    def __init__(self, stream: _Optional[str] = ..., key_extractor: _Optional[str] = ...) -> None: ...

class Follower(_message.Message):
    __slots__ = ("worker_id", "address")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("key_range", "worker_id", "address", "token", "followers", "in_sync", "start", "end", "parents", "cut")
    KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    FOLLOWERS_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    CUT_FIELD_NUMBER: _ClassVar[int]
    key_range: int
    worker_id: str
    address: str
    token: int
    followers: _containers.RepeatedCompositeFieldContainer[Follower]
    in_sync: _containers.RepeatedScalarFieldContainer[str]
    start: int
    end: int
    parents: _containers.RepeatedScalarFieldContainer[int]
    cut: int
    def __init__(self, key_range: _Optional[int] = ..., worker_id: _Optional[str] = ..., address: _Optional[str] = ..., token: _Optional[int] = ..., followers: _Optional[_Iterable[_Union[Follower, _Mapping]]] = ..., in_sync: _Optional[_Iterable[str]] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., parents: _Optional[_Iterable[int]] = ..., cut: _Optional[int] = ...) -> None: ...

class EngineOptions(_message.Message):
    __slots__ = ("fsync", "dedup_retention_s", "replication")
    FSYNC_FIELD_NUMBER: _ClassVar[int]
    DEDUP_RETENTION_S_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    fsync: bool
    dedup_retention_s: float
    replication: int
    def __init__(self, fsync: _Optional[bool] = ..., dedup_retention_s: _Optional[float] = ..., replication: _Optional[int] = ...) -> None: ...

class ComputationRoute(_message.Message):
    __slots__ = ("name", "topology", "code", "inputs", "outputs", "key_ranges", "exactly_once", "productions", "late_records", "params", "assignments", "job_state", "input_paused", "options")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    KEY_RANGES_FIELD_NUMBER: _ClassVar[int]
    EXACTLY_ONCE_FIELD_NUMBER: _ClassVar[int]
    PRODUCTIONS_FIELD_NUMBER: _ClassVar[int]
    LATE_RECORDS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    INPUT_PAUSED_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    topology: str
    code: str
    inputs: _containers.RepeatedCompositeFieldContainer[Input]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    key_ranges: int
    exactly_once: bool
    productions: str
    late_records: str
    params: _containers.ScalarMap[str, str]
    assignments: _containers.RepeatedCompositeFieldContainer[Assignment]
    job_state: str
    input_paused: bool
    options: EngineOptions
    def __init__(self, name: _Optional[str] = ..., topology: _Optional[str] = ..., code: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[Input, _Mapping]]] = ..., outputs: _Optional[_Iterable[str]] = ..., key_ranges: _Optional[int] = ..., exactly_once: _Optional[bool] = ..., productions: _Optional[str] = ..., late_records: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ..., assignments: _Optional[_Iterable[_Union[Assignment, _Mapping]]] = ..., job_state: _Optional[str] = ..., input_paused: _Optional[bool] = ..., options: _Optional[_Union[EngineOptions, _Mapping]] = ...) -> None: ...

class Dropped(_message.Message):
    __slots__ = ("computation", "below")
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    BELOW_FIELD_NUMBER: _ClassVar[int]
    computation: str
    below: int
    def __init__(self, computation: _Optional[str] = ..., below: _Optional[int] = ...) -> None: ...

class Routing(_message.Message):
    __slots__ = ("version", "computations", "dropped", "closed_streams")
    class ClosedStreamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COMPUTATIONS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    CLOSED_STREAMS_FIELD_NUMBER: _ClassVar[int]
    version: int
    computations: _containers.RepeatedCompositeFieldContainer[ComputationRoute]
    dropped: _containers.RepeatedCompositeFieldContainer[Dropped]
    closed_streams: _containers.ScalarMap[str, str]
    def __init__(self, version: _Optional[int] = ..., computations: _Optional[_Iterable[_Union[ComputationRoute, _Mapping]]] = ..., dropped: _Optional[_Iterable[_Union[Dropped, _Mapping]]] = ..., closed_streams: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RoutingRequest(_message.Message):
    __slots__ = ("known_version",)
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    def __init__(self, known_version: _Optional[int] = ...) -> None: ...

class MoveTabletRequest(_message.Message):
    __slots__ = ("computation", "key_range", "worker")
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    computation: str
    key_range: int
    worker: str
    def __init__(self, computation: _Optional[str] = ..., key_range: _Optional[int] = ..., worker: _Optional[str] = ...) -> None: ...

class MoveTabletResponse(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: int
    def __init__(self, token: _Optional[int] = ...) -> None: ...

class SplitRequest(_message.Message):
    __slots__ = ("computation", "key_range", "at", "has_at")
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    HAS_AT_FIELD_NUMBER: _ClassVar[int]
    computation: str
    key_range: int
    at: int
    has_at: bool
    def __init__(self, computation: _Optional[str] = ..., key_range: _Optional[int] = ..., at: _Optional[int] = ..., has_at: _Optional[bool] = ...) -> None: ...

class MergeRequest(_message.Message):
    __slots__ = ("computation", "left", "right")
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    RIGHT_FIELD_NUMBER: _ClassVar[int]
    computation: str
    left: int
    right: int
    def __init__(self, computation: _Optional[str] = ..., left: _Optional[int] = ..., right: _Optional[int] = ...) -> None: ...

class RangeInfo(_message.Message):
    __slots__ = ("key_range", "start", "end", "worker_id", "token")
    KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    key_range: int
    start: int
    end: int
    worker_id: str
    token: int
    def __init__(self, key_range: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., worker_id: _Optional[str] = ..., token: _Optional[int] = ...) -> None: ...

class ReshardResponse(_message.Message):
    __slots__ = ("ranges",)
    RANGES_FIELD_NUMBER: _ClassVar[int]
    ranges: _containers.RepeatedCompositeFieldContainer[RangeInfo]
    def __init__(self, ranges: _Optional[_Iterable[_Union[RangeInfo, _Mapping]]] = ...) -> None: ...

class InSyncRequest(_message.Message):
    __slots__ = ("computation", "key_range", "token", "follower", "add", "primary", "secret")
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    computation: str
    key_range: int
    token: int
    follower: str
    add: bool
    primary: str
    secret: str
    def __init__(self, computation: _Optional[str] = ..., key_range: _Optional[int] = ..., token: _Optional[int] = ..., follower: _Optional[str] = ..., add: _Optional[bool] = ..., primary: _Optional[str] = ..., secret: _Optional[str] = ...) -> None: ...

class InSyncResponse(_message.Message):
    __slots__ = ("in_sync",)
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    in_sync: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, in_sync: _Optional[_Iterable[str]] = ...) -> None: ...

class UpdateRequest(_message.Message):
    __slots__ = ("topology_json", "drop_state", "reset_state")
    TOPOLOGY_JSON_FIELD_NUMBER: _ClassVar[int]
    DROP_STATE_FIELD_NUMBER: _ClassVar[int]
    RESET_STATE_FIELD_NUMBER: _ClassVar[int]
    topology_json: str
    drop_state: bool
    reset_state: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topology_json: _Optional[str] = ..., drop_state: _Optional[bool] = ..., reset_state: _Optional[_Iterable[str]] = ...) -> None: ...

class UpdateResponse(_message.Message):
    __slots__ = ("summary_json",)
    SUMMARY_JSON_FIELD_NUMBER: _ClassVar[int]
    summary_json: str
    def __init__(self, summary_json: _Optional[str] = ...) -> None: ...

class JobRequest(_message.Message):
    __slots__ = ("topology", "keep_state")
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    KEEP_STATE_FIELD_NUMBER: _ClassVar[int]
    topology: str
    keep_state: bool
    def __init__(self, topology: _Optional[str] = ..., keep_state: _Optional[bool] = ...) -> None: ...

class JobResponse(_message.Message):
    __slots__ = ("state", "detail")
    STATE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    state: str
    detail: str
    def __init__(self, state: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class SavepointRequest(_message.Message):
    __slots__ = ("topology", "end", "timeout_s", "savepoint_id", "renew", "verify")
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SAVEPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    RENEW_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    topology: str
    end: bool
    timeout_s: float
    savepoint_id: str
    renew: bool
    verify: bool
    def __init__(self, topology: _Optional[str] = ..., end: _Optional[bool] = ..., timeout_s: _Optional[float] = ..., savepoint_id: _Optional[str] = ..., renew: _Optional[bool] = ..., verify: _Optional[bool] = ...) -> None: ...

class TabletPlace(_message.Message):
    __slots__ = ("computation", "key_range", "start", "end", "address", "token", "saved_key_range")
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SAVED_KEY_RANGE_FIELD_NUMBER: _ClassVar[int]
    computation: str
    key_range: int
    start: int
    end: int
    address: str
    token: int
    saved_key_range: int
    def __init__(self, computation: _Optional[str] = ..., key_range: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., address: _Optional[str] = ..., token: _Optional[int] = ..., saved_key_range: _Optional[int] = ...) -> None: ...

class SavepointResponse(_message.Message):
    __slots__ = ("topology_json", "tablets", "watermarks", "savepoint_id")
    class WatermarksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TOPOLOGY_JSON_FIELD_NUMBER: _ClassVar[int]
    TABLETS_FIELD_NUMBER: _ClassVar[int]
    WATERMARKS_FIELD_NUMBER: _ClassVar[int]
    SAVEPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    topology_json: str
    tablets: _containers.RepeatedCompositeFieldContainer[TabletPlace]
    watermarks: _containers.ScalarMap[str, int]
    savepoint_id: str
    def __init__(self, topology_json: _Optional[str] = ..., tablets: _Optional[_Iterable[_Union[TabletPlace, _Mapping]]] = ..., watermarks: _Optional[_Mapping[str, int]] = ..., savepoint_id: _Optional[str] = ...) -> None: ...

class RestoreRequest(_message.Message):
    __slots__ = ("manifest_json", "name", "commit")
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    manifest_json: str
    name: str
    commit: bool
    def __init__(self, manifest_json: _Optional[str] = ..., name: _Optional[str] = ..., commit: _Optional[bool] = ...) -> None: ...

class RestoreResponse(_message.Message):
    __slots__ = ("name", "tablets")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TABLETS_FIELD_NUMBER: _ClassVar[int]
    name: str
    tablets: _containers.RepeatedCompositeFieldContainer[TabletPlace]
    def __init__(self, name: _Optional[str] = ..., tablets: _Optional[_Iterable[_Union[TabletPlace, _Mapping]]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class DeliverFrame(_message.Message):
    __slots__ = ("id", "deliveries", "answer_each", "credit_each")
    ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    ANSWER_EACH_FIELD_NUMBER: _ClassVar[int]
    CREDIT_EACH_FIELD_NUMBER: _ClassVar[int]
    id: int
    deliveries: DeliverManyRequest
    answer_each: bool
    credit_each: bool
    def __init__(self, id: _Optional[int] = ..., deliveries: _Optional[_Union[DeliverManyRequest, _Mapping]] = ..., answer_each: _Optional[bool] = ..., credit_each: _Optional[bool] = ...) -> None: ...

class DeliverAnswerFrame(_message.Message):
    __slots__ = ("id", "answers", "credit", "code", "details", "indexes", "more")
    ID_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    INDEXES_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    id: int
    answers: DeliverManyResponse
    credit: int
    code: int
    details: str
    indexes: _containers.RepeatedScalarFieldContainer[int]
    more: bool
    def __init__(self, id: _Optional[int] = ..., answers: _Optional[_Union[DeliverManyResponse, _Mapping]] = ..., credit: _Optional[int] = ..., code: _Optional[int] = ..., details: _Optional[str] = ..., indexes: _Optional[_Iterable[int]] = ..., more: _Optional[bool] = ...) -> None: ...

class ReplicateFrame(_message.Message):
    __slots__ = ("id", "requests")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    id: int
    requests: ReplicateManyRequest
    def __init__(self, id: _Optional[int] = ..., requests: _Optional[_Union[ReplicateManyRequest, _Mapping]] = ...) -> None: ...

class ReplicateAnswerFrame(_message.Message):
    __slots__ = ("id", "answers", "credit", "code", "details")
    ID_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    id: int
    answers: ReplicateManyResponse
    credit: int
    code: int
    details: str
    def __init__(self, id: _Optional[int] = ..., answers: _Optional[_Union[ReplicateManyResponse, _Mapping]] = ..., credit: _Optional[int] = ..., code: _Optional[int] = ..., details: _Optional[str] = ...) -> None: ...
