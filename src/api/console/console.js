// docstream's console: plain JavaScript modules, no build step, served by
// `serve` from the binary. It calls the public API only, with the API key
// in a header; the key lives in this tab's memory and nowhere else.
//
// Every value that came from a request, an extractor or the server is put
// on the page as text (textContent, attributes set one by one), never as
// HTML, so a job's metadata or error cannot run in the page.

// `view` counts the pages shown: a page's timer starts only if it is still
// the page shown when its first load ends.
const state = { key: null, live: null, me: null, view: 0 };

const can = (scope) => Boolean(state.me && state.me.scopes.includes(scope));

/** An element `tag` with `attrs` and children (strings become text). */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "on") {
      for (const [event, handler] of Object.entries(value)) node.addEventListener(event, handler);
    } else if (value !== null && value !== undefined && value !== false) {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** An SVG element `tag` with `attrs`. */
function svg(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  return node;
}

/** Calls the API; the parsed body, or throws an Error with the server's message. */
async function api(path, options = {}) {
  if (!state.key) throw new Error("logged out");
  const headers = { Authorization: `Bearer ${state.key}` };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method: options.method || "GET",
    headers: { ...headers, ...(options.headers || {}) },
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
    credentials: "omit",
  });
  const text = await response.text();
  const body = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const message = body && body.error ? body.error.message : response.statusText;
    const error = new Error(`${response.status}: ${message}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

const main = () => document.getElementById("main");

/** Replaces the page's content with `nodes`, and moves focus there. */
function show(...nodes) {
  const target = main();
  target.replaceChildren(...nodes);
  target.focus({ preventScroll: true });
}

function errorState(error) {
  return el("p", { class: "error-state", role: "alert" }, String(error.message || error));
}

function when(value) {
  return value ? new Date(value).toLocaleString() : "";
}

// --- login -------------------------------------------------------------------

function login() {
  const input = el("input", { id: "key", type: "password", autocomplete: "off", required: true });
  const message = el("p", { role: "status" });
  const form = el("form", { id: "login", on: { submit: async (event) => {
    event.preventDefault();
    state.key = input.value.trim();
    try {
      state.me = await api("/v1/me");
      for (const link of document.querySelectorAll("#nav [data-scope]")) {
        link.hidden = !can(link.getAttribute("data-scope"));
      }
      document.getElementById("who").textContent = state.me.tenant;
      document.getElementById("nav").hidden = false;
      route();
    } catch (error) {
      state.key = null;
      state.me = null;
      message.replaceChildren(errorState(error));
    }
  } } },
    el("h1", {}, "Log in"),
    el("label", { for: "key" }, "API key", input),
    el("p", {}, el("button", { type: "submit" }, "Log in")),
    message,
  );
  show(form);
  input.focus();
}

// --- jobs ----------------------------------------------------------------------

const FILTERS = ["status", "needs_review", "extractor", "error_prefix", "idempotency_key"];

async function jobs(params) {
  const form = el("form", { class: "filters", on: { submit: (event) => {
    event.preventDefault();
    const query = new URLSearchParams();
    for (const name of FILTERS) {
      const value = form.elements[name].value.trim();
      if (value) query.set(name, value);
    }
    const meta = form.elements.metadata.value.trim();
    if (meta.includes("=")) {
      const [key, ...rest] = meta.split("=");
      query.set(`metadata.${key}`, rest.join("="));
    }
    location.hash = `#/jobs?${query}`;
  } } },
    el("label", {}, "Status",
      el("select", { name: "status" },
        ["", "queued", "running", "succeeded", "failed", "cancelled"].map((s) =>
          el("option", { value: s, selected: params.get("status") === s }, s || "any")))),
    el("label", {}, "Needs review",
      el("select", { name: "needs_review" },
        [["", "any"], ["true", "yes"], ["false", "no"]].map(([value, label]) =>
          el("option", { value, selected: (params.get("needs_review") || "") === value }, label)))),
    el("label", {}, "Extractor", el("input", { name: "extractor", value: params.get("extractor") || "" })),
    el("label", {}, "Error starts with", el("input", { name: "error_prefix", value: params.get("error_prefix") || "" })),
    el("label", {}, "Idempotency key", el("input", { name: "idempotency_key", value: params.get("idempotency_key") || "" })),
    el("label", {}, "Metadata KEY=VALUE", el("input", { name: "metadata", value: metadataOf(params) })),
    el("button", { type: "submit" }, "Filter"),
  );
  const bar = el("div", { class: "bar", "aria-live": "polite" });
  const table = el("div", { id: "jobs" }, el("p", {}, "Loading…"));
  show(el("h1", {}, "Jobs"), form, bar, table);
  const selected = new Set();

  const render = async () => {
    let page;
    try {
      page = await api(`/v1/extractions?${listQuery(params)}`);
    } catch (error) {
      table.replaceChildren(errorState(error));
      return;
    }
    if (page.items.length === 0) {
      table.replaceChildren(el("p", { class: "empty-state" }, "No jobs match."));
      return;
    }
    const rows = page.items.map((job) => {
      const box = el("input", { type: "checkbox", "aria-label": `select ${job.id}`, checked: selected.has(job.id),
        on: { change: () => { box.checked ? selected.add(job.id) : selected.delete(job.id); actions(); } } });
      return el("tr", { "data-id": job.id },
        el("td", {}, box),
        el("td", { class: "id" }, el("a", { href: `#/job/${job.id}` }, job.id)),
        el("td", { class: `status status-${job.status}` }, job.status),
        el("td", { class: "optional" }, job.attempts),
        el("td", { class: "optional" }, when(job.submitted_at)),
        el("td", { class: "error" }, job.error || ""),
      );
    });
    const next = page.next_cursor
      ? el("a", { href: `#/jobs?${withCursor(params, page.next_cursor)}` }, "Next page")
      : null;
    table.replaceChildren(
      el("table", {},
        el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", {}, "Id"), el("th", {}, "Status"),
          el("th", { class: "optional" }, "Attempts"), el("th", { class: "optional" }, "Submitted"), el("th", {}, "Error"))),
        el("tbody", {}, rows)),
      el("p", {}, next));
  };

  const actions = () => {
    if (selected.size === 0) { bar.replaceChildren(); return; }
    const act = (action) => confirmAction(bar, action, [...selected], async () => {
      selected.clear();
      await render();
      actions();
    });
    bar.replaceChildren(
      el("span", {}, `${selected.size} selected`),
      el("button", { type: "button", on: { click: () => act("retry") } }, "Retry selected"),
      el("button", { type: "button", on: { click: () => act("cancel") } }, "Cancel selected"),
    );
  };

  const view = state.view;
  await render();
  // Live: the page is read again every few seconds while it is shown.
  if (view === state.view) state.live = setInterval(render, 2000);
}

/** The list's own parameters among the page's (a shared link may hold others). */
function listQuery(params) {
  const query = new URLSearchParams();
  for (const [name, value] of params) {
    if (FILTERS.includes(name) || name === "cursor" || name.startsWith("metadata.")) query.set(name, value);
  }
  return query;
}

function metadataOf(params) {
  for (const [name, value] of params) if (name.startsWith("metadata.")) return `${name.slice(9)}=${value}`;
  return "";
}

function withCursor(params, cursor) {
  const next = new URLSearchParams(params);
  next.set("cursor", cursor);
  return next;
}

/** Asks in the page (no dialog) before a bulk action, then runs it. */
function confirmAction(bar, action, ids, done) {
  const cancel = el("button", { type: "button", on: { click: done } }, "Back");
  const go = el("button", { type: "button", id: "confirm", on: { click: async () => {
    try {
      const operation = await api("/v1/extractions/actions", { method: "POST", body: { action, ids } });
      bar.replaceChildren(el("span", { role: "status" },
        `${action}: ${operation.done} done, ${operation.refused} refused, ${operation.not_found} not found`));
      await done();
    } catch (error) {
      bar.replaceChildren(errorState(error));
    }
  } } }, `Yes, ${action} ${ids.length}`);
  bar.replaceChildren(el("span", { class: "confirm" },
    `This will ${action} ${ids.length} job${ids.length === 1 ? "" : "s"}. `, go, " ", cancel));
  go.focus();
}

// --- one job -----------------------------------------------------------------------

async function job(id) {
  // Shown only while this is still the page: an answer that comes after a
  // navigation must not replace the page navigated to.
  const view = state.view;
  show(el("p", {}, "Loading…"));
  let row, log;
  try {
    [row, log] = await Promise.all([
      api(`/v1/extractions/${encodeURIComponent(id)}?include=request`),
      api(`/v1/extractions/${encodeURIComponent(id)}/transitions`),
    ]);
  } catch (error) {
    if (view === state.view) show(el("h1", {}, "Job"), errorState(error));
    return;
  }
  if (view !== state.view) return;
  const boxes = (row.post_processing.bbox_refinement && row.post_processing.bbox_refinement.result) || {};
  const grounded = boxes.fields || {};
  const fields = Object.entries(row.result ? row.result.fields || {} : {});
  // A file's words are what its extraction read of it; its pages are drawn
  // under the boxes. A JSON document's words are in its request.
  const file = row.request && row.request.document && row.request.document.object;
  let pages = (row.request && row.request.document && row.request.document.pages) || [];
  let corrections = [];
  try {
    if (file) pages = (await api(`/v1/extractions/${encodeURIComponent(id)}/document`)).pages || [];
    corrections = await api(`/v1/extractions/${encodeURIComponent(id)}/corrections`);
  } catch (error) {
    if (error.status !== 404) throw error;
  }
  const images = file ? await Promise.all(pages.map((_, index) => pageImage(id, index))) : [];
  if (view !== state.view) return;
  const latest = {};
  for (const c of corrections) latest[c.field] = c;
  const bar = el("div", { class: "bar", id: "review-bar", "aria-live": "polite" });
  const fieldRows = fields.map(([name, value]) => {
    const box = grounded[name];
    const corrected = latest[name];
    const review = el("td", {});
    if (row.status === "succeeded") {
      review.append(el("button", { type: "button", class: "correct", "aria-label": `Correct ${name}`,
        on: { click: () => correctField(review, id, name, corrected ? corrected.value : value && value.value, bar) } },
        "Correct"));
    }
    return el("tr", { "data-field": name, class: box && box.needs_review ? "needs-review" : "" },
      el("td", {}, name),
      el("td", {}, value === null ? "(not found)" : String(value.value ?? "")),
      el("td", { class: "confidence" }, confidenceOf(box)),
      el("td", { class: "corrected optional" }, corrected
        ? `${corrected.value ?? "(not in the document)"} (${corrected.reviewer || "a reviewer"}, ${when(corrected.corrected_at)})`
        : ""),
      el("td", { class: "optional" }, box ? `page ${box.page + 1}` : ""),
      review);
  });
  const drawings = pages.map((page, index) => drawPage(page, index, grounded, images[index]));
  for (const tr of fieldRows) {
    const name = tr.getAttribute("data-field");
    const hot = (on) => {
      tr.classList.toggle("hot", on);
      for (const rect of document.querySelectorAll("rect.field")) {
        if (rect.getAttribute("data-field") === name) rect.classList.toggle("hot", on);
      }
    };
    tr.tabIndex = 0;
    tr.addEventListener("mouseenter", () => hot(true));
    tr.addEventListener("mouseleave", () => hot(false));
    tr.addEventListener("focus", () => hot(true));
    tr.addEventListener("blur", () => hot(false));
  }
  show(
    el("h1", {}, "Job ", el("span", { class: "id" }, row.id)),
    el("dl", { class: "facts" },
      el("dt", {}, "Status"), el("dd", { class: `status status-${row.status}`, id: "status" }, row.status),
      el("dt", {}, "Attempts"), el("dd", {}, row.attempts),
      el("dt", {}, "Submitted"), el("dd", {}, when(row.submitted_at)),
      el("dt", {}, "Finished"), el("dd", {}, when(row.finished_at)),
      el("dt", {}, "Error"), el("dd", { id: "error" }, row.error || ""),
      el("dt", {}, "Metadata"), el("dd", { id: "metadata" }, row.metadata ? JSON.stringify(row.metadata) : ""),
    ),
    el("h2", {}, "Fields"),
    boxes.needs_review ? el("p", { id: "needs-review" }, `${boxes.needs_review} of the fields need review: OCR was less sure of them than the request's min_confidence.`) : "",
    bar,
    fields.length
      ? el("table", { id: "fields" }, el("thead", {}, el("tr", {}, el("th", {}, "Field"), el("th", {}, "Value"),
          el("th", {}, "Confidence"), el("th", { class: "optional" }, "Corrected"),
          el("th", { class: "optional" }, "Where"), el("th", {}, "Review"))),
        el("tbody", {}, fieldRows))
      : el("p", { class: "empty-state" }, "No result yet."),
    el("h2", {}, "Document"),
    drawings.length ? el("div", { class: "pages" }, drawings) : el("p", { class: "empty-state" }, "No page geometry (a text document)."),
    el("h2", {}, "Request and result"),
    el("details", { id: "request" }, el("summary", {}, "The request as submitted"),
      el("pre", { tabindex: 0 }, row.request ? JSON.stringify(row.request, null, 2) : "(erased)")),
    el("details", { id: "result" }, el("summary", {}, "The result"),
      el("pre", { tabindex: 0 }, row.result ? JSON.stringify(row.result, null, 2) : "(none yet)")),
    el("h2", {}, "Timeline"),
    el("ol", { id: "timeline" }, log.map((entry) =>
      el("li", {}, `${when(entry.at)}: ${entry.transition}${entry.token === null ? "" : ` (attempt ${entry.token})`}`))),
  );
}

/** A grounded field's confidence as a person reads it ("" for a text layer's). */
function confidenceOf(box) {
  if (!box || box.confidence === null || box.confidence === undefined) return "";
  const percent = `${(box.confidence * 100).toFixed(0)}%`;
  return box.needs_review ? `${percent}, needs review` : percent;
}

/** Page `index` of job `id`'s file as an object URL, or null when it is not drawn (a TIFF). */
async function pageImage(id, index) {
  const response = await fetch(`/v1/extractions/${encodeURIComponent(id)}/pages/${index}`, {
    headers: { Authorization: `Bearer ${state.key}` }, credentials: "omit" });
  if (!response.ok) return null;
  return URL.createObjectURL(await response.blob());
}

/** An inline form in `cell` that stores a correction of field `name` of job `id`. */
function correctField(cell, id, name, current, bar) {
  const input = el("input", { name: "value", value: current ?? "", "aria-label": `Right value of ${name}` });
  const absent = el("input", { type: "checkbox", name: "absent" });
  const form = el("form", { class: "correction", on: { submit: async (event) => {
    event.preventDefault();
    const body = { value: absent.checked ? null : input.value };
    try {
      await api(`/v1/extractions/${encodeURIComponent(id)}/fields/${encodeURIComponent(name)}/corrections`,
        { method: "POST", body });
      route();
    } catch (error) {
      bar.replaceChildren(errorState(error));
    }
  } } },
    el("label", {}, "Right value", input),
    el("label", { class: "inline" }, absent, "Not in the document"),
    el("button", { type: "submit" }, "Save"));
  cell.replaceChildren(form);
  input.focus();
}

/** Page `index` drawn to scale: the page itself when it is an image (a
 * scan, a rendered PDF page), its words, and each grounded field's box,
 * those under the request's min_confidence marked for review. Boxes are in
 * the page's own unit, as the image spans it. */
function drawPage(page, index, grounded, image) {
  const drawing = svg("svg", { class: image ? "page drawn" : "page", viewBox: `0 0 ${page.width} ${page.height}`,
    role: "img", "aria-label": `page ${index + 1}`, "data-page": index });
  if (image) {
    drawing.append(svg("image", { class: "scan", href: image, x: 0, y: 0,
      width: page.width, height: page.height, preserveAspectRatio: "none" }));
  }
  for (const word of page.words) {
    const [x0, y0, x1, y1] = word.bbox;
    const rect = svg("rect", { class: "word", x: x0, y: y0, width: x1 - x0, height: y1 - y0 });
    const title = svg("title");
    title.textContent = word.text;
    rect.append(title);
    drawing.append(rect);
  }
  for (const [name, box] of Object.entries(grounded)) {
    if (!box || box.page !== index) continue;
    const [x0, y0, x1, y1] = box.bbox;
    const rect = svg("rect", { class: box.needs_review ? "field review" : "field", "data-field": name,
      x: x0, y: y0, width: x1 - x0, height: y1 - y0 });
    const title = svg("title");
    title.textContent = box.confidence === null || box.confidence === undefined ? name : `${name}: ${confidenceOf(box)}`;
    rect.append(title);
    drawing.append(rect);
  }
  return drawing;
}

// --- overview ------------------------------------------------------------------

/** A number with thousands separators. */
const count = (n) => Number(n).toLocaleString();

/** Seconds as a short duration ("42 s", "3 min", "2.5 h"). */
function duration(s) {
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

/** A small line chart of `series` ([name, values]) over the samples' times. */
function chart(title, samples, series) {
  const width = 300, height = 80, pad = 4;
  const top = Math.max(1, ...series.flatMap(([, values]) => values));
  const drawing = svg("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": `${title}: ${series.map(([name, values]) => `${name} ${values.length ? count(values[values.length - 1]) : 0}`).join(", ")}` });
  drawing.append(svg("line", { x1: 0, y1: height - pad, x2: width, y2: height - pad, class: "axis" }));
  series.forEach(([name, values], index) => {
    if (values.length === 0) return;
    const step = values.length > 1 ? width / (values.length - 1) : 0;
    const points = values.map((v, i) => `${(i * step).toFixed(1)},${(height - pad - (v / top) * (height - 2 * pad)).toFixed(1)}`);
    drawing.append(svg("polyline", { points: points.join(" "), class: `series series-${index}`, "data-series": name }));
  });
  const legend = el("p", { class: "legend" }, series.map(([name], index) =>
    el("span", { class: `key key-${index}` }, name)), ` (max ${count(top)})`);
  return el("figure", { class: "card chart-card" }, el("figcaption", {}, title), drawing, legend);
}

/** The figures and charts of an overview answer. */
function overviewBody(overview) {
  const now = overview.now;
  const samples = overview.samples;
  const figure = (label, value, id) => el("div", { class: "card figure", id },
    el("span", { class: "label" }, label), el("span", { class: "value" }, value));
  const perMinute = 60 / overview.interval_s;
  const last = samples.slice(-4);
  const finishedPerMin = last.length ? last.reduce((a, s) => a + s.finished, 0) / last.length * perMinute : 0;
  return [
    el("div", { class: "figures" },
      figure("Queued", count(now.queued), "queued"),
      figure("Running", count(now.running), "running"),
      figure("Bbox pending", count(now.bbox_pending), "bbox-pending"),
      figure("Bbox running", count(now.bbox_running), "bbox-running"),
      figure("Oldest queued", duration(now.oldest_queued_s), "oldest"),
      figure("Finished / min", count(Math.round(finishedPerMin)), "throughput")),
    samples.length === 0
      ? el("p", { class: "empty-state" }, "No samples yet: the census takes one every " + duration(overview.interval_s) + ".")
      : el("div", { class: "charts" },
        chart("Submitted and finished per sample, last hour", samples,
          [["submitted", samples.map((s) => s.submitted)], ["finished", samples.map((s) => s.finished)]]),
        chart("Open jobs, last hour", samples,
          [["queued", samples.map((s) => s.queued)], ["running", samples.map((s) => s.running)]]),
        chart("Oldest queued wait (s), last hour", samples,
          [["wait", samples.map((s) => Math.round(s.oldest_queued_s))]])),
  ];
}

/** A live page: `load` makes its body, again every `every` ms while shown. */
async function livePage(title, load, every = 5000) {
  const body = el("div", { class: "live", "aria-busy": "true" }, el("p", {}, "Loading…"));
  show(el("h1", {}, title), body);
  const render = async () => {
    try {
      body.replaceChildren(...await load());
    } catch (error) {
      body.replaceChildren(errorState(error));
    }
    body.setAttribute("aria-busy", "false");
  };
  const view = state.view;
  await render();
  if (view === state.view) state.live = setInterval(render, every);
}

function overview() {
  return livePage("Overview", async () => overviewBody(await api("/v1/overview")));
}

// --- tenant and operators ------------------------------------------------------

function quota(value, none) {
  return value === null || value === undefined ? none : count(value);
}

function tenantFacts(t) {
  const cap = t.max_open_jobs === null ? "no cap" : count(t.max_open_jobs);
  return el("dl", { class: "facts" },
    el("dt", {}, "Open jobs"), el("dd", { class: "use" }, `${count(t.open_jobs)} of ${cap}`),
    el("dt", {}, "Submit rate"), el("dd", {}, `${quota(t.submit_rate_per_s, "no limit")} /s per process, burst ${count(t.submit_burst)}`),
    el("dt", {}, "Retention"), el("dd", {}, t.retention_days === 0 ? "for ever" : `${t.retention_days} days`),
    el("dt", {}, "Created"), el("dd", {}, when(t.created_at)));
}

function keysTable(keys) {
  if (keys.length === 0) return el("p", { class: "empty-state" }, "No keys.");
  return el("table", { class: "keys" },
    el("thead", {}, el("tr", {}, el("th", {}, "Prefix"), el("th", {}, "Scopes"), el("th", {}, "Created"), el("th", {}, "Revoked"))),
    el("tbody", {}, keys.map((k) => el("tr", {},
      el("td", { class: "id" }, k.prefix), el("td", {}, k.scopes.join(", ")),
      el("td", {}, when(k.created_at)), el("td", {}, k.revoked_at ? when(k.revoked_at) : "")))));
}

function endpointsTable(endpoints) {
  if (endpoints.length === 0) return el("p", { class: "empty-state" }, "No webhook endpoint is disabled.");
  return el("table", { class: "endpoints" },
    el("thead", {}, el("tr", {}, el("th", {}, "Endpoint"), el("th", {}, "Disabled"), el("th", {}, "Why"))),
    el("tbody", {}, endpoints.map((e) => el("tr", {},
      el("td", { class: "error" }, e.url), el("td", {}, when(e.disabled_at)), el("td", { class: "error" }, e.reason)))));
}

function tenant() {
  return livePage("Tenant", async () => {
    const t = await api("/v1/tenant");
    return [el("h2", {}, t.tenant), tenantFacts(t), el("h2", {}, "Keys"), keysTable(t.keys),
      el("h2", {}, "Disabled webhook endpoints"), endpointsTable(t.disabled_endpoints)];
  }, 15000);
}

function operator() {
  return livePage("Deployment", async () => {
    const [overview, tenants] = await Promise.all([api("/v1/operator/overview"), api("/v1/operator/tenants")]);
    const orphans = overview.orphans || [];
    return [
      ...overviewBody(overview),
      el("h2", {}, "Open orphans"),
      orphans.length === 0
        ? el("p", { class: "empty-state" }, "None: the reapers are keeping up.")
        : el("dl", { class: "facts", id: "orphans" }, orphans.flatMap((o) =>
          [el("dt", {}, `${o.class}: ${o.meaning}`), el("dd", {}, count(o.open))])),
      el("h2", {}, "Consumer lag"),
      (overview.lag || []).length === 0
        ? el("p", { class: "empty-state" }, "Not read: the broker did not answer the last census in time.")
        : el("dl", { class: "facts", id: "lag" }, overview.lag.flatMap((g) =>
          [el("dt", {}, `${g.group} on ${g.topic}`), el("dd", {}, count(g.lag))])),
      el("h2", {}, "Tenants"),
      el("table", { id: "tenants" },
        el("thead", {}, el("tr", {}, el("th", {}, "Tenant"), el("th", {}, "Open / cap"), el("th", { class: "optional" }, "Rate /s"),
          el("th", { class: "optional" }, "Retention"), el("th", {}, "Live keys"), el("th", {}, "Disabled endpoints"))),
        el("tbody", {}, tenants.items.map((t) => el("tr", {},
          el("td", {}, t.tenant),
          el("td", {}, `${count(t.open_jobs)} / ${quota(t.max_open_jobs, "no cap")}`),
          el("td", { class: "optional" }, quota(t.submit_rate_per_s, "no limit")),
          el("td", { class: "optional" }, t.retention_days === 0 ? "for ever" : `${t.retention_days} d`),
          el("td", {}, count(t.keys.filter((k) => !k.revoked_at).length)),
          el("td", {}, count(t.disabled_endpoints.length)))))),
    ];
  }, 5000);
}

// --- dead letters ------------------------------------------------------------------

function letters() {
  return livePage("Dead letters", async () => {
    const page = await api("/v1/dead-letters");
    if (page.items.length === 0) return [el("p", { class: "empty-state" }, "No dead letters.")];
    const bar = el("div", { class: "bar", "aria-live": "polite" });
    const rows = page.items.map((l) => {
      const replay = !l.replayed_at && can("submit")
        ? el("button", { type: "button", "data-letter": l.id, on: { click: () => {
          clearInterval(state.live);
          confirmReplay(bar, l);
        } } }, "Replay")
        : (l.replayed_at ? `replayed ${when(l.replayed_at)}` : "");
      return el("tr", { "data-letter": l.id },
        el("td", {}, when(l.created_at)), el("td", {}, l.error_kind), el("td", { class: "error" }, l.idempotency_key || ""),
        el("td", { class: "optional" }, `${l.source_topic}/${l.source_partition}/${l.source_offset}`),
        el("td", { class: "error" }, l.error,
          l.excerpt ? el("details", { class: "excerpt" }, el("summary", {}, "Request"), el("pre", { tabindex: 0 }, l.excerpt)) : null),
        el("td", {}, replay));
    });
    return [bar, el("table", { id: "letters" },
      el("thead", {}, el("tr", {}, el("th", {}, "When"), el("th", {}, "Kind"), el("th", {}, "Key"),
        el("th", { class: "optional" }, "Where"), el("th", {}, "Why"), el("th", {}, ""))),
      el("tbody", {}, rows))];
  });
}

/** Asks in the page before replaying letter `l`, then replays it. */
function confirmReplay(bar, l) {
  const back = el("button", { type: "button", on: { click: () => route() } }, "Back");
  const go = el("button", { type: "button", id: "confirm", on: { click: async () => {
    try {
      const copy = await api(`/v1/dead-letters/${l.id}/replay`, { method: "POST" });
      bar.replaceChildren(el("span", { role: "status" },
        `Replayed to ${copy.topic}/${copy.partition}/${copy.offset}.`), " ",
        el("button", { type: "button", on: { click: () => route() } }, "Refresh"));
    } catch (error) {
      bar.replaceChildren(errorState(error));
    }
  } } }, "Yes, replay it");
  bar.replaceChildren(el("span", { class: "confirm" },
    `This will produce letter ${l.id}'s record to ${l.source_topic} again, once. `, go, " ", back));
  go.focus();
}

// --- routing -------------------------------------------------------------------------

function route() {
  state.view += 1;
  clearInterval(state.live);
  if (!state.key) return login();
  const [path, query] = (location.hash.slice(1) || "/overview").split("?");
  const params = new URLSearchParams(query || "");
  for (const link of document.querySelectorAll("#nav a")) {
    const current = link.getAttribute("href") === `#${path}`;
    if (current) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
  }
  if (path.startsWith("/job/")) return job(decodeURIComponent(path.slice(5)));
  if (path === "/jobs") return jobs(params);
  if (path === "/letters") return letters();
  if (path === "/tenant") return tenant();
  if (path === "/operator") return operator();
  return overview();
}

window.addEventListener("hashchange", route);
document.getElementById("logout").addEventListener("click", () => {
  state.key = null;
  state.me = null;
  document.getElementById("nav").hidden = true;
  route();
});
route();
