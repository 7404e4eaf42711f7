#!/usr/bin/env python3
"""Regenerates samples/*.json: invoices and receipts laid out as OCR
would return them (pages of words with boxes in points, top-left origin), each
with the field specs the demo submits with it. Deterministic; run from the repo root."""
import json
import pathlib

CHAR_W, LINE_H, FONT_H = 6.0, 16.0, 11.0

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

SAMPLES = {
    "invoice-northwind": ([page([
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
    ])], INVOICE_FIELDS),
    "invoice-contoso": ([page([
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
    ]), page([
        "Contoso Cloud Services Ltd - page 2",
        "",
        (24, "Subtotal $5,551.40"),
        (24, "VAT 20% $1,110.28"),
        (24, "Total Due $6,661.68"),
        "",
        "Bank: GB29 NWBK 6016 1331 9268 19",
    ])], INVOICE_FIELDS),
    "receipt-bakery": ([page([
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
    ], width=226.0, height=420.0, left=12.0, top=20.0)], RECEIPT_FIELDS),
    "receipt-hardware": ([page([
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
    ], width=226.0, height=480.0, left=12.0, top=20.0)], RECEIPT_FIELDS),
}

out = pathlib.Path("samples")
out.mkdir(parents=True, exist_ok=True)
for name, (pages, fields) in SAMPLES.items():
    doc = {"name": name, "request": {"document": {"pages": pages}, "fields": fields,
                                     "metadata": {"sample": name}}}
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
print("wrote", len(SAMPLES), "samples to", out)
