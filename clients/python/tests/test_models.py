"""The models against ``docs/openapi.json``: a drift in either fails here.

For each model: the same properties, the same required ones, the same
nullability, and the same type (``string`` is ``str``, ``date-time`` is
``datetime``, an enum is a ``Literal`` of exactly its values, ``$ref`` is the
model of that schema, ``{}`` is ``Any``). Every schema of the document must
be modelled, or be listed in ``NOT_MODELLED`` with the reason.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pytest

import docstream
from docstream import _models

OPENAPI = Path(__file__).resolve().parents[3] / "docs" / "openapi.json"
SPEC: dict[str, Any] = json.loads(OPENAPI.read_text())
SCHEMAS: dict[str, Any] = SPEC["components"]["schemas"]

# The schemas' models: the answers' dataclasses and the requests' TypedDicts.
MODELS: dict[str, Any] = {
    cls.__schema__: cls
    for cls in vars(_models).values()
    if isinstance(cls, type) and issubclass(cls, _models.Model) and cls.__schema__
}
MODELS.update(
    {
        name: getattr(_models, name)
        for name in [
            "Word",
            "Page",
            "TextDocument",
            "PagesDocument",
            "ObjectDocument",
            "UrlDocument",
            "FieldSpec",
            "ExtractionRequest",
            "JobFilter",
        ]
    }
)
MODELS["Document"] = _models.Document

ENUMS: dict[str, Any] = {
    "ExtractionStatus": _models.ExtractionStatus,
    "BboxStatus": _models.BboxStatus,
    "Priority": _models.Priority,
    "FieldType": _models.FieldType,
    "FileType": _models.FileType,
    "BulkActionName": _models.BulkActionName,
    "BulkOutcomeKind": _models.BulkOutcomeKind,
    "PublishReason": _models.PublishReason,
}

NOT_MODELLED = {
    # Operator and administration answers: not what an application client calls.
    "ApiKey": "admin scope (GET /v1/tenant)",
    "Tenant": "admin scope (GET /v1/tenant)",
    "TenantList": "operator scope",
    "DisabledEndpoint": "admin scope (GET /v1/tenant)",
    "Census": "GET /v1/overview: dashboards",
    "Overview": "GET /v1/overview: dashboards",
    "Sample": "GET /v1/overview: dashboards",
    "GroupLag": "GET /v1/overview: dashboards",
    "OpenClass": "operator scope",
    # External extractors: other clients' routes.
    "DeferredResult": "sent by an extraction service, not by applications",
    "ResultRecorded": "answered to an extraction service",
    # The import stream is not wrapped (submit covers it).
    "ImportFrame": "import stream",
    "ImportAnswer": "import stream",
    # Parsed into the exceptions (code, message, retry_after).
    "Error": "raised as APIError",
    "RetryError": "raised as RateLimitError",
    # Bodies sent as JSON built inside the client.
    "BulkAction": "built by Client.bulk",
    "CorrectionRequest": "built by Client.correct",
    "ExportAck": "sent by ExportStream",
    # JSON without further shape.
    "JsonValue": "typed Any",
}

# Enums whose values are the deployment's (the document lists the default settings').
OPEN_ENUMS = {"ExtractionRequest.extractor"}

NULL = {"type": "null"}


def _deref(name: str) -> Any:
    return SCHEMAS[name]


def _ref_name(schema: dict[str, Any]) -> str:
    ref: str = schema["$ref"]
    return ref.rsplit("/", 1)[-1]


def _is_enum_schema(schema: dict[str, Any]) -> bool:
    return "oneOf" in schema and all("const" in x for x in schema["oneOf"])


def _split_null(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The schema without its null alternative, and whether it had one."""
    if "anyOf" in schema and any(x == NULL for x in schema["anyOf"]):
        rest = [x for x in schema["anyOf"] if x != NULL]
        assert len(rest) == 1, schema
        return rest[0], True
    kind = schema.get("type")
    if isinstance(kind, list) and "null" in kind:
        rest = [k for k in kind if k != "null"]
        out = dict(schema)
        out["type"] = rest[0] if len(rest) == 1 else rest
        if "enum" in out:
            out["enum"] = [v for v in out["enum"] if v is not None]
        return out, True
    return schema, False


def _split_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (Union, types.UnionType):
        args = get_args(tp)
        if type(None) in args:
            rest = [a for a in args if a is not type(None)]
            return (rest[0] if len(rest) == 1 else Union[tuple(rest)]), True
    return tp, False


def _literal_values(tp: Any) -> set[Any] | None:
    return set(get_args(tp)) if get_origin(tp) is Literal else None


def _hints(cls: Any) -> dict[str, Any]:
    return get_type_hints(cls)


def _is_typeddict(tp: Any) -> bool:
    return typing.is_typeddict(tp)


def check_type(tp: Any, schema: dict[str, Any], where: str, errors: list[str], *, may_be_optional: bool = False,
               request: bool = False) -> None:
    inner_schema, nullable = _split_null(schema)
    inner_tp, optional = _split_optional(tp)
    if nullable != optional and not (optional and may_be_optional):
        errors.append(f"{where}: nullable in the document: {nullable}; Optional in the model: {optional}")
    check_inner(inner_tp, inner_schema, where, errors, request)


def check_inner(tp: Any, schema: dict[str, Any], where: str, errors: list[str], request: bool = False) -> None:
    if "$ref" in schema:
        name = _ref_name(schema)
        target = _deref(name)
        if name == "JsonValue":
            if tp is not Any:
                errors.append(f"{where}: JsonValue should be Any, is {tp}")
        elif _is_enum_schema(target):
            values = {x["const"] for x in target["oneOf"]}
            if _literal_values(tp) != values:
                errors.append(f"{where}: enum {name} is {sorted(values)}, the model has {tp}")
        elif name in MODELS:
            if tp is not MODELS[name]:
                errors.append(f"{where}: should be the model of {name}, is {tp}")
        else:
            errors.append(f"{where}: no model for the schema {name}")
        return
    meaningful = {k: v for k, v in schema.items() if k not in ("description", "default", "examples")}
    if not meaningful:
        if tp is not Any:
            errors.append(f"{where}: an open schema should be Any, is {tp}")
        return
    if "enum" in schema:
        values = set(schema["enum"])
        literal = _literal_values(tp)
        if literal is None and tp is str and where in OPEN_ENUMS:
            return
        if literal != values:
            errors.append(f"{where}: enum {sorted(values)}, the model has {tp}")
        return
    kind = schema.get("type")
    if kind == "string":
        # Answers' times are decoded; requests' are RFC 3339 text, as JSON has them.
        want: Any = datetime if schema.get("format") == "date-time" and not request else str
        if tp is not want:
            errors.append(f"{where}: string ({schema.get('format')}) should be {want.__name__}, is {tp}")
    elif kind == "integer":
        if tp is not int:
            errors.append(f"{where}: integer should be int, is {tp}")
    elif kind == "number":
        if tp is not float:
            errors.append(f"{where}: number should be float, is {tp}")
    elif kind == "boolean":
        if tp is not bool:
            errors.append(f"{where}: boolean should be bool, is {tp}")
    elif kind == "array":
        if get_origin(tp) is not list:
            errors.append(f"{where}: array should be list[...], is {tp}")
        else:
            check_type(get_args(tp)[0], schema.get("items", {}), f"{where}[]", errors, request=request)
    elif kind == "object":
        if "properties" in schema:
            if not (isinstance(tp, type) and issubclass(tp, _models.Model)):
                errors.append(f"{where}: an object with properties should be a model, is {tp}")
            else:
                errors.extend(check_model(tp, schema, where))
        elif isinstance(schema.get("additionalProperties"), dict):
            if get_origin(tp) is not dict:
                errors.append(f"{where}: a map should be dict[str, ...], is {tp}")
            else:
                check_type(get_args(tp)[1], schema["additionalProperties"], f"{where}{{}}", errors, request=request)
        elif tp != dict[str, Any]:
            errors.append(f"{where}: an open object should be dict[str, Any], is {tp}")
    else:
        errors.append(f"{where}: the document's type {kind!r} is not handled by this check")


def check_model(cls: Any, schema: dict[str, Any], name: str) -> list[str]:
    errors: list[str] = []
    props = {
        k: v
        for k, v in schema.get("properties", {}).items()
        # `{"type": "null"}`: a key the other variants of a oneOf use, absent here.
        if v.get("type") != "null"
    }
    required = set(schema.get("required", []))
    hints = _hints(cls)
    if _is_typeddict(cls):
        names = set(hints)
        has_default = {k: k not in cls.__required_keys__ for k in names}
    else:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        names = set(fields)
        has_default = {
            k: f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            for k, f in fields.items()
        }
    for missing in sorted(set(props) - names):
        errors.append(f"{name}.{missing}: in the document, not in the model")
    for extra in sorted(names - set(props)):
        errors.append(f"{name}.{extra}: in the model, not in the document")
    for prop in sorted(names & set(props)):
        if (prop in required) == has_default[prop]:
            errors.append(f"{name}.{prop}: required in the document: {prop in required}; "
                          f"optional in the model: {has_default[prop]}")
        check_type(hints[prop], props[prop], f"{name}.{prop}", errors, may_be_optional=prop not in required,
                   request=_is_typeddict(cls))
    return errors


@pytest.mark.parametrize("name", sorted(set(MODELS) - {"Document"}))
def test_model_matches_the_document(name: str) -> None:
    assert name in SCHEMAS, f"the model {name} has no schema in docs/openapi.json"
    errors = check_model(MODELS[name], SCHEMAS[name], name)
    assert not errors, "\n".join(errors)


def test_inline_models_match_the_document() -> None:
    errors: list[str] = []
    for cls in vars(_models).values():
        path = getattr(cls, "__schema_path__", None)
        if isinstance(cls, type) and path:
            schema = SCHEMAS[path[0]]
            for prop in path[1:]:
                schema = schema["properties"][prop]
            errors += check_model(cls, schema, ".".join(path))
    assert not errors, "\n".join(errors)


def test_document_union_matches() -> None:
    refs = {_ref_name(x) for x in SCHEMAS["Document"]["oneOf"]}
    assert set(get_args(_models.Document)) == {MODELS[r] for r in refs}


@pytest.mark.parametrize("name", sorted(ENUMS))
def test_enum_matches_the_document(name: str) -> None:
    values = {x["const"] for x in SCHEMAS[name]["oneOf"]}
    assert set(get_args(ENUMS[name])) == values


def test_every_schema_is_modelled_or_excused() -> None:
    unknown = set(SCHEMAS) - set(MODELS) - set(ENUMS) - set(NOT_MODELLED)
    assert not unknown, f"schemas of docs/openapi.json without a model: {sorted(unknown)}"
    stale = set(NOT_MODELLED) - set(SCHEMAS)
    assert not stale, f"NOT_MODELLED names schemas the document no longer has: {sorted(stale)}"


def test_the_checker_catches_a_drift() -> None:
    """The check itself: a schema with a property more, or another type, fails."""
    schema = json.loads(json.dumps(SCHEMAS["Accepted"]))
    schema["properties"]["location"] = {"type": "string"}
    schema["required"].append("location")
    assert check_model(docstream.Accepted, schema, "Accepted") == [
        "Accepted.location: in the document, not in the model"
    ]
    schema = json.loads(json.dumps(SCHEMAS["File"]))
    schema["properties"]["size"] = {"type": "string"}
    assert check_model(docstream.File, schema, "File") == [
        "File.size: string (None) should be str, is <class 'int'>"
    ]


def test_decoding_a_job() -> None:
    job = docstream.Extraction.from_dict(
        {
            "id": "0190",
            "status": "succeeded",
            "attempts": 1,
            "priority": "normal",
            "idempotency_key": None,
            "submitted_at": "2026-12-03T09:00:00.123456789Z",
            "started_at": None,
            "finished_at": "2026-12-03T09:00:01Z",
            "result": {"fields": {"total": {"value": "12.50", "words": [3, 3]}, "iban": None}},
            "error": None,
            "next_attempt_at": None,
            "cancel_requested_at": None,
            "post_processing": {
                "bbox_refinement": {
                    "status": "succeeded", "attempts": 1, "requested_at": None, "published_at": None,
                    "started_at": None, "lease_expires_at": None, "finished_at": None, "error": None,
                    "republished_at": None, "last_recovery_s": None,
                    "result": {"fields": {"total": {"page": 0, "bbox": [1, 2, 3, 4], "words": [3, 3]}},
                               "needs_review": 0},
                }
            },
            "webhook_url": None,
            "metadata": {"customer": "acme"},
            "erased_at": None,
            "a_property_of_a_newer_server": 1,
        }
    )
    assert job.fields == {"total": "12.50", "iban": None}
    assert job.submitted_at.microsecond == 123456 and job.submitted_at.tzinfo is not None
    box = job.boxes["total"]
    assert box is not None and box.bbox == [1.0, 2.0, 3.0, 4.0] and isinstance(box.bbox[0], float)
