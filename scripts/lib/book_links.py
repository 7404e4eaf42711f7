"""Checks the links of a built mdBook: every relative href or src in every
page must name a file of the book, and its #fragment an id on that page.
Links with a scheme (https:, mailto:) are not followed, nor links from the
root (mdBook's 404 page links to "/", wherever the book is served). Prints each broken
link and exits 1 if there is one."""

import html.parser
import pathlib
import sys
import urllib.parse


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("id", "name") and value:
                self.ids.add(value)
            if name in ("href", "src") and value:
                self.links.append(value)


def main(root):
    root = pathlib.Path(root).resolve()
    pages = {}
    for path in root.rglob("*.html"):
        page = Page()
        page.feed(path.read_text(encoding="utf-8"))
        pages[path] = page
    broken = []
    for path, page in sorted(pages.items()):
        for link in page.links:
            parts = urllib.parse.urlsplit(link)
            if parts.scheme or link.startswith("/"):
                continue
            target = path if not parts.path else (path.parent / urllib.parse.unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{path.relative_to(root)}: {link}: no such file")
                continue
            if parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if urllib.parse.unquote(parts.fragment) not in ids:
                    broken.append(f"{path.relative_to(root)}: {link}: no such anchor")
    for line in broken:
        print(f"book: broken link: {line}", file=sys.stderr)
    print(f"book: {len(pages)} pages, {sum(len(p.links) for p in pages.values())} links, {len(broken)} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
