"""Typed models of the API's bodies, mirroring ``docs/openapi.json``.

Answers are frozen dataclasses built with ``Model.from_dict(json)``; requests
are :class:`typing.TypedDict`\\ s, so a plain ``dict`` literal type-checks.
Each class names the OpenAPI schema it mirrors in ``__schema__`` (or its
``__schema_path__`` for inline schemas), and ``tests/test_models.py`` fails
when a property, its type, whether it is required or nullable, or an enum's
values differ from the document.

Decoding is lenient where that keeps old clients working against newer
servers: unknown properties are ignored and enum values are not checked.
Timestamps become timezone-aware :class:`datetime.datetime` objects.
"""

import dataclasses
import re
import types
from collections.abc import Mapping
from datetime import datetime
from typing import (
    Any,
    ClassVar,
    Literal,
    NotRequired,
    Required,
    TypedDict,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

__all__ = [
    # enums
    "ExtractionStatus",
    "BboxStatus",
    "Priority",
    "FieldType",
    "FileType",
    "BulkActionName",
    "BulkOutcomeKind",
    "PublishReason",
    # requests
    "Word",
    "Page",
    "TextDocument",
    "PagesDocument",
    "ObjectDocument",
    "UrlDocument",
    "Document",
    "FieldSpec",
    "ExtractionRequest",
    "JobFilter",
    # answers
    "Model",
    "Accepted",
    "Candidate",
    "Choice",
    "ExtractedValue",
    "ExtractionResult",
    "BboxRefinement",
    "PostProcessing",
    "Extraction",
    "ExtractionPage",
    "TransitionLogEntry",
    "File",
    "BulkOutcome",
    "BulkOperation",
    "DeadLetter",
    "DeadLetterPage",
    "Replayed",
    "Me",
    "FieldCorrection",
    "Correction",
    "PageImage",
    "ExtractionEvent",
    "ExportFrame",
    "ErrorDetail",
    "GroundedField",
    "Grounding",
    "TERMINAL_STATUSES",
]

# --------------------------------------------------------------------------
# Enumerations (OpenAPI `oneOf` of `const`s)
# --------------------------------------------------------------------------

ExtractionStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
"""A job's state. ``succeeded``, ``failed`` and ``cancelled`` are final (a retry reopens a failed job)."""
BboxStatus = Literal["pending", "running", "succeeded", "failed"]
"""The state of a job's bbox refinement (grounding each value in the document's words)."""
Priority = Literal["high", "normal", "low"]
FieldType = Literal["string", "number", "money", "date"]
FileType = Literal["application/pdf", "image/png", "image/jpeg", "image/tiff", "text/plain"]
BulkActionName = Literal["cancel", "retry"]
BulkOutcomeKind = Literal["done", "refused", "not_found"]
PublishReason = Literal["submit", "retry", "reaper", "operator"]

TERMINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
"""The statuses a job stays in unless someone retries it."""

# --------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------


class Word(TypedDict):
    """A positioned word: ``bbox`` is ``[x0, y0, x1, y1]`` from the page's top-left corner."""

    text: str
    bbox: list[float]
    confidence: NotRequired[float | None]


class Page(TypedDict):
    """One page of a document sent as words."""

    width: float
    height: float
    words: list[Word]


class TextDocument(TypedDict):
    """A document given as plain text."""

    text: str


class PagesDocument(TypedDict):
    """A document given as pages of positioned words."""

    pages: list[Page]


class ObjectDocument(TypedDict):
    """A document that is a file uploaded before (its id, the SHA-256 of its bytes)."""

    object: str


class UrlDocument(TypedDict):
    """A document docstream fetches from a URL at the submit."""

    url: str


Document = Union[TextDocument, PagesDocument, ObjectDocument, UrlDocument]


class FieldSpec(TypedDict, total=False):
    """One field to extract. The built-in ``rules`` extractor needs a ``pattern`` or an ``anchor``."""

    name: Required[str]
    type: FieldType
    anchor: str | None
    pattern: str | None
    required: bool


class ExtractionRequest(TypedDict, total=False):
    """The body of ``POST /v1/extractions``."""

    document: Required[Document]
    fields: Required[list[FieldSpec]]
    extractor: str | None
    metadata: Any
    min_confidence: float | None
    priority: Priority | None
    webhook_url: str | None


class JobFilter(TypedDict, total=False):
    """Which jobs a list or a bulk action covers; every key is optional, all are ANDed.

    ``status`` and ``bbox_status`` are comma-separated; times are RFC 3339;
    ``metadata`` keeps jobs whose top-level metadata keys have these values
    (compared as text).
    """

    status: str | None
    bbox_status: str | None
    extractor: str | None
    submitted_after: str | None
    submitted_before: str | None
    finished_after: str | None
    finished_before: str | None
    idempotency_key: str | None
    error_prefix: str | None
    metadata: dict[str, str]
    needs_review: bool | None


# --------------------------------------------------------------------------
# Answers
# --------------------------------------------------------------------------

M = TypeVar("M", bound="Model")

_HINTS: dict[type[Any], dict[str, Any]] = {}
_FRACTION = re.compile(r"\.(\d+)")


def _parse_datetime(value: str) -> datetime:
    # Python 3.11's fromisoformat takes RFC 3339 (`Z`, any number of fraction
    # digits up to 6); Postgres may give more digits, so keep six.
    text = _FRACTION.sub(lambda m: "." + m.group(1)[:6].ljust(6, "0"), value, count=1)
    return datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))


def _decode(tp: Any, value: Any) -> Any:
    """``value`` (decoded JSON) as the annotated type ``tp``."""
    if tp is Any or value is None:
        return value
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        options = [a for a in get_args(tp) if a is not type(None)]
        return _decode(options[0], value) if len(options) == 1 else value
    if origin is Literal:
        return value
    if origin is list:
        (item,) = get_args(tp)
        return [_decode(item, v) for v in value]
    if origin is dict:
        _, item = get_args(tp)
        return {k: _decode(item, v) for k, v in value.items()}
    if tp is datetime:
        return _parse_datetime(value)
    if tp is float and isinstance(value, int):
        return float(value)
    if isinstance(tp, type) and issubclass(tp, Model):
        return tp.from_dict(value)
    return value


class Model:
    """The base of the answer models: frozen dataclasses decoded from JSON."""

    __schema__: ClassVar[str | None] = None

    @classmethod
    def from_dict(cls: "type[M]", data: Mapping[str, Any]) -> "M":
        """Builds the model from its JSON object, ignoring properties it does not know."""
        hints = _HINTS.get(cls)
        if hints is None:
            hints = get_type_hints(cls)
            _HINTS[cls] = hints
        kwargs = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name in data:
                kwargs[f.name] = _decode(hints[f.name], data[f.name])
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The model as plain Python values (timestamps stay ``datetime``)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload, no-any-return]


@dataclasses.dataclass(frozen=True)
class Accepted(Model):
    """The answer to a submit: the job's id and status (``queued`` for a new one)."""

    __schema__: ClassVar[str | None] = "Accepted"
    id: str
    status: ExtractionStatus


@dataclasses.dataclass(frozen=True)
class Candidate(Model):
    """A value a field could have had: its words, its score (higher is better) and what its label says."""

    __schema__: ClassVar[str | None] = "Candidate"
    value: str
    words: list[int]
    score: float
    why: str


@dataclasses.dataclass(frozen=True)
class Choice(Model):
    """How a value was chosen: the rule that won and the best candidates, best first."""

    __schema__: ClassVar[str | None] = "Choice"
    rule: str
    candidates: list[Candidate]


@dataclasses.dataclass(frozen=True)
class ExtractedValue(Model):
    """One extracted value; ``words`` is the range ``[first, last]`` of the document's words it came from.

    ``confidence`` is how sure the extractor is (0 to 1), when it says; ``chosen`` says how a
    value under the request's ``min_confidence`` was chosen among the page's candidates.
    """

    __schema__: ClassVar[str | None] = "ExtractedValue"
    value: str
    raw: str | None = None
    words: list[int] | None = None
    confidence: float | None = None
    chosen: Choice | None = None


@dataclasses.dataclass(frozen=True)
class ExtractionResult(Model):
    """An extraction's result: each field's value, ``None`` when it was not found."""

    __schema__: ClassVar[str | None] = "ExtractionResult"
    fields: dict[str, ExtractedValue | None]


@dataclasses.dataclass(frozen=True)
class GroundedField(Model):
    """Where a value sits on the page: its page (from 0) and the union box of its words."""

    __schema__: ClassVar[str | None] = "GroundedField"
    page: int
    bbox: list[float]
    words: list[int]
    confidence: float | None = None
    needs_review: bool = False


@dataclasses.dataclass(frozen=True)
class Grounding(Model):
    """The result of a bbox refinement: each field's box, ``None`` when it has none."""

    __schema__: ClassVar[str | None] = "Grounding"
    fields: dict[str, GroundedField | None]
    needs_review: int = 0


@dataclasses.dataclass(frozen=True)
class BboxRefinement(Model):
    """The post-processing step that grounds each value in the document's words."""

    __schema__: ClassVar[str | None] = "BboxRefinement"
    status: BboxStatus
    attempts: int
    requested_at: datetime | None
    published_at: datetime | None
    started_at: datetime | None
    lease_expires_at: datetime | None
    finished_at: datetime | None
    result: Grounding | None
    """Each field's box, once the refinement succeeded."""
    error: str | None
    republished_at: datetime | None
    last_recovery_s: float | None


@dataclasses.dataclass(frozen=True)
class PostProcessing(Model):
    """What happens to a job after its extraction."""

    __schema_path__: ClassVar[tuple[str, ...]] = ("Extraction", "post_processing")
    bbox_refinement: BboxRefinement | None = None


@dataclasses.dataclass(frozen=True)
class Extraction(Model):
    """A job, as ``GET /v1/extractions/{id}`` answers it."""

    __schema__: ClassVar[str | None] = "Extraction"
    id: str
    status: ExtractionStatus
    attempts: int
    priority: Priority
    idempotency_key: str | None
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    result: ExtractionResult | None
    error: str | None
    next_attempt_at: datetime | None
    cancel_requested_at: datetime | None
    post_processing: PostProcessing
    webhook_url: str | None
    metadata: Any
    erased_at: datetime | None
    request: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        """The job reached a final status (``succeeded``, ``failed`` or ``cancelled``)."""
        return self.status in TERMINAL_STATUSES

    @property
    def fields(self) -> dict[str, str | None]:
        """Each field's value (``None`` when not found); empty until the job succeeded."""
        if self.result is None:
            return {}
        return {k: (v.value if v is not None else None) for k, v in self.result.fields.items()}

    @property
    def boxes(self) -> dict[str, GroundedField | None]:
        """Each field's box on the page; empty until the bbox refinement succeeded."""
        refinement = self.post_processing.bbox_refinement
        grounding = refinement.result if refinement is not None else None
        return dict(grounding.fields) if grounding is not None else {}

    @property
    def fields_to_review(self) -> list[str]:
        """The fields whose grounded value is flagged ``needs_review`` (less sure
        than the request's ``min_confidence``), in name order; empty until the
        bbox refinement succeeded, and on a listed job without its result.

        A correction does not clear the flag here (the job does not carry its
        corrections): :meth:`Client.review_queue` leaves out the jobs whose
        flagged values were all corrected, :meth:`Client.corrections` says which.
        """
        return sorted(name for name, box in self.boxes.items() if box is not None and box.needs_review)


@dataclasses.dataclass(frozen=True)
class ExtractionPage(Model):
    """One page of ``GET /v1/extractions``."""

    __schema__: ClassVar[str | None] = "ExtractionPage"
    items: list[Extraction]
    next_cursor: str | None


@dataclasses.dataclass(frozen=True)
class TransitionLogEntry(Model):
    """One line of a job's transition log."""

    __schema__: ClassVar[str | None] = "TransitionLogEntry"
    transition: str
    token: int | None
    at: datetime


@dataclasses.dataclass(frozen=True)
class File(Model):
    """An uploaded file; its ``id`` is the SHA-256 of its bytes."""

    __schema__: ClassVar[str | None] = "File"
    id: str
    sha256: str
    size: int
    content_type: FileType
    created_at: datetime


@dataclasses.dataclass(frozen=True)
class BulkOutcome(Model):
    """What a bulk action did to one job."""

    __schema__: ClassVar[str | None] = "BulkOutcome"
    id: str
    outcome: BulkOutcomeKind
    status: ExtractionStatus | None
    reason: str | None


@dataclasses.dataclass(frozen=True)
class BulkOperation(Model):
    """A bulk cancel or retry, with its counts and a page of its outcomes."""

    __schema__: ClassVar[str | None] = "BulkOperation"
    id: str
    action: BulkActionName
    state: Literal["running", "finished"]
    done: int
    refused: int
    not_found: int
    created_at: datetime
    finished_at: datetime | None
    outcomes: list[BulkOutcome]
    next_cursor: str | None
    filter: JobFilter | None = None
    ids: list[str] | None = None


@dataclasses.dataclass(frozen=True)
class DeadLetter(Model):
    """A Kafka intake record that was refused, with where it was and why."""

    __schema__: ClassVar[str | None] = "DeadLetter"
    id: int
    source_topic: str
    source_partition: int
    source_offset: int
    idempotency_key: str | None
    error_kind: str
    error: str
    created_at: datetime
    replayed_at: datetime | None
    excerpt: str | None


@dataclasses.dataclass(frozen=True)
class DeadLetterPage(Model):
    """One page of ``GET /v1/dead-letters``."""

    __schema__: ClassVar[str | None] = "DeadLetterPage"
    items: list[DeadLetter]
    next_cursor: str | None


@dataclasses.dataclass(frozen=True)
class Replayed(Model):
    """Where a replayed dead letter's record was produced again."""

    __schema__: ClassVar[str | None] = "Replayed"
    id: int
    topic: str
    partition: int
    offset: int


@dataclasses.dataclass(frozen=True)
class Me(Model):
    """The key's tenant and scopes."""

    __schema__: ClassVar[str | None] = "Me"
    tenant: str
    scopes: list[str]


@dataclasses.dataclass(frozen=True)
class FieldCorrection(Model):
    """A reviewer's correction, as an export event carries it."""

    __schema__: ClassVar[str | None] = "FieldCorrection"
    correction_id: int
    field: str
    value: str | None
    key_id: str
    reviewer: str | None


@dataclasses.dataclass(frozen=True)
class Correction(Model):
    """A reviewer's correction of a job's value, stored beside the extracted one.

    ``value`` is ``None`` when the document does not hold the field. A field's
    latest correction (highest ``id``) is its value now.
    """

    __schema__: ClassVar[str | None] = "Correction"
    id: int
    extraction_id: str
    field: str
    value: str | None
    key_id: str
    reviewer: str | None
    corrected_at: datetime


@dataclasses.dataclass(frozen=True)
class PageImage:
    """A page of a job's file drawn as an image (``GET /v1/extractions/{id}/pages/{page}``).

    ``content`` is the image's bytes, ``content_type`` its media type:
    ``image/png`` (a PNG's own bytes, or a PDF page rendered at 100 dpi or
    less) or ``image/jpeg`` (a JPEG's, without its EXIF).
    """

    content: bytes
    content_type: str

    @property
    def extension(self) -> str:
        """The usual file name extension of its type, without the dot: ``png``, ``jpg``."""
        return {"image/png": "png", "image/jpeg": "jpg"}.get(self.content_type, "bin")


@dataclasses.dataclass(frozen=True)
class ExtractionEvent(Model):
    """One change of a job, as published on ``extraction.events``."""

    __schema__: ClassVar[str | None] = "ExtractionEvent"
    extraction_id: str
    transition: str
    status: ExtractionStatus
    bbox_status: BboxStatus | None
    token: int | None
    error: str | None
    reason: PublishReason
    published_at_ms: int
    tenant_id: str | None
    correction: FieldCorrection | None


@dataclasses.dataclass(frozen=True)
class ExportFrame(Model):
    """One event of the export stream: ``seq`` numbers the frames of one connection."""

    __schema__: ClassVar[str | None] = "ExportFrame"
    seq: int
    partition: int
    offset: int
    event: ExtractionEvent


@dataclasses.dataclass(frozen=True)
class ErrorDetail(Model):
    """The ``error`` object of an error answer."""

    __schema__: ClassVar[str | None] = "ErrorDetail"
    code: str
    message: str
    retry_after_s: int | None = None
