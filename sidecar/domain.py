"""Plain domain records shared by the store, the services and the gRPC layer.

Enums use the protobuf numbers so conversion is a cast, but nothing here imports the stubs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sidecar.errors import InvalidArgument
from sidecar.ids import check_id


@dataclass(frozen=True, slots=True)
class Scope:
    """Who is asking. Every store call that touches user data takes one and filters on it."""

    tenant_id: str
    user_id: str

    @classmethod
    def checked(cls, tenant_id: str, user_id: str, *, user_required: bool = True) -> Scope:
        check_id(tenant_id, "scope.tenant_id")
        check_id(user_id, "scope.user_id", required=user_required)
        return cls(tenant_id, user_id)


class Role(enum.IntEnum):
    USER = 1
    ASSISTANT = 2
    TOOL = 3
    SYSTEM = 4

    @property
    def label(self) -> str:
        return self.name.lower()


class Category(enum.IntEnum):
    """Budget categories of context items (proto Category numbers)."""

    SYSTEM_AND_TOOLS = 1
    SESSION_STATE = 2
    RECENT_MESSAGES = 3
    TOOL_OBSERVATIONS = 4
    MEMORIES = 5
    RAG_OR_GRAPH = 6


class SessionStatus(enum.IntEnum):
    OPEN = 1
    CLOSED = 2


class Provenance(enum.IntEnum):
    USER_CONFIRMED = 1
    TOOL_VERIFIED = 2
    MODEL_INFERRED = 3


class FactStatus(enum.IntEnum):
    CONFIRMED = 1
    CANDIDATE = 2
    REJECTED = 3


class RunStatus(enum.IntEnum):
    RUNNING = 1
    INTERRUPTED = 2
    COMPLETED = 3
    FAILED = 4
    CANCELLED = 5


class JobStatus(enum.IntEnum):
    QUEUED = 1
    RUNNING = 2
    DONE = 3
    FAILED = 4


def enum_value(enum_cls: type[enum.IntEnum], value: int, field_name: str) -> enum.IntEnum:
    """Turn a wire enum number into the domain enum, rejecting 0 and unknown numbers."""
    try:
        return enum_cls(value)
    except ValueError:
        names = ", ".join(m.name for m in enum_cls)
        raise InvalidArgument(f"{field_name} must be one of {names} (got {value})") from None


@dataclass(slots=True)
class Session:
    tenant_id: str
    user_id: str
    session_id: str
    title: str
    status: SessionStatus
    created_at_ms: int
    updated_at_ms: int
    closed_at_ms: int = 0
    parent_session_id: str = ""
    task: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    message_count: int = 0


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call an assistant message made. A tool result answers it by naming its id (RecordToolResult's
    call_id, or a tool message's tool_call_id); arguments_json is a JSON object's text ("" means {})."""

    id: str
    name: str
    arguments_json: str = ""


@dataclass(slots=True)
class NewMessage:
    role: Role
    text: str
    tool_name: str = ""
    tool_call_id: str = ""
    client_timestamp_ms: int = 0
    idempotency_key: str = ""
    speaker: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(slots=True)
class Message:
    message_id: str
    session_id: str
    seq: int
    role: Role
    text: str
    tool_name: str
    tool_call_id: str
    timestamp_ms: int
    created_at_ms: int
    tokens: int
    # Tokens of the line as rendered in a prompt ("role: text"), counted at ingest too.
    line_tokens: int
    idempotency_key: str = ""
    speaker: str = ""
    tool_calls: tuple[ToolCall, ...] = ()

    @property
    def rendered(self) -> str:
        return render_message_line(self.role, self.speaker, self.text)


def render_message_line(role: Role, speaker: str, text: str) -> str:
    # Stripped: a packed line starts with its label, never with a blank (tokens.count_line).
    return f"{speaker.strip() or role.label}: {text}"


@dataclass(slots=True)
class Fact:
    key: str
    value: str
    provenance: Provenance
    source: str
    updated_at_ms: int
    status: FactStatus
    version: int
    tokens: int

    @property
    def rendered(self) -> str:
        return render_fact_line(self.key, self.value)


def render_fact_line(key: str, value: str) -> str:
    return f"{key}: {value}"


@dataclass(slots=True)
class FactChange:
    fact: Fact
    action: str
    reason: str


@dataclass(slots=True)
class Run:
    run_id: str
    session_id: str
    status: RunStatus
    goal: str
    reason: str
    created_at_ms: int
    updated_at_ms: int
    checkpoint_count: int = 0


@dataclass(slots=True)
class RunCheckpoint:
    checkpoint_id: str
    run_id: str
    seq: int
    state: bytes
    pending_step: str
    created_at_ms: int


@dataclass(slots=True)
class Job:
    job_id: str
    tenant_id: str
    user_id: str
    kind: str
    payload: dict
    status: JobStatus
    attempts: int
    error: str
    done_items: int
    total_items: int
    created_at_ms: int
    updated_at_ms: int
    result: dict[str, str] = field(default_factory=dict)


class MemoryType(enum.IntEnum):
    PREFERENCE = 1
    EPISODE = 2
    HABIT = 3
    SEMANTIC = 4


class Authority(enum.IntEnum):
    USER_STATED = 1
    TOOL_VERIFIED = 2
    INFERRED = 3


class MemoryStatus(enum.IntEnum):
    ACTIVE = 1
    SUPERSEDED = 2
    DELETED = 3


@dataclass(slots=True)
class Memory:
    memory_id: str
    type: MemoryType
    content: str
    subject: str
    source_message_ids: list[str]
    confidence: float
    authority: Authority
    created_at_ms: int
    updated_at_ms: int
    expires_at_ms: int = 0
    status: MemoryStatus = MemoryStatus.ACTIVE
    superseded_by: str = ""
    tokens: int = 0

    def expired(self, now: int) -> bool:
        return 0 < self.expires_at_ms <= now


@dataclass(slots=True)
class MemoryChange:
    memory: Memory
    action: str
    reason: str
    at_ms: int


class ToolStatus(enum.IntEnum):
    OK = 1
    ERROR = 2


@dataclass(slots=True)
class ToolResult:
    """A stored tool output. `view_text` is the trimmed view BuildContext shows for the latest result,
    `brief_text` the shorter one for older results; both are computed once when it is recorded."""

    tool_result_id: str
    session_id: str
    run_id: str
    tool_name: str
    call_id: str
    status: ToolStatus
    tokens: int
    lines: int
    view_text: str
    view_tokens: int
    brief_text: str
    brief_tokens: int
    created_at_ms: int
    full_text: str = ""


@dataclass(slots=True)
class RunNote:
    note_id: str
    session_id: str
    run_id: str
    seq: int
    text: str
    tokens: int
    is_summary: bool
    folded_note_ids: list[str]
    created_at_ms: int


@dataclass(slots=True)
class SessionSummary:
    session_id: str
    text: str
    tokens: int
    source_message_ids: list[str]
    covered_until_seq: int
    state: str  # the summarizer's own state (JSON), so updates stay incremental
    updated_at_ms: int


@dataclass(slots=True)
class PinnedConstraint:
    message_id: str
    idx: int
    text: str
    tokens: int
    created_at_ms: int
    unpinned_at_ms: int = 0  # set once unpinned; the row stays, with who and why
    unpinned_by: str = ""
    unpin_reason: str = ""
    session_id: str = ""  # where it was said (a parent's, for a sub-session's inherited constraint)

    @property
    def pin_id(self) -> str:
        return f"{self.message_id}:{self.idx}"


@dataclass(slots=True)
class SubSessionResult:
    parent_session_id: str
    child_session_id: str
    task: str
    text: str
    tokens: int
    created_at_ms: int


@dataclass(slots=True)
class DocumentVersion:
    doc_id: str
    version: int
    title: str
    format: int
    allowed_roles: list[str]
    metadata: dict[str, str]
    chunk_count: int
    live: bool
    indexed: bool
    created_at_ms: int


@dataclass(slots=True)
class KnowledgeChunk:
    doc_id: str
    version: int
    chunk_index: int
    heading: str
    text: str
    tokens: int

    @property
    def key(self) -> str:
        """Also the source tag's body: kb:<doc>@v<version>#<chunk>."""
        return f"{self.doc_id}@v{self.version}#{self.chunk_index}"


@dataclass(slots=True, frozen=True)
class GraphEdge:
    edge_id: str
    subject: str
    relation: str
    object: str
    source: str
    valid_from_ms: int = 0
    valid_to_ms: int = 0
