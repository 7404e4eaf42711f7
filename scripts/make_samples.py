#!/usr/bin/env python3
"""Regenerates samples/*.json: invoices and receipts laid out as OCR
would return them (pages of words with boxes in points, top-left origin), each
with the field specs the demo submits with it; and samples/files/: three of
them as real PDFs with a text layer (Courier 10 pt, so every character is
6 pt wide and each word's place is known), each beside a JSON file with the
request to submit with it and the words its text layer holds.
Deterministic; run from the repo root."""
import json
import pathlib
import zlib

CHAR_W, LINE_H, FONT_H = 6.0, 16.0, 11.0
# In the PDFs: Courier at 10 pt is 6 pt a character. A word's box is its em
# box: from 8 pt above the baseline to 2 pt below it.
PDF_SIZE, PDF_ASCENT = 10.0, 8.0

def page(lines, width=612.0, height=792.0, left=48.0, top=56.0):
    words = []
    for row, line in enumerate(lines):
        if isinstance(line, tuple):  # (indent in characters, text)
            indent, line = line
        else:
            indent = 0
        y0 = top + row * LINE_H
        col = indent
        for token in line.split(" "):
            if token:
                x0 = left + col * CHAR_W
                words.append({"text": token, "bbox": [round(x0, 1), round(y0, 1),
                              round(x0 + len(token) * CHAR_W, 1), round(y0 + FONT_H, 1)]})
            col += len(token) + 1
    return {"width": width, "height": height, "words": words}

INVOICE_FIELDS = [
    {"name": "invoice_number", "anchor": "Invoice No.", "required": True},
    {"name": "invoice_date", "type": "date", "anchor": "Invoice Date"},
    {"name": "due_date", "type": "date", "anchor": "Due Date"},
    {"name": "subtotal", "type": "money", "anchor": "Subtotal"},
    {"name": "tax", "type": "money", "anchor": "VAT"},
    {"name": "total", "type": "money", "anchor": "Total Due", "required": True},
    {"name": "iban", "pattern": r"\b([A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){3,7})\b"},
]
RECEIPT_FIELDS = [
    {"name": "store", "pattern": r"^(\S+(?: \S+)?)"},
    {"name": "date", "type": "date", "anchor": "Date:"},
    {"name": "total", "type": "money", "anchor": "TOTAL", "required": True},
    {"name": "card_last4", "pattern": r"\*{4}(\d{4})"},
]

# Each page: its lines (a line is its text, or (indent in characters, text)),
# then page()'s layout arguments.
LAYOUTS = {
    "invoice-northwind": [([
        "Northwind Office Supplies GmbH",
        "Hafenstrasse 12, 20457 Hamburg",
        "",
        "INVOICE",
        "Invoice No. NW-2026-00417",
        "Invoice Date 2026-11-02",
        "Due Date 2026-12-02",
        "Bill to: Fabrikam Legal LLP, 8 Quay Street, Dublin",
        "",
        "Qty Description Unit Amount",
        "12 Recycled copier paper A4 (box) 24.90 298.80",
        "4 Toner cartridge TN-2420 61.50 246.00",
        "30 Ballpoint pens, blue 0.85 25.50",
        "",
        (28, "Subtotal 570.30"),
        (28, "VAT 19% 108.36"),
        (28, "Total Due EUR 678.66"),
        "",
        "Pay to IBAN DE89 3704 0044 0532 0130 00 within 30 days.",
    ], {})],
    "invoice-contoso": [([
        "Contoso Cloud Services Ltd",
        "1 Canal Walk, Manchester M1 3HE",
        "",
        "Tax Invoice",
        "Invoice No. CCS/88213",
        "Invoice Date 15/11/2026",
        "Due Date 15.12.2026",
        "",
        "Service Period Amount",
        "Compute instances Nov 2026 $3,912.40",
        "Object storage (14.2 TB) Nov 2026 $1,140.00",
        "Support plan (Business) Nov 2026 $499.00",
    ], {}), ([
        "Contoso Cloud Services Ltd - page 2",
        "",
        (24, "Subtotal $5,551.40"),
        (24, "VAT 20% $1,110.28"),
        (24, "Total Due $6,661.68"),
        "",
        "Bank: GB29 NWBK 6016 1331 9268 19",
    ], {})],
    "receipt-bakery": [([
        "Le Petit Four",
        "Boulangerie - 22 rue Oberkampf, Paris",
        "Date: 28/11/2026 08:14",
        "",
        "2x Croissant 2.60",
        "1x Pain au chocolat 1.50",
        "1x Baguette tradition 1.30",
        "1x Cafe creme 3.20",
        "",
        "TOTAL EUR 8.60",
        "CB VISA ****4417",
        "Merci de votre visite!",
    ], dict(width=226.0, height=420.0, left=12.0, top=20.0))],
    "receipt-hardware": [([
        "Woodgrove Hardware",
        "Store #0193 - Portland, OR",
        "Date: 2026-11-21 17:42",
        "",
        "DECK SCREWS 5LB 1 @ 34.97 34.97",
        "CORDLESS DRILL 20V 1 @ 129.00 129.00",
        "SAFETY GLASSES 2 @ 6.49 12.98",
        "SUBTOTAL 176.95",
        "TAX 0.00",
        "TOTAL $176.95",
        "MASTERCARD ****8821",
        "Returns within 90 days with receipt.",
    ], dict(width=226.0, height=480.0, left=12.0, top=20.0))],
}
FIELDS = {"invoice-northwind": INVOICE_FIELDS, "invoice-contoso": INVOICE_FIELDS,
          "receipt-bakery": RECEIPT_FIELDS, "receipt-hardware": RECEIPT_FIELDS}
SAMPLES = {name: ([page(lines, **layout) for lines, layout in pages], FIELDS[name])
           for name, pages in LAYOUTS.items()}

out = pathlib.Path("samples")
out.mkdir(parents=True, exist_ok=True)
for name, (pages, fields) in SAMPLES.items():
    doc = {"name": name, "request": {"document": {"pages": pages}, "fields": fields,
                                     "metadata": {"sample": name}}}
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
print("wrote", len(SAMPLES), "samples to", out)


def pdf_string(text):
    """A PDF literal string of WinAnsi bytes."""
    raw = text.encode("cp1252")
    return b"(" + raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)") + b")"


def pdf_page_content(lines, height=792.0, left=48.0, top=56.0, **_):
    """Each line drawn where page() put its words: baseline PDF_ASCENT below
    the box's top, in PDF space (origin bottom left)."""
    ops = [b"BT", b"/F1 %g Tf" % PDF_SIZE]
    for row, line in enumerate(lines):
        indent, line = line if isinstance(line, tuple) else (0, line)
        if not line:
            continue
        x = left + indent * CHAR_W
        baseline = height - (top + row * LINE_H + PDF_ASCENT)
        ops.append(b"1 0 0 1 %g %g Tm %s Tj" % (x, baseline, pdf_string(line)))
    ops.append(b"ET")
    return zlib.compress(b"\n".join(ops) + b"\n", 9)


def pdf(pages):
    """A PDF 1.4 file of `pages`: (lines, width, height, left, top) each."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", None,
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Courier /Encoding /WinAnsiEncoding >>"]
    kids = []
    for lines, layout in pages:
        width, height = layout.get("width", 612.0), layout.get("height", 792.0)
        content = pdf_page_content(lines, **layout)
        objects.append(b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(content), content))
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %g %g] "
                       b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % (width, height, len(objects)))
        kids.append(b"%d 0 R" % len(objects))
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(kids), len(kids))
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def pdf_words(lines, layout):
    """The words the PDF's text layer holds, as page() lays them out but
    with the em box's height."""
    laid_out = page(lines, **layout)
    for word in laid_out["words"]:
        word["bbox"][3] = round(word["bbox"][1] + PDF_SIZE, 1)
    return laid_out


PDF_SAMPLES = {name: LAYOUTS[name] for name in ["invoice-northwind", "invoice-contoso", "receipt-bakery"]}
files = out / "files"
files.mkdir(exist_ok=True)
for name, pages in PDF_SAMPLES.items():
    (files / f"{name}.pdf").write_bytes(pdf(pages))
    fields = SAMPLES[name][1]
    doc = {"name": name, "file": f"{name}.pdf",
           "request": {"fields": fields, "metadata": {"sample": name, "file": True}},
           "pages": [pdf_words(*p) for p in pages]}
    (files / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
print("wrote", len(PDF_SAMPLES), "PDF samples to", files)
