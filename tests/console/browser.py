"""The console in a real Chromium (Debian's), driven by Playwright, against
the `serve` and workers that tests/console.rs started. Exits non-zero with
the failed check's message; screenshots go to $OUT.

Environment: BASE (serve's URL), KEY and KEY_B (tenants A and B), BOXED (a
job of A with boxes), FAILED (a failed job of A that a retry makes
succeed), XSS (a failed job of A whose metadata and error are markup), OUT,
CHROMIUM (the browser's path).
"""

import json
import os
import sys
import urllib.request

from playwright.sync_api import expect, sync_playwright

BASE, KEY, KEY_B = os.environ["BASE"], os.environ["KEY"], os.environ["KEY_B"]
BOXED, FAILED, XSS = os.environ["BOXED"], os.environ["FAILED"], os.environ["XSS"]
OUT = os.environ["OUT"]


def api(path, key=KEY):
    request = urllib.request.Request(BASE + path, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request) as answer:
        return json.load(answer)


def log_in(page, key):
    page.goto(BASE + "/console")
    page.fill("#key", key)
    page.click("#login button[type=submit]")
    expect(page.locator("#nav")).to_be_visible()


def boxes_are_where_the_result_says(page):
    """Each field's rectangle sits where the stored box, scaled to the drawn page, says."""
    job = api(f"/v1/extractions/{BOXED}?include=request")
    grounded = job["post_processing"]["bbox_refinement"]["result"]["fields"]
    pages = job["request"]["document"]["pages"]
    page.goto(f"{BASE}/console#/job/{BOXED}")
    expect(page.locator("#status")).to_have_text("succeeded")
    checked = 0
    for name, box in grounded.items():
        if box is None:
            continue
        svg = page.locator(f'svg.page[data-page="{box["page"]}"]')
        outer = svg.bounding_box()
        # The page's content box: inside its border.
        left, top, width = svg.evaluate("e => [e.clientLeft, e.clientTop, e.clientWidth]")
        scale = width / pages[box["page"]]["width"]
        rect = page.locator(f'rect.field[data-field="{name}"]').bounding_box()
        x0, y0, x1, y1 = box["bbox"]
        center = (outer["x"] + left + (x0 + x1) / 2 * scale, outer["y"] + top + (y0 + y1) / 2 * scale)
        drawn = (rect["x"] + rect["width"] / 2, rect["y"] + rect["height"] / 2)
        assert all(abs(d - e) <= 1.5 for d, e in zip(drawn, center)), f"{name}: centre {drawn}, stored {center}"
        # The stroke widens the drawn box a little on each side, no more.
        for drawn_size, stored in ((rect["width"], (x1 - x0) * scale), (rect["height"], (y1 - y0) * scale)):
            assert -1 <= drawn_size - stored <= 5, f"{name}: size {drawn_size}, stored {stored}"
        checked += 1
    assert checked >= 2, f"only {checked} boxes to compare"
    row = page.locator("#fields tbody tr").first
    name = row.get_attribute("data-field")
    row.hover()
    expect(page.locator(f'rect.field[data-field="{name}"]')).to_have_class("field hot")
    page.screenshot(path=f"{OUT}/job.png", full_page=True)
    print(f"console: {checked} field boxes drawn where the bbox result says")


def retry_a_failed_job(page):
    page.goto(f"{BASE}/console#/jobs?status=failed")
    row = page.locator(f'tr[data-id="{FAILED}"]')
    expect(row).to_be_visible()
    page.screenshot(path=f"{OUT}/jobs-failed.png", full_page=True)
    row.locator("input[type=checkbox]").check()
    page.click("text=Retry selected")
    expect(page.locator(".confirm")).to_contain_text("This will retry 1 job")
    page.click("#confirm")
    # Live: the row leaves the failed list once the retry took, without a reload.
    expect(row).to_have_count(0, timeout=30_000)
    for i in range(60):
        # A hash change re-renders the job without a reload (the key stays).
        page.goto(f"{BASE}/console#/jobs?poll={i}")
        page.goto(f"{BASE}/console#/job/{FAILED}")
        expect(page.locator("#status")).to_be_visible()
        if page.locator("#status").text_content() == "succeeded":
            break
        page.wait_for_timeout(500)
    expect(page.locator("#status")).to_have_text("succeeded")
    print("console: a failed job retried from the list succeeded")


def markup_is_text(page, dialogs, stray):
    page.goto(f"{BASE}/console#/job/{XSS}")
    expect(page.locator("#metadata")).to_contain_text("<img src=x onerror=")
    expect(page.locator("#error")).to_contain_text("</script><img")
    assert page.locator("main img").count() == 0, "markup became an element"
    page.goto(f"{BASE}/console#/jobs?status=failed")
    page.wait_for_timeout(300)
    assert not dialogs, f"a dialog opened: {dialogs}"
    assert not stray, f"requests made by markup: {stray}"
    print("console: markup in metadata and errors rendered as text")


def another_tenant_sees_nothing(page):
    page.click("#logout")
    log_in(page, KEY_B)
    page.goto(f"{BASE}/console#/job/{BOXED}")
    expect(page.locator(".error-state")).to_contain_text("404")
    page.goto(f"{BASE}/console#/jobs")
    expect(page.locator(".empty-state")).to_have_text("No jobs match.")
    print("console: tenant B does not see A's job by its URL")


def main():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                    args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        dialogs, stray = [], []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.on("request", lambda r: stray.append(r.url) if not r.url.startswith(BASE + "/console")
                and not r.url.startswith(BASE + "/v1/") else None)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        log_in(page, KEY)
        expect(page.locator("#jobs tbody tr").first).to_be_visible()
        page.screenshot(path=f"{OUT}/jobs.png", full_page=True)
        boxes_are_where_the_result_says(page)
        markup_is_text(page, dialogs, stray)
        retry_a_failed_job(page)
        page.goto(f"{BASE}/console#/letters")
        expect(page.locator(".empty-state")).to_have_text("No dead letters.")
        page.screenshot(path=f"{OUT}/letters.png", full_page=True)
        another_tenant_sees_nothing(page)
        csp = [e for e in errors if "Content Security Policy" in e]
        assert not csp, f"the page broke its own policy: {csp}"
        assert not [e for e in errors if "404" not in e], f"errors in the page: {errors}"
        browser.close()


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"console: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
