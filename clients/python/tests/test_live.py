"""The client against a live ``docstream all`` (see conftest.py): no mocks."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import socket
import struct
import subprocess
import threading
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import docstream
from conftest import REPO, SAMPLES, Server, sample

FAILING_FIELDS = [{"name": "po", "anchor": "Purchase order", "required": True}]
TEXT_FIELDS = [{"name": "total", "type": "money", "anchor": "Total"}]
INVOICE_FIELDS: list[dict[str, Any]] = [{"name": "invoice_number", "anchor": "Invoice No."},
                  {"name": "total", "type": "money", "anchor": "Total", "required": True}]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SIGNATURE = b"\xff\xd8\xff"


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 0.01 for x, y in zip(a, b))


def _invoice(confidence: float) -> dict[str, Any]:
    """A page of words as OCR would give them, each read with ``confidence``:
    ``Invoice No. INV-0042`` and ``Total 12.50``."""
    placed = [("Invoice", 10, 10), ("No.", 70, 10), ("INV-0042", 100, 10), ("Total", 10, 40), ("12.50", 70, 40)]
    words = [{"text": t, "bbox": [x, y, x + 8 * len(t), y + 10], "confidence": confidence} for t, x, y in placed]
    return {"pages": [{"width": 200, "height": 100, "words": words}]}


def _png(width: int, height: int) -> bytes:
    """A grey-scale PNG made here (zlib and struct): white, with a black bar across its middle."""
    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    rows = b"".join(b"\x00" + bytes([0 if height // 3 <= y < 2 * height // 3 else 255]) * width
                    for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return PNG_SIGNATURE + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


# ---------------------------------------------------------------- the manual's example


def test_the_manuals_example_runs(running: Server, api_key: str, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The first ```python block of docs/src/python.md, executed as it is."""
    page = (REPO / "docs" / "src" / "python.md").read_text()
    match = re.search(r"```python\n(.*?)```", page, re.S)
    assert match, "docs/src/python.md has no ```python block"
    code = match.group(1)
    assert len(code.strip().splitlines()) <= 10, "the example is meant to be 10 lines"
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("DOCSTREAM_BASE_URL", running.base_url)
    monkeypatch.setenv("DOCSTREAM_API_KEY", api_key)
    exec(compile(code, "docs/src/python.md", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert "succeeded" in out and "6661.68" in out, out


# ---------------------------------------------------------------- submit, wait, fields, boxes


@pytest.mark.parametrize("name", ["invoice-contoso", "invoice-northwind", "receipt-bakery"])
def test_a_sample_pdf_is_read_and_boxed_as_its_drawn_words_are(client: docstream.Client, run_id: str,
                                                               name: str) -> None:
    """A PDF sent as multipart gives the values and boxes the same request gives on the words the sample drew."""
    s = sample(name)
    request = dict(s["request"])
    request["metadata"] = {"run": run_id}
    pdf = client.submit(request, file=SAMPLES / s["file"], content_type="application/pdf")
    drawn = client.submit(request, document={"pages": s["pages"]})
    assert pdf.status == "queued" and pdf.id != drawn.id
    got = client.wait(pdf.id, timeout=90, boxes=True)
    want = client.wait(drawn.id, timeout=90, boxes=True)
    assert got.status == "succeeded", got.error
    assert got.post_processing.bbox_refinement is not None
    assert got.post_processing.bbox_refinement.status == "succeeded"
    assert got.fields == want.fields
    found = {k: v for k, v in got.fields.items() if v is not None}
    assert len(found) >= 4, got.fields
    assert set(got.boxes) == set(want.boxes)
    for field, box in got.boxes.items():
        other = want.boxes[field]
        if box is None or other is None:
            assert box is other, field
            continue
        assert box.page == other.page and _close(box.bbox, other.bbox), (field, box, other)
    # The file is stored and the job names it.
    with_request = client.get(pdf.id, include_request=True)
    assert with_request.request is not None
    file_id = with_request.request["document"]["object"]
    assert client.get_file(file_id).content_type == "application/pdf"


def test_every_way_to_give_a_document(client: docstream.Client, run_id: str) -> None:
    """A dict, a path, bytes, a file object, an uploaded file's id, and a URL (refused: it is loopback)."""
    s = sample("receipt-bakery")
    path = SAMPLES / s["file"]
    fields = s["request"]["fields"]
    meta = {"run": run_id}
    uploaded = client.upload_file(path)
    assert uploaded.id == uploaded.sha256 and uploaded.content_type == "application/pdf"
    assert client.upload_file(path.read_bytes()).id == uploaded.id  # same bytes, same file
    jobs = [
        client.submit({"document": {"text": "Receipt Total 12.50"}, "fields": TEXT_FIELDS, "metadata": meta}),
        client.submit(file=path, fields=fields, metadata=meta),
        client.submit(file=path.read_bytes(), fields=fields, metadata=meta),
        client.submit(file_id=uploaded.id, fields=fields, metadata=meta),
    ]
    with path.open("rb") as handle:
        jobs.append(client.submit(file=handle, fields=fields, metadata=meta))
    done = [client.wait(j.id, timeout=90) for j in jobs]
    assert [j.status for j in done] == ["succeeded"] * 5, [j.error for j in done]
    assert done[0].fields == {"total": "12.50"}
    assert done[1].fields == done[2].fields == done[3].fields == done[4].fields
    with pytest.raises(docstream.UnprocessableEntityError) as refused:
        client.submit(url="http://127.0.0.1:9/invoice.pdf", fields=fields, metadata=meta)
    assert refused.value.status_code == 422 and refused.value.code and refused.value.message
    with pytest.raises(ValueError):
        client.submit(fields=fields)  # no document


def test_the_same_idempotency_key_is_the_same_job(client: docstream.Client, run_id: str) -> None:
    key = f"order-{run_id}"
    body = {"document": {"text": "Total 9.99"}, "fields": TEXT_FIELDS, "metadata": {"run": run_id}}
    first = client.submit(body, idempotency_key=key)
    assert client.submit(body, idempotency_key=key).id == first.id
    with pytest.raises(docstream.UnprocessableEntityError) as reused:
        client.submit({**body, "document": {"text": "Total 1.00"}}, idempotency_key=key)
    assert reused.value.code
    assert [j.id for j in client.list(idempotency_key=key)] == [first.id]
    # Without a key of the caller's, each call has its own.
    a = client.submit(body)
    b = client.submit(body)
    assert a.id != b.id
    keys = {client.get(x.id).idempotency_key for x in (a, b)}
    assert len(keys) == 2 and None not in keys


def test_errors_carry_the_servers_code_and_message(running: Server, client: docstream.Client) -> None:
    with pytest.raises(docstream.NotFoundError) as missing:
        client.get(str(uuid.uuid4()))
    assert (missing.value.status_code, missing.value.code) == (404, "not_found")
    assert missing.value.message
    with pytest.raises(docstream.UnprocessableEntityError) as invalid:
        client.submit(document={"text": "x"}, fields=[{"name": "total"}])  # neither anchor nor pattern
    assert invalid.value.status_code == 422 and invalid.value.message
    with docstream.Client(running.base_url, api_key="dsk_" + "0" * 43) as stranger:
        with pytest.raises(docstream.AuthenticationError) as unknown:
            stranger.me()
    assert unknown.value.code == "unauthorized"


# ---------------------------------------------------------------- listing


def test_list_walks_every_page_by_metadata(client: docstream.Client, run_id: str) -> None:
    mine = {
        client.submit(document={"text": f"Total {i}.00"}, fields=TEXT_FIELDS,
                      metadata={"run": run_id, "customer": "acme" if i % 2 else "globex"}).id
        for i in range(7)
    }
    other = client.submit(document={"text": "Total 1.00"}, fields=TEXT_FIELDS, metadata={"run": "someone-else"})
    listed = [j.id for j in client.list(metadata={"run": run_id}, page_size=2)]
    assert len(listed) == len(set(listed)) == 7, "no job twice"
    assert set(listed) == mine and other.id not in listed
    acme = [j for j in client.list(metadata={"run": run_id, "customer": "acme"}, page_size=2, order="asc")]
    assert len(acme) == 3 and all(j.metadata["customer"] == "acme" for j in acme)
    assert [j.id for j in acme] == sorted(j.id for j in acme), "oldest first (ids are UUIDv7)"


# ---------------------------------------------------------------- retry, cancel, delete, bulk


def test_bulk_retry_of_failed_jobs(client: docstream.Client, run_id: str) -> None:
    meta = {"run": run_id}
    failing = [client.submit(text=f"Invoice {i}", fields=FAILING_FIELDS, metadata=meta).id for i in range(3)]
    fine = client.submit(text="Total 5.00", fields=TEXT_FIELDS, metadata=meta).id
    for job_id in failing:
        job = client.wait(job_id, timeout=60)
        assert job.status == "failed" and job.error and "po" in job.error
    assert client.wait(fine, timeout=60).status == "succeeded"
    before = {j: client.get(j).attempts for j in failing}

    # By filter: exactly the failed jobs of the run.
    op = client.bulk_retry(filter={"status": "failed", "metadata": meta})
    assert op.state == "finished" and (op.done, op.refused, op.not_found) == (3, 0, 0)
    assert {o.id for o in client.bulk_outcomes(op.id)} == set(failing)
    for job_id in failing:
        job = client.wait(job_id, timeout=60)
        assert job.status == "failed" and job.attempts > before[job_id]
        assert "retry_failed" in [t.transition for t in client.transitions(job_id)]

    # By ids: the succeeded one is refused, an unknown id not found.
    unknown = str(uuid.uuid4())
    op = client.bulk("retry", ids=[*failing, fine, unknown])
    assert (op.done, op.refused, op.not_found) == (3, 1, 1)
    refused = list(client.bulk_outcomes(op.id, outcome="refused"))
    assert [o.id for o in refused] == [fine] and refused[0].reason
    # The same key again is the same operation.
    key = f"bulk-{run_id}"
    first = client.bulk_cancel(ids=[fine], idempotency_key=key)
    assert client.bulk_cancel(ids=[fine], idempotency_key=key).id == first.id


def test_retry_cancel_and_delete_one_job(client: docstream.Client, run_id: str) -> None:
    failed = client.submit(text="Invoice", fields=FAILING_FIELDS, metadata={"run": run_id})
    assert client.wait(failed.id, timeout=60).status == "failed"
    again = client.retry(failed.id)
    assert again.status in ("queued", "running", "failed")
    assert client.wait(failed.id, timeout=60).status == "failed"
    with pytest.raises(docstream.ConflictError) as finished:
        client.cancel(failed.id)
    assert finished.value.code == "conflict"
    client.delete(failed.id)
    with pytest.raises(docstream.GoneError):
        client.get(failed.id)
    erased = next(client.list(metadata={"run": run_id}), None)
    assert erased is None or erased.erased_at is not None


def test_dead_letters(client: docstream.Client) -> None:
    letters = list(client.dead_letters(page_size=10))
    assert all(isinstance(x, docstream.DeadLetter) for x in letters)
    with pytest.raises(docstream.NotFoundError):
        client.replay_dead_letter(2**40)


# ---------------------------------------------------------------- review: corrections, the queue, pages


def test_correct_fields_and_read_the_corrections(running: Server, client: docstream.Client, tenant: str,
                                                 run_id: str) -> None:
    job = client.submit(document=_invoice(0.95), fields=INVOICE_FIELDS, metadata={"run": run_id})
    done = client.wait(job.id, timeout=60)
    assert done.status == "succeeded", done.error
    assert done.fields == {"invoice_number": "INV-0042", "total": "12.50"}

    first = client.correct(job.id, "total", "12.80", reviewer="Ada")
    assert isinstance(first, docstream.Correction)
    assert (first.extraction_id, first.field, first.value, first.reviewer) == (job.id, "total", "12.80", "Ada")
    assert first.key_id and first.corrected_at.tzinfo is not None
    absent = client.correct(job.id, "invoice_number", None)  # the document does not hold it
    assert (absent.field, absent.value, absent.reviewer) == ("invoice_number", None, None)
    last = client.correct(job.id, "total", "12.50", reviewer="Grace")
    assert first.id < absent.id < last.id

    def seen(corrections: list[docstream.Correction]) -> list[tuple[int, str, str | None, str | None]]:
        return [(c.id, c.field, c.value, c.reviewer) for c in corrections]

    made = [first, absent, last]
    assert seen(client.corrections(job.id)) == seen(made)
    assert seen(client.corrections(job.id, page_size=1)) == seen(made), "every page, in order"
    assert seen(client.corrections(job.id, after=first.id)) == seen(made[1:])
    assert {c.field: c.value for c in client.corrections(job.id)} == {"total": "12.50", "invoice_number": None}
    # The extracted values stay as the extractor gave them; the log has the corrections.
    assert client.get(job.id).fields == done.fields
    assert [t.transition for t in client.transitions(job.id)].count("correct_field") == 3

    # Refusals.
    with pytest.raises(docstream.UnprocessableEntityError):
        client.correct(job.id, "iban", "DE00")  # a field the request did not name
    with pytest.raises(docstream.NotFoundError):
        client.correct(str(uuid.uuid4()), "total", "1.00")
    with pytest.raises(TypeError):
        client.correct(job.id, "total", 12.5)  # type: ignore[arg-type]
    failed = client.submit(text="Invoice", fields=FAILING_FIELDS, metadata={"run": run_id})
    assert client.wait(failed.id, timeout=60).status == "failed"
    with pytest.raises(docstream.ConflictError) as not_succeeded:
        client.correct(failed.id, "po", "PO-1")
    assert not_succeeded.value.code == "conflict"
    assert client.corrections(failed.id) == []
    # A key without the `review` scope reads the corrections, and makes none.
    reader: str = json.loads(running.cli("keys", "create", tenant, "--scopes", "read"))["api_key"]
    with docstream.Client(running.base_url, api_key=reader) as read_only:
        assert seen(read_only.corrections(job.id)) == seen(made)
        with pytest.raises(docstream.PermissionDeniedError):
            read_only.correct(job.id, "total", "0.00")
    # Once erased, the job has no value to correct, nor corrections to read.
    client.delete(job.id)
    with pytest.raises(docstream.GoneError):
        client.correct(job.id, "total", "12.50")
    with pytest.raises(docstream.GoneError):
        client.corrections(job.id)


def test_the_review_queue_holds_the_unsure_jobs_until_corrected(client: docstream.Client, run_id: str) -> None:
    meta = {"run": run_id}
    unsure = client.submit(document=_invoice(0.3), fields=INVOICE_FIELDS, metadata=meta)
    sure = client.submit(document=_invoice(0.99), fields=INVOICE_FIELDS, metadata=meta)
    # Sure words, but a request that asks for more than the extractor's certainty.
    exacting = client.submit(document=_invoice(0.99), fields=INVOICE_FIELDS, metadata=meta, min_confidence=1.0)
    jobs = {j.id: client.wait(j.id, timeout=60, boxes=True) for j in (unsure, sure, exacting)}
    assert all(j.status == "succeeded" for j in jobs.values()), [j.error for j in jobs.values()]
    assert "total" in jobs[unsure.id].fields_to_review, jobs[unsure.id].boxes
    assert jobs[sure.id].fields_to_review == [], jobs[sure.id].boxes
    assert "total" in jobs[exacting.id].fields_to_review, jobs[exacting.id].boxes

    queue = list(client.review_queue(metadata=meta, page_size=1))
    assert sorted(j.id for j in queue) == sorted([unsure.id, exacting.id])
    assert [j.id for j in queue] == sorted((j.id for j in queue), reverse=True), "newest first"
    listed = {j.id: j for j in queue}
    assert listed[unsure.id].fields == jobs[unsure.id].fields, "each with its result"
    assert listed[unsure.id].fields_to_review == jobs[unsure.id].fields_to_review
    bare = list(client.review_queue(metadata=meta, include_result=False, order="asc"))
    assert [j.id for j in bare] == sorted(listed) and all(j.result is None for j in bare)
    assert sure.id in {j.id for j in client.list(metadata=meta, needs_review=False)}

    # Correcting a part of the flagged values keeps the job in the queue; all of them, out.
    flagged = jobs[unsure.id].fields_to_review
    for field in flagged[:-1]:
        client.correct(unsure.id, field, jobs[unsure.id].fields[field], reviewer="Ada")
        assert unsure.id in {j.id for j in client.review_queue(metadata=meta)}
    client.correct(unsure.id, flagged[-1], "12.50", reviewer="Ada")
    assert [j.id for j in client.review_queue(metadata=meta)] == [exacting.id]


def test_a_page_of_a_jobs_file_as_an_image(client: docstream.Client, run_id: str, tmp_path: Path) -> None:
    meta = {"run": run_id}
    png = _png(120, 60)
    from_png = client.submit(file=png, fields=TEXT_FIELDS, metadata=meta)
    image = client.page_image(from_png.id)
    assert isinstance(image, docstream.PageImage)
    assert (image.content_type, image.extension) == ("image/png", "png")
    assert image.content == png, "a PNG's own bytes"

    # A scan of the sample receipt, drawn here by poppler (the suite's
    # scripts install it for OCR; samples/scans is not in a fresh clone).
    s = sample("receipt-bakery")
    # Into a folder of its own: pdftoppm names what it writes after a root.
    root = tmp_path / "drawn"
    subprocess.run(["pdftoppm", "-jpeg", "-r", "100", "-singlefile", str(SAMPLES / s["file"]), str(root)],
                   capture_output=True, check=True)
    jpeg = root.with_suffix(".jpg").read_bytes()
    assert jpeg.startswith(JPEG_SIGNATURE)
    from_jpeg = client.submit(file=jpeg, fields=TEXT_FIELDS, metadata=meta)
    image = client.page_image(from_jpeg.id, 0)
    assert (image.content_type, image.extension) == ("image/jpeg", "jpg")
    assert image.content.startswith(JPEG_SIGNATURE) and len(image.content) > 1000

    s = sample("receipt-bakery")
    from_pdf = client.submit(s["request"], file=SAMPLES / s["file"], metadata=meta)
    image = client.page_image(from_pdf.id, 0)
    assert image.content_type == "image/png" and image.content.startswith(PNG_SIGNATURE)
    width, height = struct.unpack(">II", image.content[16:24])
    assert 0 < width < height, "a receipt, drawn upright"

    with pytest.raises(docstream.NotFoundError):
        client.page_image(from_png.id, 1)  # an image has one page
    with pytest.raises(docstream.NotFoundError):
        client.page_image(from_pdf.id, 5)
    as_json = client.submit(document=_invoice(0.9), fields=TEXT_FIELDS, metadata=meta)
    with pytest.raises(docstream.NotFoundError):
        client.page_image(as_json.id)  # no file to draw
    for job in (from_png, from_jpeg, from_pdf):
        assert client.wait(job.id, timeout=120).finished


def test_pages_drawn_past_the_render_slots_are_repeated_after_retry_after(client: docstream.Client,
                                                                          run_id: str) -> None:
    """Twelve requests at once for three pages not drawn yet, on a server that
    draws two at a time (DOCSTREAM_RENDER_SLOTS): those past the slots meet
    503 with Retry-After, wait for it, and get their page on a later try."""
    meta = {"run": run_id}
    contoso, northwind = sample("invoice-contoso"), sample("invoice-northwind")
    two_pages = client.submit(contoso["request"], file=SAMPLES / contoso["file"], metadata=meta)
    one_page = client.submit(northwind["request"], file=SAMPLES / northwind["file"], metadata=meta)
    pages = [(two_pages.id, 0), (two_pages.id, 1), (one_page.id, 0)] * 4
    retries = _Retries()
    logger = logging.getLogger("docstream")
    logger.addHandler(retries)
    logger.setLevel(logging.INFO)
    together = threading.Barrier(len(pages))

    def draw(job_page: tuple[str, int]) -> docstream.PageImage:
        together.wait()
        return client.page_image(*job_page)

    try:
        with ThreadPoolExecutor(max_workers=len(pages)) as pool:
            images = list(pool.map(draw, pages))
    finally:
        logger.removeHandler(retries)
    for job_page, image in zip(pages, images):
        assert image.content_type == "image/png" and image.content.startswith(PNG_SIGNATURE), job_page
        assert image.content == images[pages.index(job_page)].content, "the same page, the same image"
    assert len({images[i].content for i in range(3)}) == 3
    busy = [r for r in retries.records if isinstance(getattr(r, "docstream_error"), docstream.ServiceUnavailableError)]
    assert busy, "no page was refused: the requests did not meet at the render slots"
    for record in busy:
        retry_after = getattr(record, "docstream_retry_after")
        assert retry_after is not None and getattr(record, "docstream_delay") >= retry_after


@pytest.mark.asyncio
async def test_the_async_client_reviews_and_draws_pages(running: Server, api_key: str, run_id: str) -> None:
    meta = {"run": run_id}
    async with docstream.AsyncClient(running.base_url, api_key=api_key) as client:
        unsure = await client.submit(document=_invoice(0.3), fields=INVOICE_FIELDS, metadata=meta)
        sure = await client.submit(document=_invoice(0.99), fields=INVOICE_FIELDS, metadata=meta)
        done = await client.wait(unsure.id, timeout=60, boxes=True)
        assert (await client.wait(sure.id, timeout=60, boxes=True)).fields_to_review == []
        assert "total" in done.fields_to_review
        assert [j.id async for j in client.review_queue(metadata=meta)] == [unsure.id]

        made = [await client.correct(unsure.id, field, "12.50" if field == "total" else None, reviewer="Ada")
                for field in done.fields_to_review]
        assert all(isinstance(c, docstream.Correction) and c.extraction_id == unsure.id for c in made)
        assert [c.id for c in await client.corrections(unsure.id, page_size=1)] == [c.id for c in made]
        assert [j.id async for j in client.review_queue(metadata=meta)] == []
        with pytest.raises(docstream.UnprocessableEntityError):
            await client.correct(unsure.id, "iban", "DE00")

        png = _png(64, 48)
        from_png = await client.submit(file=png, fields=TEXT_FIELDS, metadata=meta)
        image = await client.page_image(from_png.id)
        assert (image.content, image.content_type) == (png, "image/png")
        with pytest.raises(docstream.NotFoundError):
            await client.page_image(unsure.id)
        assert (await client.wait(from_png.id, timeout=60)).finished


# ---------------------------------------------------------------- the export stream


def test_export_loses_nothing_across_a_failed_handler_and_a_server_restart(
    running: Server, client: docstream.Client, run_id: str
) -> None:
    group = f"py-{run_id}"
    submitted: set[str] = set()

    def submit(n: int) -> None:
        for i in range(n):
            submitted.add(client.submit(text=f"Total {i}.50", fields=TEXT_FIELDS, metadata={"run": run_id}).id)

    # Phase 1: a handler that fails on its third event of ours: nothing is acknowledged past it.
    submit(4)
    seen: dict[str, set[str]] = {}
    failed_on: tuple[int, int] | None = None
    count = 0
    with pytest.raises(RuntimeError, match="handler failed"):
        with client.export(group, from_="earliest", idle_timeout=60) as events:
            for frame in events:
                if frame.event.extraction_id not in submitted:
                    continue
                count += 1
                if count == 3:
                    failed_on = (frame.partition, frame.offset)
                    raise RuntimeError("handler failed")
                seen.setdefault(frame.event.extraction_id, set()).add(frame.event.status)
    assert failed_on is not None

    # Phase 2: the same group again gets that event first among ours (in its partition),
    # and goes on across a restart of the server, reconnecting by itself.
    redelivered = threading.Event()
    restarted = threading.Event()

    def restart_then_submit() -> None:
        running.restart(signal.SIGTERM)
        restarted.set()
        submit(3)

    restarter: threading.Thread | None = None
    with client.export(group, from_="earliest", idle_timeout=90) as events:
        for frame in events:
            if (frame.partition, frame.offset) == failed_on:
                redelivered.set()
            if frame.event.extraction_id not in submitted:
                continue
            seen.setdefault(frame.event.extraction_id, set()).add(frame.event.status)
            if restarter is None and redelivered.is_set():
                restarter = threading.Thread(target=restart_then_submit)
                restarter.start()
            finished = {j for j, statuses in seen.items() if "succeeded" in statuses}
            if restarted.is_set() and len(submitted) == 7 and finished >= submitted:
                break
        connections = events.connections
    assert restarter is not None
    restarter.join()
    assert redelivered.is_set(), "the event whose handler failed came again"
    assert connections >= 2, "the stream reconnected after the restart"
    assert {j for j, statuses in seen.items() if "succeeded" in statuses} == submitted


@pytest.mark.asyncio
async def test_the_async_client(running: Server, api_key: str, run_id: str) -> None:
    async with docstream.AsyncClient(running.base_url, api_key=api_key) as client:
        group = f"py-async-{run_id}"
        ids = {
            (await client.submit(text=f"Total {i}.25", fields=TEXT_FIELDS, metadata={"run": run_id})).id
            for i in range(3)
        }
        jobs = [await client.wait(i, timeout=60) for i in ids]
        assert {j.fields["total"] for j in jobs} == {"0.25", "1.25", "2.25"}
        assert {j.id async for j in client.list(metadata={"run": run_id}, page_size=1)} == ids
        finished: set[str] = set()
        async with client.export(group, from_="earliest", status="succeeded", idle_timeout=60) as events:
            async for frame in events:
                if frame.event.extraction_id in ids:
                    finished.add(frame.event.extraction_id)
                if finished == ids:
                    break
        assert finished == ids


@pytest.mark.asyncio
async def test_the_async_export_stream_gets_a_failed_event_again_and_reconnects_across_a_restart(
    running: Server, api_key: str, run_id: str
) -> None:
    async with docstream.AsyncClient(running.base_url, api_key=api_key) as client:
        group = f"py-async-export-{run_id}"

        async def submit(n: int) -> set[str]:
            return {
                (await client.submit(text=f"Total {i}.75", fields=TEXT_FIELDS, metadata={"run": run_id})).id
                for i in range(n)
            }

        ids = await submit(2)
        # A handler that fails on the first event of ours: it is not acknowledged.
        failed_on: tuple[int, int] | None = None
        with pytest.raises(RuntimeError, match="handler failed"):
            async with client.export(group, from_="earliest", idle_timeout=60) as events:
                async for frame in events:
                    if frame.event.extraction_id in ids:
                        failed_on = (frame.partition, frame.offset)
                        raise RuntimeError("handler failed")
        assert failed_on is not None

        # The group again: that event first, then across a restart of the
        # server, the stream reconnecting by itself, every job of ours.
        redelivered = restarted = False
        succeeded: set[str] = set()
        async with client.export(group, from_="earliest", idle_timeout=90) as events:
            async for frame in events:
                redelivered = redelivered or (frame.partition, frame.offset) == failed_on
                if frame.event.extraction_id not in ids:
                    continue
                if frame.event.status == "succeeded":
                    succeeded.add(frame.event.extraction_id)
                if redelivered and not restarted:
                    await asyncio.to_thread(running.restart, signal.SIGTERM)
                    restarted = True
                    ids |= await submit(2)
                if restarted and len(ids) == 4 and succeeded >= ids:
                    break
            connections = events.connections
    assert redelivered, "the event whose handler failed came again"
    assert connections >= 2, "the stream reconnected after the restart"
    assert succeeded == ids


# ---------------------------------------------------------------- retries through a restart


class _Retries(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if hasattr(record, "docstream_delay"):
            self.records.append(record)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_submits_ride_through_a_restart_and_none_is_made_twice(
    running: Server, api_key: str, run_id: str, sig: int
) -> None:
    """Submits keep going while `all` stops and starts again: each call makes exactly one job."""
    retries = _Retries()
    logger = logging.getLogger("docstream")
    logger.addHandler(retries)
    logger.setLevel(logging.INFO)
    total, stop_after = 60, 12
    returned: list[str] = []
    lock = threading.Lock()
    policy = docstream.RetryPolicy(deadline=120, max_backoff=1.0)

    try:
        with docstream.Client(running.base_url, api_key=api_key, retry_policy=policy) as client:

            def one(i: int) -> str:
                job = client.submit(text=f"Total {i}.00", fields=TEXT_FIELDS, metadata={"run": run_id, "i": i})
                with lock:
                    returned.append(job.id)
                return job.id

            with ThreadPoolExecutor(max_workers=6) as pool:
                futures = [pool.submit(one, i) for i in range(total)]
                deadline = time.monotonic() + 60
                while len(returned) < stop_after:
                    failed = [f.exception() for f in futures if f.done() and f.exception()]
                    assert not failed and time.monotonic() < deadline, f"submits before the restart: {failed}"
                    time.sleep(0.01)
                running.stop(sig)  # submits in flight meet 503s, reset connections, refusals
                running.start()
                ids = [f.result() for f in futures]

            jobs = list(client.list(metadata={"run": run_id}, page_size=200))
    finally:
        logger.removeHandler(retries)

    assert len(ids) == total
    assert len(set(ids)) == total, "two calls answered with the same job"
    assert len(jobs) == total, f"{len(jobs)} jobs for {total} submits: something was submitted twice"
    assert {j.id for j in jobs} == set(ids)
    assert len({j.idempotency_key for j in jobs}) == total
    assert sorted(j.metadata["i"] for j in jobs) == list(range(total))
    assert retries.records, "no submit was retried: the restart came too late to test anything"
    for record in retries.records:
        retry_after = getattr(record, "docstream_retry_after")
        assert retry_after is None or getattr(record, "docstream_delay") >= retry_after, "Retry-After honoured"


def test_a_429_is_repeated_after_its_retry_after(running: Server) -> None:
    """A tenant allowed one submit every 2 s: its second submit at once meets 429
    with Retry-After, waits at least that long, and then makes its job."""
    tenant = f"py{uuid.uuid4().hex[:8]}"
    running.cli("tenants", "create", tenant)
    # Quota before the key's first use: the server caches what a key resolves to.
    running.cli("tenants", "set-quota", tenant, "--submit-rate-per-s", "0.5", "--submit-burst", "1")
    key: str = json.loads(running.cli("keys", "create", tenant, "--scopes", "submit,read"))["api_key"]
    retries = _Retries()
    logger = logging.getLogger("docstream")
    logger.addHandler(retries)
    logger.setLevel(logging.INFO)
    try:
        with docstream.Client(running.base_url, api_key=key) as client:
            first = client.submit(text="Total 1.00", fields=TEXT_FIELDS)
            started = time.monotonic()
            second = client.submit(text="Total 2.00", fields=TEXT_FIELDS)
            waited = time.monotonic() - started
            assert client.get(second.id).id == second.id
    finally:
        logger.removeHandler(retries)
    assert first.id != second.id
    assert retries.records, "the second submit was not refused: the quota did not apply"
    first_refusal = retries.records[0]
    assert isinstance(getattr(first_refusal, "docstream_error"), docstream.RateLimitError)
    retry_after = getattr(first_refusal, "docstream_retry_after")
    assert retry_after is not None and retry_after >= 1
    assert waited >= retry_after, f"repeated after {waited:.2f} s, before Retry-After ({retry_after} s)"


def test_a_server_that_never_answers_is_given_up_on_at_the_deadline() -> None:
    """Nothing listens on the port: every try is refused, and the client stops
    trying at its deadline, raising the last error with how many tries it made."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    policy = docstream.RetryPolicy(deadline=1.5, initial_backoff=0.1, max_backoff=0.3)
    with docstream.Client(f"http://127.0.0.1:{port}", api_key="dsk_unused", retry_policy=policy) as client:
        started = time.monotonic()
        with pytest.raises(docstream.APIConnectionError) as caught:
            client.get(str(uuid.uuid4()))
        elapsed = time.monotonic() - started
    notes = " ".join(getattr(caught.value, "__notes__", []))
    tries = int(re.search(r"gave up after (\d+) tries", notes).group(1))  # type: ignore[union-attr]
    assert tries > 1, notes
    assert elapsed <= policy.deadline + 0.5, f"gave up after {elapsed:.2f} s, past the {policy.deadline} s deadline"
