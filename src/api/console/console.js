// docstream's console: plain JavaScript modules, no build step, served by
// `serve` from the binary. It calls the public API only, with the API key
// in a header; the key lives in this tab's memory and nowhere else.
//
// Every value that came from a request, an extractor or the server is put
// on the page as text (textContent, attributes set one by one), never as
// HTML, so a job's metadata or error cannot run in the page.

const state = { key: null, live: null };

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
      await api("/v1/extractions?limit=1");
      document.getElementById("nav").hidden = false;
      route();
    } catch (error) {
      state.key = null;
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

const FILTERS = ["status", "extractor", "error_prefix", "idempotency_key"];

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

  await render();
  // Live: the page is read again every few seconds while it is shown.
  state.live = setInterval(render, 2000);
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
  show(el("p", {}, "Loading…"));
  let row, log;
  try {
    [row, log] = await Promise.all([
      api(`/v1/extractions/${encodeURIComponent(id)}?include=request`),
      api(`/v1/extractions/${encodeURIComponent(id)}/transitions`),
    ]);
  } catch (error) {
    show(el("h1", {}, "Job"), errorState(error));
    return;
  }
  const boxes = (row.post_processing.bbox_refinement && row.post_processing.bbox_refinement.result) || {};
  const grounded = boxes.fields || {};
  const fields = Object.entries(row.result ? row.result.fields || {} : {});
  const fieldRows = fields.map(([name, value]) =>
    el("tr", { "data-field": name },
      el("td", {}, name),
      el("td", {}, value === null ? "(not found)" : String(value.value ?? "")),
      el("td", {}, grounded[name] ? `page ${grounded[name].page + 1}` : "")));
  const pages = (row.request && row.request.document && row.request.document.pages) || [];
  const drawings = pages.map((page, index) => drawPage(page, index, grounded));
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
    fields.length
      ? el("table", { id: "fields" }, el("thead", {}, el("tr", {}, el("th", {}, "Field"), el("th", {}, "Value"), el("th", {}, "Where"))),
        el("tbody", {}, fieldRows))
      : el("p", { class: "empty-state" }, "No result yet."),
    el("h2", {}, "Document"),
    drawings.length ? el("div", { class: "pages" }, drawings) : el("p", { class: "empty-state" }, "No page geometry (a text document)."),
    el("h2", {}, "Timeline"),
    el("ol", { id: "timeline" }, log.map((entry) =>
      el("li", {}, `${when(entry.at)}: ${entry.transition}${entry.token === null ? "" : ` (attempt ${entry.token})`}`))),
  );
}

/** Page `index` drawn to scale: its words, and each grounded field's box. */
function drawPage(page, index, grounded) {
  const drawing = svg("svg", { class: "page", viewBox: `0 0 ${page.width} ${page.height}`,
    role: "img", "aria-label": `page ${index + 1}`, "data-page": index });
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
    const rect = svg("rect", { class: "field", "data-field": name, x: x0, y: y0, width: x1 - x0, height: y1 - y0 });
    const title = svg("title");
    title.textContent = name;
    rect.append(title);
    drawing.append(rect);
  }
  return drawing;
}

// --- dead letters ------------------------------------------------------------------

async function letters() {
  show(el("h1", {}, "Dead letters"), el("p", {}, "Loading…"));
  try {
    const page = await api("/v1/dead-letters");
    const body = page.items.length === 0
      ? el("p", { class: "empty-state" }, "No dead letters.")
      : el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "When"), el("th", {}, "Kind"), el("th", {}, "Key"), el("th", {}, "Where"), el("th", {}, "Why"))),
        el("tbody", {}, page.items.map((l) => el("tr", {},
          el("td", {}, when(l.created_at)), el("td", {}, l.error_kind), el("td", {}, l.idempotency_key || ""),
          el("td", {}, `${l.source_topic}/${l.source_partition}/${l.source_offset}`), el("td", { class: "error" }, l.error)))));
    show(el("h1", {}, "Dead letters"), body);
  } catch (error) {
    show(el("h1", {}, "Dead letters"), errorState(error));
  }
}

// --- routing -------------------------------------------------------------------------

function route() {
  clearInterval(state.live);
  if (!state.key) return login();
  const [path, query] = (location.hash.slice(1) || "/jobs").split("?");
  const params = new URLSearchParams(query || "");
  if (path.startsWith("/job/")) return job(decodeURIComponent(path.slice(5)));
  if (path === "/letters") return letters();
  return jobs(params);
}

window.addEventListener("hashchange", route);
document.getElementById("logout").addEventListener("click", () => {
  state.key = null;
  document.getElementById("nav").hidden = true;
  route();
});
route();
