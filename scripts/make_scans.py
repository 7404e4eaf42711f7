#!/usr/bin/python3
"""Writes scanned versions of the shipped sample PDFs, each with its ground
truth, for `docstream eval` to measure OCR on.

For each PDF of samples/files/ and each variant (the text-layer PDF itself;
images at 150, 200 and 300 dpi; a JPEG; pages turned 90, 180 and 270 degrees
clockwise, as if fed sideways; skewed by +2 and -5 degrees; salt-and-pepper
noise over a light blur; a PDF of page images with no text layer) it writes
`<sample>.<variant>.<ext>` and `<sample>.<variant>.truth.json`: the request's
fields, and each field's value as docstream's rule extractor returns it from
a perfect reading, with the page and box of the words it is read from, in
the document's own unit (the image's pixels as written, or PDF points).

The boxes come from the text layer's words (samples/files/<name>.json,
points, top-left origin), scaled to the resolution and turned exactly as
PIL turned the image, so the truth is known rather than read by the OCR
under test. A sample of more than one page (invoice-contoso has two) is
written as a multi-page TIFF, the one image format that holds pages.

Deterministic (fixed seeds, no timestamps). Needs Debian's python3-pil and
poppler's pdftoppm:

    /usr/bin/python3 scripts/make_scans.py [--out DIR] [--check [VARIANT ...]]

`--check` then reads the written images with tesseract and prints, for each
field it finds, its box beside the truth's and their IoU."""
import argparse
import concurrent.futures
import dataclasses
import io
import json
import math
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys
import tempfile

from PIL import Image, ImageFilter

ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = ROOT / "samples" / "files"

# What each field is printed as on each sample: the words the rule extractor
# reads its value from (after the field's anchor; for a money field only the
# word holding the number, for a pattern field its whole match), checked
# against make_samples.py's LAYOUTS. None for a field the sample lacks.
PRINTED = {
    "invoice-northwind": {
        "invoice_number": "NW-2026-00417",
        "invoice_date": "2026-11-02",
        "due_date": "2026-12-02",
        "subtotal": "570.30",
        "tax": "108.36",  # "VAT 19% 108.36": 19% is no amount
        "total": "678.66",  # "Total Due EUR 678.66"
        # The pattern takes whole groups of four: the trailing "00" is left.
        "iban": "DE89 3704 0044 0532 0130",
    },
    "invoice-contoso": {
        "invoice_number": "CCS/88213",
        "invoice_date": "15/11/2026",
        "due_date": "15.12.2026",
        "subtotal": "$5,551.40",
        "tax": "$1,110.28",
        "total": "$6,661.68",
        "iban": "GB29 NWBK 6016 1331 9268",
    },
    "receipt-bakery": {
        "store": "Le Petit",  # the first two words of the document
        "date": "28/11/2026",
        "total": "8.60",  # "TOTAL EUR 8.60"
        "card_last4": "****4417",
    },
}


@dataclasses.dataclass(frozen=True)
class Variant:
    """How one scan is made from the sample PDF."""

    # What is written: "text" (the PDF as is), "png", "jpeg" or "pdf" (a
    # PDF of JPEG page images).
    output: str
    # The resolution the PDF is rendered at; None for the text PDF.
    dpi: int | None = 200
    # PIL's rotate() angle: degrees counter-clockwise.
    turn: float = 0
    noise: bool = False


VARIANTS = {
    "text": Variant("text", dpi=None),
    "150dpi": Variant("png", dpi=150),
    "200dpi": Variant("png", dpi=200),
    "300dpi": Variant("png", dpi=300),
    "jpeg": Variant("jpeg"),
    # Turned clockwise, so PIL's angle is negative.
    "rot90": Variant("png", turn=-90),
    "rot180": Variant("png", turn=-180),
    "rot270": Variant("png", turn=-270),
    "skew2": Variant("png", turn=2),
    "skew-5": Variant("png", turn=-5),
    "noise": Variant("png", noise=True),
    "pdf": Variant("pdf"),
}
JPEG_QUALITY = 50  # the `jpeg` variant: blocky, as a phone or a cheap scanner saves it
PDF_JPEG_QUALITY = 75  # the `pdf` variant: what scanners put in PDFs
NOISE_SHARE, BLUR_RADIUS = 0.005, 0.6
WHITE = 255
CHECK_DPI = 300  # what docstream renders a PDF page without text at (DOCSTREAM_OCR_DPI)
CHECKED = ["300dpi", "rot90", "rot270", "skew2", "skew-5"]  # what --check reads by default


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "samples" / "scans")
    parser.add_argument("--check", nargs="*", metavar="VARIANT",
                        help=f"read these variants back with tesseract (default: {' '.join(CHECKED)})")
    args = parser.parse_args()
    unknown = set(args.check or []) - set(VARIANTS)
    if unknown:
        parser.error(f"no variant {', '.join(sorted(unknown))}; the variants: {' '.join(VARIANTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    truths = []
    for name in PRINTED:
        truths += write_scans(name, args.out)
    print(f"wrote {len(truths)} scanned documents to {args.out}")
    if args.check is not None:
        wanted = args.check or CHECKED
        sys.exit(check(args.out, [t for t in truths if t["variant"] in wanted]))


def write_scans(name, out):
    """Every variant of sample `name` and its truth; the truths."""
    sample = json.loads((FILES / f"{name}.json").read_text())
    pdf_path = FILES / sample["file"]
    fields = printed_fields(name, sample)
    truths = []
    with tempfile.TemporaryDirectory() as scratch:
        renders = {}
        for variant_name, variant in VARIANTS.items():
            if variant.output == "text":
                document = f"{name}.{variant_name}.pdf"
                shutil.copyfile(pdf_path, out / document)
                sizes, place = page_sizes(sample), lambda bbox: bbox
            else:
                if variant.dpi not in renders:
                    renders[variant.dpi] = render(pdf_path, variant.dpi, scratch)
                document, sizes, place = write_scan(
                    renders[variant.dpi], variant, f"{name}.{variant_name}", sample, out)
            truth = make_truth(name, variant_name, document, sample, placed(fields, place), sizes)
            (out / f"{name}.{variant_name}.truth.json").write_text(json.dumps(truth, indent=1) + "\n")
            truths.append(truth)
    return truths


def write_scan(pages, variant, stem, sample, out):
    """Writes the pages rendered at `variant.dpi` as `variant` makes them:
    the document's name, its page sizes, and the map of a box in points to
    the document's unit."""
    if variant.output == "pdf":
        document = f"{stem}.pdf"
        (out / document).write_bytes(image_pdf(pages, page_sizes(sample)))
        return document, page_sizes(sample), lambda bbox: bbox
    scans = [scan(page, variant, seed=f"{stem}:{number}") for number, page in enumerate(pages)]
    document = write_image(scans, variant.output, out / stem)
    scale = variant.dpi / 72
    before, after = pages[0].size, scans[0].size

    def place(bbox):
        return turned([v * scale for v in bbox], variant.turn, before, after)

    return document, [scan.size for scan in scans], place


def printed_fields(name, sample):
    """Each field of the request: its value, and the page and box (in
    points) of the words it is printed as; None where it is not."""
    fields = {}
    for spec in sample["request"]["fields"]:
        printed = PRINTED[name].get(spec["name"])
        if printed is None:
            fields[spec["name"]] = None
            continue
        page, bbox = find_words(sample["pages"], printed.split(" "))
        fields[spec["name"]] = {"value": normalise(spec, printed), "page": page, "bbox": bbox}
    return fields


def find_words(pages, texts):
    """The page and union box of the one run of words reading `texts`."""
    found = []
    for number, page in enumerate(pages):
        words = page["words"]
        for at in range(len(words) - len(texts) + 1):
            run = words[at:at + len(texts)]
            if [w["text"] for w in run] == texts:
                found.append((number, union([w["bbox"] for w in run])))
    # Twice printed, the truth would not know which one the reader took.
    if len(found) != 1:
        raise SystemExit(f"{' '.join(texts)!r} is printed {len(found)} times, not once")
    return found[0]


def normalise(spec, printed):
    """The value the rule extractor gives for `printed`: a money amount as
    plain digits and its point, a day-first date as ISO, a pattern's group 1."""
    kind = spec.get("type", "string")
    if kind == "money":
        return re.sub(r"[^0-9.]", "", printed)
    if kind == "date":
        day_first = re.fullmatch(r"(\d{1,2})[./](\d{1,2})[./](\d{4})", printed)
        if day_first:
            day, month, year = day_first.groups()
            return f"{year}-{int(month):02}-{int(day):02}"
        return printed
    if "pattern" in spec:
        match = re.search(spec["pattern"], printed)
        return match.group(1) if match.groups() else match.group(0)
    return printed


def render(pdf_path, dpi, scratch):
    """The PDF's pages rendered at `dpi` in grey."""
    prefix = pathlib.Path(scratch) / f"page-{dpi}"
    subprocess.run(["pdftoppm", "-r", str(dpi), "-gray", str(pdf_path), str(prefix)], check=True)
    # pdftoppm numbers pages prefix-1.pgm, or prefix-01.pgm past nine.
    paths = sorted(prefix.parent.glob(f"{prefix.name}-*.pgm"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    return [load(path) for path in paths]


def load(path):
    """The image at `path`, read in whole (its file may go away)."""
    with Image.open(path) as image:
        image.load()
        return image


def scan(page, variant, seed):
    """One rendered page as `variant` scans it."""
    if variant.noise:
        page = salt_and_pepper(page.filter(ImageFilter.GaussianBlur(BLUR_RADIUS)), seed)
    if variant.turn:
        # Quarter turns are exact transposes in PIL; bicubic only matters for skew.
        page = page.rotate(variant.turn, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=WHITE)
    return page


def salt_and_pepper(page, seed):
    """`page` with about NOISE_SHARE of its pixels set black or white. Added
    after the blur, so the specks stay as sharp as dust on a scanner."""
    page = page.copy()
    pixels = page.load()
    rng = random.Random(seed)
    width, height = page.size
    for _ in range(round(width * height * NOISE_SHARE)):
        pixels[rng.randrange(width), rng.randrange(height)] = rng.choice((0, WHITE))
    return page


def turned(bbox, angle, before, after):
    """Where `bbox` of an image sized `before` lands when PIL's
    rotate(angle, expand=True) turns it into one sized `after`: the hull of
    its four corners turned about the old centre onto the new one (PIL
    centres the turned page in the grown canvas)."""
    a = math.radians(angle)
    cos, sin = math.cos(a), math.sin(a)
    x0, y0, x1, y1 = bbox
    xs, ys = [], []
    for x, y in ((x0, y0), (x1, y0), (x1, y1), (x0, y1)):
        dx, dy = x - before[0] / 2, y - before[1] / 2
        # Counter-clockwise on screen, where y grows downwards.
        xs.append(after[0] / 2 + dx * cos + dy * sin)
        ys.append(after[1] / 2 - dx * sin + dy * cos)
    return [min(xs), min(ys), max(xs), max(ys)]


def write_image(scans, output, stem):
    """Writes the page images; the file's name. One page as a PNG or a JPEG;
    more as a TIFF, deflated or JPEG-compressed to stand for either."""
    if len(scans) > 1:
        path = stem.with_name(stem.name + ".tif")
        compression = {"png": {"compression": "tiff_deflate"},
                       "jpeg": {"compression": "jpeg", "quality": JPEG_QUALITY}}[output]
        scans[0].save(path, save_all=True, append_images=scans[1:], **compression)
    elif output == "jpeg":
        path = stem.with_name(stem.name + ".jpg")
        scans[0].save(path, quality=JPEG_QUALITY)
    else:
        path = stem.with_name(stem.name + ".png")
        scans[0].save(path)
    return path.name


def page_sizes(sample):
    return [(page["width"], page["height"]) for page in sample["pages"]]


def placed(fields, place):
    """`fields` with each box mapped by `place` into the document's unit."""
    return {name: truth and dict(truth, bbox=[round(v, 1) for v in place(truth["bbox"])])
            for name, truth in fields.items()}


def make_truth(name, variant_name, document, sample, fields, sizes):
    """The truth file of one document."""
    # One width and height stand for every page: the samples' pages agree.
    if len(set(sizes)) != 1:
        raise SystemExit(f"{document}: pages of different sizes {sizes}")
    output = VARIANTS[variant_name].output
    return {
        "document": document,
        "sample": name,
        "kind": name.split("-")[0],
        "variant": variant_name,
        "dpi": None if output in ("text", "pdf") else VARIANTS[variant_name].dpi,
        "pages": len(sizes),
        "width": sizes[0][0],
        "height": sizes[0][1],
        "request": {"fields": sample["request"]["fields"]},
        "fields": fields,
    }


def image_pdf(pages, sizes):
    """A PDF without text: each page (same size in points as the sample's)
    one grey JPEG drawn over the whole of it."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", None]
    kids = []
    for page, (width, height) in zip(pages, sizes):
        jpeg = io.BytesIO()
        page.save(jpeg, "JPEG", quality=PDF_JPEG_QUALITY)
        jpeg = jpeg.getvalue()
        objects.append(b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceGray "
                       b"/BitsPerComponent 8 /Filter /DCTDecode /Length %d >>\nstream\n%s\nendstream"
                       % (page.width, page.height, len(jpeg), jpeg))
        content = b"q %g 0 0 %g 0 0 cm /Im0 Do Q" % (width, height)
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content))
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %g %g] /Resources << /XObject "
                       b"<< /Im0 %d 0 R >> >> /Contents %d 0 R >>"
                       % (width, height, len(objects) - 1, len(objects)))
        kids.append(b"%d 0 R" % len(objects))
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(kids), len(kids))
    return pdf_file(objects)


def pdf_file(objects):
    """A PDF 1.4 file of numbered `objects` (1 is the catalog), as
    make_samples.py writes them."""
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


def check(out, truths):
    """Reads each document of `truths` with tesseract as docstream does (page
    segmentation 1, which finds the page's orientation; a PDF rendered at
    CHECK_DPI and read back in points) and prints each field's box next to
    the truth's. Tesseract boxes the ink and the truth the text layer's em
    box (8 pt above the baseline to 2 pt below), so a right box scores
    about 0.65 on a digit-only word. Returns 1 if a field found as printed
    has an IoU under 0.5; a field tesseract misreads is listed, not failed
    (that is the OCR, not the geometry)."""
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        read = pool.map(ocr_words, [out / truth["document"] for truth in truths])
    worst = 1.0
    print(f"{'document':<32} {'field':<15} {'truth box':<32} {'tesseract box':<32} IoU")
    for truth, words in zip(truths, read):
        for field, want in truth["fields"].items():
            if want is None:
                continue
            got = ocr_box(words, want["page"], PRINTED[truth["sample"]][field].split(" "))
            if got is None:
                print(f"{truth['document']:<32} {field:<15} {fmt(want['bbox']):<32} (not read as printed)")
                continue
            score = iou(got, want["bbox"])
            worst = min(worst, score)
            print(f"{truth['document']:<32} {field:<15} {fmt(want['bbox']):<32} {fmt(got):<32} {score:.2f}")
    print(f"lowest IoU: {worst:.2f}")
    return int(worst < 0.5)


def ocr_words(path):
    """Tesseract's words of the document at `path`: (page from 0, text,
    box), in the document's unit."""
    if path.suffix != ".pdf":
        return tesseract(path)
    with tempfile.TemporaryDirectory() as scratch:
        words = []
        for number, page in enumerate(render(path, CHECK_DPI, scratch)):
            image = pathlib.Path(scratch) / f"check-{number}.png"
            page.save(image)
            words += [(number, text, [v * 72 / CHECK_DPI for v in box]) for _, text, box in tesseract(image)]
        return words


def tesseract(path):
    """Tesseract's words of the image at `path`: (page from 0, text, box)."""
    tsv = subprocess.run(["tesseract", str(path), "-", "--psm", "1", "tsv"], check=True,
                         capture_output=True, text=True).stdout
    words = []
    for line in tsv.splitlines()[1:]:
        cells = line.split("\t")
        if len(cells) == 12 and cells[0] == "5" and cells[11].strip():
            left, top, width, height = map(int, cells[6:10])
            words.append((int(cells[1]) - 1, cells[11], [left, top, left + width, top + height]))
    return words


def ocr_box(words, page, texts):
    """The union box of the first run of `words` on `page` reading `texts`."""
    on_page = [w for w in words if w[0] == page]
    for at in range(len(on_page) - len(texts) + 1):
        run = on_page[at:at + len(texts)]
        if [w[1] for w in run] == texts:
            return union([w[2] for w in run])
    return None


def union(boxes):
    return [min(b[0] for b in boxes), min(b[1] for b in boxes),
            max(b[2] for b in boxes), max(b[3] for b in boxes)]


def iou(a, b):
    width = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    shared = width * height
    area = lambda r: (r[2] - r[0]) * (r[3] - r[1])
    return shared / (area(a) + area(b) - shared)


def fmt(box):
    return "[" + ", ".join(f"{round(v, 1):g}" for v in box) + "]"


if __name__ == "__main__":
    main()
