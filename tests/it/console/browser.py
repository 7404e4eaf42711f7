"""The console in a real Chromium (Debian's), driven by Playwright, against
the `serve` and workers that tests/it/console.rs started. Exits non-zero with
the failed check's message; screenshots go to $OUT.

Environment: BASE (serve's URL), KEY and KEY_B (tenants A and B, the first
keys' scopes), KEY_OP (a key of A with every scope, `admin` and `operator`
too), KEY_MANY (a tenant with 10,000 finished jobs), BOXED (a job of A with
boxes), SCANNED (a scan of A read by OCR, some values under its
min_confidence), FAILED (a failed job of A that a retry makes succeed), XSS (a failed
job of A whose metadata and error are markup), LETTER (a dead letter of A),
SAMPLE (a request to submit), OUT, CHROMIUM (the browser's path).

Every page is also checked by axe-core (axe-playwright-python's copy): no
violation of the WCAG A and AA rules.
"""

import json
import os
import sys
import time
import urllib.request

from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import expect, sync_playwright

BASE, KEY, KEY_B = os.environ["BASE"], os.environ["KEY"], os.environ["KEY_B"]
KEY_OP, KEY_MANY = os.environ["KEY_OP"], os.environ["KEY_MANY"]
BOXED, FAILED, XSS = os.environ["BOXED"], os.environ["FAILED"], os.environ["XSS"]
LETTER, OUT = os.environ["LETTER"], os.environ["OUT"]
SCANNED = os.environ["SCANNED"]
AXE = Axe()
WCAG = {"runOnly": {"type": "tag", "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]}}


def api(path, key=KEY, body=None):
    headers = {"Authorization": f"Bearer {key}"}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode()
    request = urllib.request.Request(BASE + path, headers=headers, data=data)
    with urllib.request.urlopen(request) as answer:
        return json.load(answer)


def accessible(page, what):
    """axe-core finds no WCAG A/AA violation on the page as it is now."""
    found = AXE.run(page, options=WCAG).response["violations"]
    summary = [(v["id"], v["impact"], [n["target"] for n in v["nodes"]][:3]) for v in found]
    assert not found, f"{what}: accessibility violations {summary}"


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
    page.locator("#request summary").click()
    expect(page.locator("#request pre")).to_contain_text('"pages"')
    page.screenshot(path=f"{OUT}/job.png", full_page=True)
    print(f"console: {checked} field boxes drawn where the bbox result says")


def a_scan_is_drawn_under_its_boxes(page):
    """A scanned job's page is drawn, spanning the page; each field's box sits
    where its stored coordinates say, scaled to the drawn page, and those OCR
    was less sure of than min_confidence are marked; a correction made in the
    console is stored beside the value, which stays."""
    job = api(f"/v1/extractions/{SCANNED}")
    grounded = job["post_processing"]["bbox_refinement"]["result"]["fields"]
    document = api(f"/v1/extractions/{SCANNED}/document")
    page.goto(f"{BASE}/console#/job/{SCANNED}")
    expect(page.locator("#status")).to_have_text("succeeded")
    expect(page.locator("svg.page image.scan")).to_have_count(1)
    svg = page.locator('svg.page[data-page="0"]')
    outer = svg.bounding_box()
    left, top, width = svg.evaluate("e => [e.clientLeft, e.clientTop, e.clientWidth]")
    size = document["pages"][0]
    scale = width / size["width"]
    image = page.locator("svg.page image.scan").bounding_box()
    assert abs(image["x"] - (outer["x"] + left)) <= 1 and abs(image["y"] - (outer["y"] + top)) <= 1, image
    assert abs(image["width"] - width) <= 1 and abs(image["height"] - size["height"] * scale) <= 1, image
    checked, marked = 0, 0
    for name, box in grounded.items():
        if box is None:
            continue
        rect = page.locator(f'rect.field[data-field="{name}"]')
        drawn = rect.bounding_box()
        x0, y0, x1, y1 = box["bbox"]
        center = (outer["x"] + left + (x0 + x1) / 2 * scale, outer["y"] + top + (y0 + y1) / 2 * scale)
        middle = (drawn["x"] + drawn["width"] / 2, drawn["y"] + drawn["height"] / 2)
        assert all(abs(d - e) <= 1.5 for d, e in zip(middle, center)), f"{name}: centre {middle}, stored {center}"
        classes = rect.get_attribute("class").split()
        assert ("review" in classes) == box["needs_review"], f"{name}: {classes} vs {box}"
        marked += box["needs_review"]
        checked += 1
    assert checked >= 4, f"only {checked} boxes to compare"
    accessible(page, "scanned job")
    page.screenshot(path=f"{OUT}/scan.png", full_page=True)
    name = next(n for n, b in grounded.items() if b is not None)
    before = job["result"]["fields"][name]
    page.click(f'tr[data-field="{name}"] button.correct')
    page.fill(f'tr[data-field="{name}"] input[name=value]', "fixed by hand")
    page.click(f'tr[data-field="{name}"] form.correction button[type=submit]')
    expect(page.locator(f'tr[data-field="{name}"] td.corrected')).to_contain_text("fixed by hand")
    corrections = api(f"/v1/extractions/{SCANNED}/corrections")
    assert [c["value"] for c in corrections] == ["fixed by hand"], corrections
    assert api(f"/v1/extractions/{SCANNED}")["result"]["fields"][name] == before
    print(f"console: a scan drawn under {checked} boxes ({marked} marked for review); a correction stored beside its value")


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


def overview_is_live(page):
    """The overview's figures, then its charts as the census samples arrive, without a reload."""
    page.goto(f"{BASE}/console#/overview")
    expect(page.locator("#queued .value")).to_be_visible()
    expect(page.locator("svg.chart").first).to_be_visible(timeout=30_000)
    # Two samples at least: the charts have lines.
    expect(page.locator("svg.chart polyline").first).to_be_visible(timeout=30_000)
    assert page.locator('#nav a[href="#/tenant"]').is_hidden(), "Tenant shown without admin"
    assert page.locator('#nav a[href="#/operator"]').is_hidden(), "Deployment shown without operator"
    # No layout shift while the page refreshes itself (5 s apart).
    page.wait_for_timeout(6_000)
    shift = page.evaluate("""() => new Promise(done => {
        let total = 0;
        new PerformanceObserver(list => { for (const e of list.getEntries()) total += e.value; })
          .observe({type: "layout-shift", buffered: false});
        setTimeout(() => done(total), 5500);
    })""")
    assert shift < 0.05, f"the live overview shifted its layout by {shift}"
    accessible(page, "overview")
    page.screenshot(path=f"{OUT}/overview.png", full_page=True)
    print(f"console: the overview is live (layout shift {shift:.3f} over one refresh)")


def jobs_arrive_live(page):
    page.goto(f"{BASE}/console#/jobs")
    expect(page.locator("#jobs tbody tr").first).to_be_visible()
    made = api("/v1/extractions", body=json.loads(os.environ["SAMPLE"]))
    expect(page.locator(f'tr[data-id="{made["id"]}"]')).to_be_visible(timeout=10_000)
    accessible(page, "jobs")
    print("console: a job submitted while the list was open appeared in it")


def keyboard_only(page):
    """Tab reaches a job's link with a visible focus ring; Enter opens the job."""
    page.goto(f"{BASE}/console#/jobs")
    expect(page.locator("#jobs tbody tr").first).to_be_visible()
    page.locator("#main").focus()
    for _ in range(40):
        page.keyboard.press("Tab")
        focused = page.evaluate("""() => {
            const e = document.activeElement;
            return {href: e.getAttribute("href") || "", outline: getComputedStyle(e).outlineStyle};
        }""")
        if focused["href"].startswith("#/job/"):
            break
    else:
        raise AssertionError("40 presses of Tab never reached a job's link")
    assert focused["outline"] != "none", "the focused link has no visible focus"
    page.keyboard.press("Enter")
    expect(page.locator("#status")).to_be_visible()
    print("console: a job opened with the keyboard alone")


def narrow_window(page):
    page.set_viewport_size({"width": 420, "height": 800})
    for view in ("jobs", "overview", f"job/{BOXED}"):
        page.goto(f"{BASE}/console#/{view}")
        page.wait_for_timeout(500)
        overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"#{view} is {overflow} px wider than a 420 px window"
    page.goto(f"{BASE}/console#/jobs")
    expect(page.locator("#jobs tbody tr").first).to_be_visible()
    page.screenshot(path=f"{OUT}/jobs-narrow.png", full_page=True)
    page.set_viewport_size({"width": 1280, "height": 800})
    print("console: no sideways scroll at 420 px")


def replay_a_dead_letter(page):
    page.goto(f"{BASE}/console#/letters")
    row = page.locator(f'tr[data-letter="{LETTER}"]')
    expect(row).to_be_visible()
    accessible(page, "dead letters")
    page.screenshot(path=f"{OUT}/letters.png", full_page=True)
    row.locator("summary").click()
    expect(row.locator("pre")).to_contain_text("<img src=x onerror=alert(3)>")
    assert page.locator("main img").count() == 0, "the letter's excerpt became markup"
    row.get_by_role("button", name="Replay").click()
    expect(page.locator(".confirm")).to_contain_text(f"letter {LETTER}")
    page.click("#confirm")
    expect(page.get_by_role("status")).to_contain_text("Replayed to")
    letters = api("/v1/dead-letters")["items"]
    replayed = [l for l in letters if str(l["id"]) == LETTER]
    assert replayed and replayed[0]["replayed_at"], f"not replayed: {letters}"
    page.goto(f"{BASE}/console#/jobs")
    page.goto(f"{BASE}/console#/letters")
    expect(row).to_contain_text("replayed")
    print("console: a dead letter replayed once from its row")


def operator_views(page):
    page.click("#logout")
    log_in(page, KEY_OP)
    page.goto(f"{BASE}/console#/tenant")
    expect(page.locator("table.keys tbody tr")).to_have_count(2)
    expect(page.locator(".use")).to_contain_text("of")
    accessible(page, "tenant")
    page.screenshot(path=f"{OUT}/tenant.png", full_page=True)
    page.goto(f"{BASE}/console#/operator")
    expect(page.locator("#tenants")).to_contain_text("console-many")
    expect(page.locator("#tenants tbody tr")).to_have_count(3)
    expect(page.locator("#lag dt")).to_have_count(3)
    accessible(page, "deployment")
    page.screenshot(path=f"{OUT}/deployment.png", full_page=True)
    print("console: the tenant and deployment views answer an admin and operator key")


def first_render_of_a_long_list(page):
    page.click("#logout")
    log_in(page, KEY_MANY)
    timings = []
    for _ in range(3):
        page.goto(f"{BASE}/console#/overview")
        expect(page.locator("#queued .value")).to_be_visible()
        started = time.perf_counter()
        page.goto(f"{BASE}/console#/jobs")
        expect(page.locator("#jobs tbody tr").first).to_be_visible()
        timings.append((time.perf_counter() - started) * 1000)
    print(f"console: first rows of 10,000 jobs drawn in {sorted(timings)[1]:.0f} ms (median of 3)")


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
        accessible(page, "log-in landing")
        overview_is_live(page)
        jobs_arrive_live(page)
        page.screenshot(path=f"{OUT}/jobs.png", full_page=True)
        boxes_are_where_the_result_says(page)
        accessible(page, "job")
        markup_is_text(page, dialogs, stray)
        retry_a_failed_job(page)
        replay_a_dead_letter(page)
        keyboard_only(page)
        narrow_window(page)
        operator_views(page)
        a_scan_is_drawn_under_its_boxes(page)
        first_render_of_a_long_list(page)
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
