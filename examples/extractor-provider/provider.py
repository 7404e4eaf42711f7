#!/usr/bin/env python3
"""A minimal docstream extraction provider, using only the standard library.

docstream's worker can hand a job to a team's own extraction service (a
"provider") instead of its built-in rule extractor. This file is a small,
working provider to copy and replace the extraction part of. It needs
Python 3.9 or later and nothing else.

The protocol, in brief (the full text is docs/extractor-protocol.openapi.yaml):

  docstream sends one POST per attempt of a job to the configured URL, with
  `Idempotency-Key: <job_id>:<attempt>`, a W3C `traceparent` header, and
  `Authorization: Bearer <token>` if a token is configured. The JSON body is

      {"job_id": "...", "attempt": 1,
       "document": {"text": "..."} or {"pages": [{"width", "height",
                    "words": [{"text", "bbox": [x0, y0, x1, y1]}]}]},
       "fields": [{"name", "type", "pattern"?, "anchor"?, "required"}],
       "metadata": ...}

  The provider answers one of:

      200 {"fields": {"<name>": {"value": "...", "raw": "...",
                                 "words": [first, last]} or null}}
      400 or 422 {"error": "..."}   permanent: the job fails at once
      429 or 503 with Retry-After   docstream waits and calls again with the
                                    same attempt and Idempotency-Key
      anything else, or a timeout   the attempt fails and the job is retried

  "words" are inclusive indices into the document's words: every page's
  words in order, or the text split on whitespace.

  Version 2 (DOCSTREAM_EXTRACTOR_PYTHON_PROTOCOL=2) adds files: a job on an
  uploaded PDF or image comes with "file" instead of "document",

      "file": {"url": "...", "content_type": "application/pdf", "size": 48213,
               "sha256": "...", "expires_at": "..."}

  GET the URL (no credentials; it works for this job until expires_at) and
  read the file. The answer may add the words read, with their boxes:

      200 {"fields": {...}, "pages": [{"width", "height",
                                        "words": [{"text", "bbox"}]}]}

  and "words" ranges then index those. docstream keeps them as the job's
  document, so it can draw each value's box. This provider reads a PDF's
  text layer with pypdf (pip install pypdf), if it is installed; it does no
  OCR, so it refuses images and PDFs without text (422).

Running it:

  python3 provider.py [--host 127.0.0.1] [--port 0] [--token TOKEN] [--path /extract]

It prints one line, `listening on http://HOST:PORT/PATH`, once it is bound.
Port 0 picks a free port.

Wiring it into docstream (worker environment):

  DOCSTREAM_EXTRACTORS=python
  DOCSTREAM_EXTRACTOR_PYTHON_URL=http://127.0.0.1:PORT/extract
  # optional:
  DOCSTREAM_EXTRACTOR_PYTHON_TOKEN=...          (then start this with --token)
  DOCSTREAM_EXTRACTOR_PYTHON_TIMEOUT_S=60
  DOCSTREAM_EXTRACTOR_PYTHON_MAX_CONCURRENCY=8
  DOCSTREAM_EXTRACTOR_PYTHON_REQUESTS_PER_SECOND=20

Then submit jobs with `"extractor": "python"` in the request body.

The extraction here is deliberately simple. For each field:
  - with an "anchor": find the anchor's words (case-insensitive, consecutive)
    and take the word after them;
  - else with a "pattern": search the words joined by single spaces; the value
    is group 1 if the pattern has a group, else the whole match;
  - otherwise, or when nothing matches: null.
For type "money" a leading currency sign ($, € or £) and thousands commas
are removed from the value; "raw" keeps the text as it appears. A required field
that is not found is still answered with null: docstream fails the job.
"""

import argparse
import bisect
import hmac
import io
import json
import re
import signal
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# Only a guard against a runaway body; raise it if your documents are larger.
MAX_BODY_BYTES = 64 * 1024 * 1024
CURRENCY_SIGNS = "$€£"


class BadRequest(Exception):
    """The request cannot be used; answered with 400 (permanent in docstream)."""


class Unreadable(Exception):
    """The file cannot be read here; answered with 422 (permanent in docstream)."""


# ---------------------------------------------------------------- extraction


def document_words(document):
    """The document's words, indexed the way docstream indexes them."""
    if not isinstance(document, dict):
        raise BadRequest("document must be an object")
    if isinstance(document.get("text"), str):
        return document["text"].split()
    pages = document.get("pages")
    if not isinstance(pages, list):
        raise BadRequest('document must have "text" or "pages"')
    words = []
    for page in pages:
        if not isinstance(page, dict) or not isinstance(page.get("words"), list):
            raise BadRequest("each page must be an object with words")
        for word in page["words"]:
            if not isinstance(word, dict) or not isinstance(word.get("text"), str):
                raise BadRequest("each word must be an object with a text")
            words.append(word["text"])
    return words


def find_by_anchor(words, anchor):
    """(first, last) of the word right after the anchor's words, or None."""
    wanted = anchor.lower().split()
    if not wanted:
        return None
    lowered = [w.lower() for w in words]
    n = len(wanted)
    for i in range(len(words) - n):
        if lowered[i:i + n] == wanted:
            return i + n, i + n
    return None


def find_by_pattern(words, pattern):
    """(first, last, matched text) of the pattern's value, or None.

    A warning for a real service: Python's `re` backtracks, so a submitter's
    pattern such as `(a+)+$` can take exponential time on a crafted document
    (docstream itself uses a linear-time engine). Run patterns with a time
    limit, or with a linear-time engine such as the `re2` bindings.
    """
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise BadRequest(f"invalid pattern {pattern!r}: {e}")
    joined = " ".join(words)
    match = regex.search(joined)
    if match is None:
        return None
    group = 1 if regex.groups else 0
    start, end = match.span(group)
    if start < 0:  # an optional group that took no part in the match
        return None
    # Trim spaces so the span starts and ends inside words.
    text = joined[start:end]
    start += len(text) - len(text.lstrip())
    end -= len(text) - len(text.rstrip())
    if start >= end:
        return None
    # Character offset of each word in `joined`, to map the span back to words.
    offsets, pos = [], 0
    for w in words:
        offsets.append(pos)
        pos += len(w) + 1
    first = bisect.bisect_right(offsets, start) - 1
    last = bisect.bisect_right(offsets, end - 1) - 1
    return first, last, joined[start:end]


def normalize(value, field_type):
    if field_type == "money":
        if value[:1] in CURRENCY_SIGNS:
            value = value[1:]
        value = value.replace(",", "")
    return value


# ---------------------------------------------------------------- files (v2)

# Only a guard against a runaway download; raise it for larger files.
MAX_FILE_BYTES = 64 * 1024 * 1024


def fetch(file):
    """The bytes at a call's file URL (version 2)."""
    if not isinstance(file, dict) or not isinstance(file.get("url"), str):
        raise BadRequest("file must be an object with a url")
    with urllib.request.urlopen(file["url"], timeout=60) as response:
        data = response.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise Unreadable(f"the file is larger than {MAX_FILE_BYTES} bytes")
    return data


def pdf_pages(data):
    """A PDF's text layer as docstream's pages of words, through pypdf: each
    text run's place from its text matrix, each word's width from the
    font's widths (or half the font size a character, where there are
    none), boxes from 0.8 of the font size above the baseline to 0.2 below,
    top-left origin."""
    try:
        import pypdf
    except ImportError:
        raise Unreadable("this provider reads PDFs with pypdf: pip install pypdf")
    reader = pypdf.PdfReader(io.BytesIO(data))
    pages = []
    for page in reader.pages:
        box = page.mediabox
        left, top = float(box.left), float(box.top)
        words = []

        def visit(text, cm, tm, font, size):
            if not text.strip():
                return
            widths = _widths(font)
            scale = size * (tm[0] or 1.0)
            x, y = tm[4] * cm[0] + cm[4], tm[5] * cm[3] + cm[5]
            for chunk in re.split(r"(\s+)", text):
                advance = sum(widths(c) for c in chunk) * scale
                if chunk.strip():
                    words.append({"text": chunk, "bbox": [
                        round(x - left, 2), round(top - (y + 0.8 * scale), 2),
                        round(x + advance - left, 2), round(top - (y - 0.2 * scale), 2)]})
                x += advance

        page.extract_text(visitor_text=visit)
        pages.append({"width": float(box.width), "height": float(box.height), "words": words})
    if not any(p["words"] for p in pages):
        raise Unreadable("the PDF has no text layer (a scan?): it needs OCR, which this provider does not do")
    return pages


def _widths(font):
    """A character's advance in ems under `font` (a PDF font dictionary)."""
    try:
        first = int(font["/FirstChar"])
        table = [float(w) / 1000 for w in font["/Widths"]]
    except (KeyError, TypeError, ValueError):
        # The standard 14 fonts carry no widths; Courier is 0.6 em throughout.
        base = str(font.get("/BaseFont", "")) if hasattr(font, "get") else ""
        em = 0.6 if "Courier" in base else 0.5
        return lambda c: em
    return lambda c: table[ord(c) - first] if 0 <= ord(c) - first < len(table) else 0.5


def read_file(file):
    """The document of a call's file, and its pages to answer with."""
    kind = file.get("content_type") if isinstance(file, dict) else None
    if kind == "text/plain":
        return {"text": fetch(file).decode("utf-8")}, None
    if kind != "application/pdf":
        raise Unreadable(f"{kind} has no text to read: it needs OCR, which this provider does not do")
    pages = pdf_pages(fetch(file))
    return {"pages": pages}, pages


def extract(document, fields):
    words = document_words(document)
    if not isinstance(fields, list):
        raise BadRequest("fields must be an array")
    result = {}
    for spec in fields:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise BadRequest("each field must be an object with a name")
        found = None
        if spec.get("anchor"):
            span = find_by_anchor(words, spec["anchor"])
            if span:
                found = span[0], span[1], " ".join(words[span[0]:span[1] + 1])
        elif spec.get("pattern"):
            found = find_by_pattern(words, spec["pattern"])
        if found is None:
            result[spec["name"]] = None
            continue
        first, last, raw = found
        result[spec["name"]] = {
            "value": normalize(raw, spec.get("type")),
            "raw": raw,
            "words": [first, last],
        }
    return result


# ---------------------------------------------------------------- HTTP


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps connections open for docstream's pooled client; every
    # answer therefore carries a Content-Length.
    protocol_version = "HTTP/1.1"
    server_version = "docstream-example-provider"

    job = "-"
    attempt = "-"

    def do_POST(self):
        if not self._on_path():
            return
        if self.server.token is not None:
            given = (self.headers.get("Authorization") or "").encode()
            # Constant time, so the answer's timing does not reveal the token.
            if not hmac.compare_digest(given, f"Bearer {self.server.token}".encode()):
                # The body is left unread, so this connection cannot be reused.
                return self._send_json(401, {"error": "missing or wrong bearer token"}, close=True)
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._send_json(411, {"error": "Content-Length required"}, close=True)
        if length < 0 or length > MAX_BODY_BYTES:
            return self._send_json(413, {"error": "body too large"}, close=True)
        body = self.rfile.read(length)
        try:
            try:
                request = json.loads(body)
            except ValueError as e:
                raise BadRequest(f"invalid JSON: {e}")
            if not isinstance(request, dict):
                raise BadRequest("body must be a JSON object")
            self.job = request.get("job_id", "-")
            self.attempt = request.get("attempt", "-")
            if "fields" not in request or ("document" not in request and "file" not in request):
                raise BadRequest("document (or, in version 2, file) and fields are required")
            pages = None
            if "document" in request:
                document = request["document"]
            else:
                document, pages = read_file(request["file"])
            fields = extract(document, request["fields"])
        except BadRequest as e:
            return self._send_json(400, {"error": str(e)})
        except Unreadable as e:
            return self._send_json(422, {"error": str(e)})
        except (OSError, ValueError) as e:
            # The file did not arrive (or not whole): another attempt may do better.
            return self._send_json(503, {"error": f"fetching the file failed: {e}"})
        answer = {"fields": fields}
        if pages is not None:
            answer["pages"] = pages
        self._send_json(200, answer)

    def _other_method(self):
        if self._on_path():
            self._send_json(405, {"error": "only POST"}, close=True, extra={"Allow": "POST"})

    do_GET = do_HEAD = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _other_method

    def _on_path(self):
        self.job = self.attempt = "-"  # one handler serves a whole keep-alive connection
        if urlsplit(self.path).path == self.server.path:
            return True
        self._send_json(404, {"error": "not found"}, close=True)
        return False

    def _send_json(self, status, obj, close=False, extra=None):
        data = json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_request(self, code="-", size="-"):
        # One short line per request, with what is needed to find the job.
        headers = getattr(self, "headers", None)
        key = headers.get("Idempotency-Key", "-") if headers else "-"
        sys.stderr.write(
            f"{self.command} {getattr(self, 'path', '-')} {code} job={self.job} "
            f"attempt={self.attempt} key={key}\n"
        )


def main():
    parser = argparse.ArgumentParser(description="Example docstream extraction provider")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--token", help="require Authorization: Bearer TOKEN")
    parser.add_argument("--path", default="/extract")
    args = parser.parse_args()
    if not args.path.startswith("/"):
        parser.error("--path must start with /")

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    # In-flight requests must not keep the process alive after shutdown.
    server.daemon_threads = True
    server.token = args.token
    server.path = args.path

    # shutdown() waits for serve_forever() to return, and serve_forever() runs
    # on this (the signal handler's) thread, so it has to be called elsewhere.
    def stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}{args.path}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
