"""schemathesis hooks for docstream's API; scripts/lib/fuzz-api.sh loads them.

What JSON Schema cannot say about a request, these hooks teach the generator,
or, where that is not practical, recognise in the server's answer:

- The format `rust-regex` (a field's `pattern`): patterns that Rust's `regex`
  compiles, so that schema-valid requests carry patterns the server can run.
- `before_call`: a box's corners are put in order (x0 <= x1, y0 <= y1), and a
  valid `Idempotency-Key` gets a digest of the body in its last characters
  (same length), so that one key is never sent with two different requests
  (the server refuses that with 422, as it should). A `webhook_url`'s host is
  replaced by one under `.invalid`, which never resolves: `serve` delivers the
  webhooks of the jobs it cancels, and the fuzz must not post to hosts that
  exist (`https://0.com` does).
- `filter_failure`: a schema-valid request that the server refuses with 422
  for a reason JSON Schema has no words for (repeated field names, a pattern
  Rust does not compile or that compiles too large, a webhook host that is or
  resolves to an address webhooks may not reach, a string within `maxLength`
  characters but past its limit in bytes) is not a failure of the document.
  Only those 422s are dropped, each recognised by its message *and* checked
  against the request that got it; every other failure stands, and a 5xx is
  never dropped. What was dropped is counted and printed at the end.
- `filter_failure`, too: a request schemathesis generated as invalid data and
  the server accepted is not a failure when the body it sent is valid against
  the document after all. schemathesis counts a `format` it does not know (the
  `double` of every number) as never satisfied while it mutates a body, so a
  mutation can "violate" it with a value that is fine. The sent body is
  checked against the operation's own schema, standard formats included;
  only a body that passes is dropped.
"""

import atexit
import collections
import hashlib
import json
import re
import sys

import jsonschema_rs
import schemathesis
from hypothesis import strategies as st

# --- the `rust-regex` format -------------------------------------------------

# Characters `regex` treats as meta; a literal one is escaped (any ASCII
# punctuation may be).
_META = set("\\.+*?()|[]{}^$#&-~")
_ATOMS = (".", r"\d", r"\D", r"\s", r"\S", r"\w", r"\W", "[0-9]", "[A-Za-z]", "[^ ]",
          r"(\d+)", r"([A-Z]+-\d+)", r"(\d+\.\d{2})", r"\p{L}", r"(?:ab|cd)")
_QUANTIFIERS = ("", "", "+", "*", "?", "+?", "*?", "??", "{2}", "{1,3}", "{0,2}?")

_literal = st.characters(exclude_categories=("Cs",), exclude_characters="\x00").map(
    lambda c: "\\" + c if c in _META else c
)
_atom = st.sampled_from(_ATOMS) | _literal
_piece = st.builds(lambda atom, quantifier: atom + quantifier, _atom, st.sampled_from(_QUANTIFIERS))
rust_regex = st.builds(
    lambda flags, start, pieces, end: flags + start + "".join(pieces) + end,
    st.sampled_from(("", "", "(?i)", "(?m)")),
    st.sampled_from(("", "^")),
    st.lists(_piece, max_size=6),
    st.sampled_from(("", "$")),
)
schemathesis.openapi.format("rust-regex", rust_regex)

# --- requests made consistent ------------------------------------------------

_VALID_KEY = re.compile(r"^[\x21-\x7e]([\x20-\x7e]{0,253}[\x21-\x7e])?$")


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _order_boxes(body):
    document = body.get("document") if isinstance(body, dict) else None
    pages = document.get("pages") if isinstance(document, dict) else None
    for page in pages if isinstance(pages, list) else []:
        words = page.get("words") if isinstance(page, dict) else None
        for word in words if isinstance(words, list) else []:
            box = word.get("bbox") if isinstance(word, dict) else None
            if isinstance(box, list) and len(box) == 4 and all(map(_number, box)):
                x0, y0, x1, y1 = box
                box[:] = [min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)]


# scheme, the slashes WHATWG parsers accept after it, the authority, the rest
_URL = re.compile(r"^([hH][tT][tT][pP][sS]?:[/\\]*)([^/\\?#]+)(.*)$", re.S)


def _nowhere(url):
    """`url` with a host under `.invalid` (RFC 6761: never resolves) in place
    of its authority, the same length where the rest allows."""
    m = _URL.match(url)
    if not m:
        return url
    prefix, authority, rest = m.groups()
    suffix = ".invalid"
    filler = max(len(authority) - len(suffix), 1)
    labels = ["a" * min(60, filler - i) for i in range(0, filler, 61)]
    host = ".".join(labels) + suffix
    excess = len(prefix) + len(host) + len(rest) - len(url)
    if excess > 0 and len(rest) > excess:
        rest = rest[: len(rest) - excess]
    return prefix + host + rest


@schemathesis.hook
def before_call(context, case, kwargs):
    _order_boxes(case.body)
    # Jobs that end (a cancel) deliver their webhooks from `serve`: never to a
    # real host someone owns.
    if isinstance(case.body, dict) and isinstance(case.body.get("webhook_url"), str):
        case.body["webhook_url"] = _nowhere(case.body["webhook_url"])
    # A document's URL is fetched at the submit: never from a real host either.
    document = case.body.get("document") if isinstance(case.body, dict) else None
    if isinstance(document, dict) and isinstance(document.get("url"), str):
        document["url"] = _nowhere(document["url"])
    headers = case.headers or {}
    for name, key in list(headers.items()):
        if name.lower() != "idempotency-key" or not isinstance(key, str) or not _VALID_KEY.match(key):
            continue
        try:
            text = json.dumps(case.body, sort_keys=True, default=repr)
        except (TypeError, ValueError):
            text = repr(case.body)
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        headers[name] = key[: len(key) - 8] + digest if len(key) > 8 else key + "-" + digest


# --- refusals beyond the schema ----------------------------------------------

dropped = collections.Counter()


def _report():
    if dropped:
        total = sum(dropped.values())
        print(f"\nfuzz hooks: {total} answers to schema-valid requests were not failures "
              "(a 422 for a reason the schema cannot express, or invalid data that was valid):",
              file=sys.stderr)
        for reason, n in dropped.most_common():
            print(f"  {n:5d}  {reason}", file=sys.stderr)


atexit.register(_report)


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)


def _fields(body):
    fields = body.get("fields") if isinstance(body, dict) else None
    return [f for f in fields if isinstance(f, dict)] if isinstance(fields, list) else []


def _names_repeat(body):
    names = [f.get("name") for f in _fields(body)]
    return len(names) != len(set(map(repr, names)))


def _has_pattern(body):
    return any(isinstance(f.get("pattern"), str) for f in _fields(body))


def _bytes_past_chars(body, limit):
    return any(len(s) <= limit < len(s.encode("utf-8", "surrogatepass")) for s in _strings(body))


def _names_file(body, file_id):
    document = body.get("document") if isinstance(body, dict) else None
    return isinstance(document, dict) and document.get("object") == file_id


def _has_document_url(body):
    document = body.get("document") if isinstance(body, dict) else None
    return isinstance(document, dict) and isinstance(document.get("url"), str)


def _webhook_given(body):
    return isinstance(body, dict) and isinstance(body.get("webhook_url"), str)


# (reason, what the message says, what the request must show for it)
_BEYOND_THE_SCHEMA = (
    ("field names repeated",
     re.compile(r"^field name .* is empty or repeated$", re.S),
     lambda case, body, m: _names_repeat(body)),
    ("a pattern Rust's regex does not compile (or past its compiled size)",
     re.compile(r"^field .*: invalid pattern: ", re.S),
     lambda case, body, m: _has_pattern(body)),
    ("a webhook host that is, or resolves to, an address webhooks may not reach",
     re.compile(r"^webhook_url host .* is not a host the server may reach$", re.S),
     lambda case, body, m: _webhook_given(body)),
    ("a file id of no file the tenant uploaded",
     re.compile(r"^document\.object: no file ([0-9a-f]{64}) of this tenant"),
     lambda case, body, m: _names_file(body, m.group(1))),
    ("a document.url the SSRF guard refuses or that cannot be fetched",
     re.compile(r"^(document\.url host |fetching document\.url )"),
     lambda case, body, m: _has_document_url(body)),
    ("a string within maxLength characters but past its limit in bytes",
     re.compile(r" is larger than the limit of (\d+) bytes$"),
     lambda case, body, m: _bytes_past_chars(body, int(m.group(1)))),
)


_SIGNATURES = (
    (b"%PDF-", "application/pdf"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
)


def _sniff(data):
    """What the server takes `data` for (src/files/sniff.rs), or None."""
    for signature, kind in _SIGNATURES:
        if data.startswith(signature):
            return kind
    if any(b < 0x20 and b not in b"\t\n\x0c\r" or b == 0x7F for b in data):
        return None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return "text/plain"


def _file_refused_for_its_bytes(case, response):
    """The reason, when `response` is the upload's 415 for bytes that are
    not the kind the request declared, or of no kind the server takes: the
    schema says "bytes" and cannot say which; else None."""
    if case.operation.path != "/v1/files" or response.status_code != 415:
        return None
    try:
        message = json.loads(response.content)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None
    data = case.body.encode() if isinstance(case.body, str) else bytes(case.body or b"")
    found = _sniff(data)
    declared = (case.media_type or "").split(";")[0].strip().lower()
    if found is None and message.startswith("the file is not a PDF"):
        return "file bytes of a kind the server does not take"
    if found is not None and found != declared and message.endswith(f"the bytes are {found}"):
        return "file bytes of another kind than their Content-Type"
    return None


def _beyond_the_schema(failure, case, response):
    """The reason, when `failure` is a 422 (or an upload's 415) for a
    schema-valid request that the schema cannot express; else None."""
    if getattr(failure, "code", None) != "ST202":
        return None
    if response.status_code == 415:
        return _file_refused_for_its_bytes(case, response)
    if response.status_code != 422:
        return None
    try:
        message = json.loads(response.content)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None
    body = case.body if isinstance(case.body, (dict, list)) else None
    for reason, says, shows in _BEYOND_THE_SCHEMA:
        m = says.search(message)
        if m and shows(case, body, m):
            return reason
    return None


def _body_schema(case):
    """The JSON schema of the body `case` sent, with the document's
    components beside it for its references; None when it has none."""
    document = case.operation.schema.raw_schema
    try:
        operation = document["paths"][case.operation.path][case.method.lower()]
        schema = operation["requestBody"]["content"][case.media_type or "application/json"]["schema"]
    except (KeyError, TypeError, AttributeError):
        return None
    return {**schema, "components": document.get("components", {})}


def _accepted_but_valid(failure, case):
    """The reason, when `failure` is invalid data accepted whose body, as
    sent, the document accepts too; else None."""
    if getattr(failure, "code", None) != "ST201" or "in body" not in (getattr(failure, "message", "") or ""):
        return None
    if not isinstance(case.body, (dict, list)) or case.query or case.path_parameters:
        return None
    schema = _body_schema(case)
    if schema is None:
        return None
    validator = jsonschema_rs.validator_for(schema, validate_formats=True)
    if not validator.is_valid(case.body):
        return None
    return "generated as invalid, but the body sent is valid against the document"


@schemathesis.hook
def filter_failure(context, failure, case, response):
    reason = _beyond_the_schema(failure, case, response) or _accepted_but_valid(failure, case)
    if reason is None:
        return True
    dropped[reason] += 1
    return False
