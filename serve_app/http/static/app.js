// The service's web page: read an image (or PDF) with POST v1/ocr and show
// the boxes over it, linked both ways to the list of lines; and a live view
// of the service from GET v1/stats. Plain JS, no libraries, no build step.
"use strict";

const $ = (sel) => document.querySelector(sel);
const SVG = "http://www.w3.org/2000/svg";
const STEP_COLORS = { decode: "#94a3b8", det: "#3b82f6", cls: "#8b5cf6", rec: "#10b981", visualize: "#f59e0b" };
const state = { file: null, fileUrl: null, seq: 0, config: { options: [], formats: ["json"] } };

// -- token (kept for this browser tab only) -----------------------------------
const tokenInput = $("#token");
tokenInput.value = sessionStorage.getItem("ocr-token") || "";
tokenInput.addEventListener("input", () => sessionStorage.setItem("ocr-token", tokenInput.value.trim()));
function authHeaders() {
  const t = tokenInput.value.trim();
  return t ? { Authorization: "Bearer " + t } : {};
}

async function errorText(resp) {
  let msg = `HTTP ${resp.status}`;
  try {
    const body = await resp.json();
    if (body.error) msg = `${body.error.code}: ${body.error.message}`;
  } catch (_) { /* not JSON */ }
  if (resp.status === 401) msg += " — enter the service's token at the top right.";
  return msg;
}

function setStatus(el, text, isError) {
  el.textContent = text || "";
  el.classList.toggle("error", !!isError);
}

// -- tabs -----------------------------------------------------------------------
for (const tab of document.querySelectorAll(".tab")) {
  tab.addEventListener("click", () => showView(tab.dataset.view));
}
function showView(name) {
  for (const tab of document.querySelectorAll(".tab")) {
    const on = tab.dataset.view === name;
    tab.classList.toggle("active", on);
    tab.setAttribute("aria-selected", on);
  }
  $("#view-read").hidden = name !== "read";
  $("#view-live").hidden = name !== "live";
  if (name === "live") live.start(); else live.stop();
  history.replaceState(null, "", name === "live" ? "#live" : "#");
}

// -- the option form, built from GET ui/options.json -----------------------------
async function loadConfig() {
  try {
    const r = await fetch("ui/options.json");
    if (r.ok) state.config = await r.json();
  } catch (_) { /* keep the defaults */ }
  const form = $("#options");
  form.textContent = "";
  for (const opt of state.config.options) form.appendChild(optionField(opt));
  const fmt = $("#format");
  fmt.textContent = "";
  for (const f of state.config.formats) fmt.appendChild(new Option(f, f));
  $("#format-field").hidden = state.config.formats.length < 2;
}

function optionField(opt) {
  const label = document.createElement("label");
  label.className = "field" + (opt.kind === "bool" ? " check" : "");
  const title = document.createElement("span");
  title.textContent = opt.label;
  let input;
  if (opt.kind === "bool") {
    input = document.createElement("input");
    input.type = "checkbox";
    input.checked = !!opt.default;
  } else if (opt.kind === "choice") {
    input = document.createElement("select");
    for (const [value, text] of opt.choices) input.appendChild(new Option(text, JSON.stringify(value)));
  } else {
    input = document.createElement("input");
    input.type = "number";
    for (const k of ["min", "max", "step"]) if (opt[k] !== undefined) input[k] = opt[k];
    input.placeholder = opt.default === undefined || opt.default === null ? "service default" : String(opt.default);
  }
  input.name = opt.name;
  input.dataset.kind = opt.kind;
  const text = document.createElement("div");
  text.appendChild(title);
  if (opt.help) {
    const help = document.createElement("small");
    help.textContent = " " + opt.help;
    text.appendChild(document.createElement("br"));
    text.appendChild(help);
  }
  if (opt.kind === "bool") { label.append(input, text); } else { label.append(text, input); }
  return label;
}

function readOptions() {
  const opts = {};
  for (const opt of state.config.options) {
    const input = $("#options").elements[opt.name];
    if (!input) continue;
    if (opt.kind === "bool") {
      if (input.checked !== !!opt.default) opts[opt.name] = input.checked;
    } else if (opt.kind === "choice") {
      const v = JSON.parse(input.value);
      if (v !== "") opts[opt.name] = v;
    } else if (input.value !== "") {
      opts[opt.name] = Number(input.value);
    }
  }
  return opts;
}

// -- choosing a file ----------------------------------------------------------------
const drop = $("#drop");
$("#file").addEventListener("change", (e) => { if (e.target.files[0]) pick(e.target.files[0]); });
for (const ev of ["dragenter", "dragover"]) drop.addEventListener(ev, (e) => { e.preventDefault(); drop.classList.add("over"); });
for (const ev of ["dragleave", "drop"]) drop.addEventListener(ev, (e) => { e.preventDefault(); drop.classList.remove("over"); });
drop.addEventListener("drop", (e) => { if (e.dataTransfer.files[0]) pick(e.dataTransfer.files[0]); });
drop.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") $("#file").click(); });
$("#again").addEventListener("click", () => state.file && read());
$("#options").addEventListener("change", () => state.file && read());
$("#format").addEventListener("change", () => state.file && read());

// Documents (a PDF; a TIFF, often a multi-page fax) have no picture in the
// browser: most browsers cannot show a TIFF either, nor (but Safari) an
// iPhone's HEIC. For these the service draws the picture.
function isPdf(file) {
  return file.type === "application/pdf" || /^image\/(tiff|heic|heif)$/.test(file.type)
    || /\.(pdf|tiff?|heic|heif)$/i.test(file.name);
}

function pick(file) {
  if (state.fileUrl) URL.revokeObjectURL(state.fileUrl);
  state.file = file;
  state.fileUrl = isPdf(file) ? null : URL.createObjectURL(file);
  const picked = $("#picked");
  picked.hidden = false;
  picked.textContent = `${file.name} · ${(file.size / 1024).toFixed(0)} KiB`;
  $("#again").disabled = false;
  read();
}

// -- reading: POST v1/ocr ----------------------------------------------------------
async function read() {
  const seq = ++state.seq;  // only the latest read's answer is shown
  const file = state.file;
  const opts = readOptions();
  // A PDF's or TIFF's pages have no picture in the browser: ask the service to draw them.
  if (isPdf(file) && !("visualize" in opts)) opts.visualize = true;
  const format = $("#format").value || "json";
  const form = new FormData();
  form.append("file", file, file.name);
  form.append("options", JSON.stringify(opts));
  const status = $("#status");
  setStatus(status, `Reading ${file.name}…`);
  document.body.classList.add("busy");
  const t0 = performance.now();
  let resp;
  try {
    resp = await fetch("v1/ocr" + (format !== "json" ? "?format=" + encodeURIComponent(format) : ""),
                       { method: "POST", body: form, headers: authHeaders() });
  } catch (e) {
    if (seq === state.seq) setStatus(status, "The service did not answer: " + e, true);
    return;
  } finally {
    document.body.classList.remove("busy");
  }
  if (seq !== state.seq) return;
  const roundTrip = performance.now() - t0;
  if (!resp.ok) {
    const msg = await errorText(resp);
    if (seq !== state.seq) return;
    setStatus(status, msg, true);
    clearResult();
    return;
  }
  const type = resp.headers.get("content-type") || "";
  if (!type.includes("json") || format !== "json") {
    clearResult();
    const raw = $("#raw");
    raw.hidden = false;
    const text = await resp.text();
    if (seq !== state.seq) return;
    raw.textContent = text;
    setStatus(status, `${format} answer in ${roundTrip.toFixed(0)} ms (boxes are drawn for the json format).`);
    return;
  }
  const body = await resp.json();
  if (seq !== state.seq) return;
  setStatus(status, "");
  show(body, roundTrip);
}

function clearResult() {
  $("#pages").textContent = "";
  $("#lines").textContent = "";
  $("#count").textContent = "";
  $("#timings").hidden = true;
  $("#raw").hidden = true;
  $("#server-picture").hidden = true;
}

// The two body shapes: one image {image, results, timings_ms, visualization},
// or a document {document, pages: [{page, width, height, results, timings_ms}]}.
function pagesOf(body) {
  if (Array.isArray(body.pages)) {
    return body.pages.map((p, k) => ({ number: p.page || k + 1, width: p.width, height: p.height,
                                       results: p.results || [], visualization: p.visualization,
                                       regions: p.regions || null }));
  }
  return [{ number: null, width: body.image.width, height: body.image.height, results: body.results || [],
            visualization: body.visualization, regions: body.regions || null }];
}

function show(body, roundTrip) {
  clearResult();
  const pages = pagesOf(body);
  const pagesEl = $("#pages");
  const list = $("#lines");
  let index = 0;
  const boxes = [];
  for (const page of pages) {
    const fig = document.createElement("figure");
    fig.className = "page card";
    const cap = document.createElement("figcaption");
    const left = document.createElement("span");
    left.textContent = (page.number ? `Page ${page.number} · ` : "") + `${page.width} × ${page.height} px`;
    const right = document.createElement("span");
    right.textContent = `${page.results.length} line${page.results.length === 1 ? "" : "s"}`;
    cap.append(left, right);
    const frame = document.createElement("div");
    frame.className = "frame";
    frame.dataset.w = page.width;
    frame.dataset.h = page.height;
    // The picture: the file itself for an image the browser can show; else
    // (a PDF or TIFF page, a HEIC) the service's drawing of it, else a blank
    // page of its size with the text in the boxes.
    const own = page.number === null && state.fileUrl;
    const src = own ? state.fileUrl
      : page.visualization ? `data:${page.visualization.media_type};base64,${page.visualization.base64}` : null;
    const halfWidth = !own && page.visualization;  // the service's picture is two pages wide
    let bg;
    if (src && !halfWidth) {
      bg = document.createElement("img");
      bg.src = src;
      bg.alt = "the image read";
    } else {
      bg = document.createElement("div");
      bg.className = "blank";
      bg.style.background = "#fff";
      if (src) {
        bg.style.backgroundImage = `url("${src}")`;
        bg.style.backgroundSize = "200% 100%";
      }
    }
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", `0 0 ${page.width} ${page.height}`);
    svg.setAttribute("preserveAspectRatio", "none");
    if (page.number !== null && page.results.length) {
      const head = document.createElement("li");
      head.className = "pagehead";
      head.textContent = `Page ${page.number}`;
      list.appendChild(head);
    }
    if (page.regions) drawRegions(svg, list, page.regions);  // options.structure: under the lines' boxes
    for (const line of page.results) {
      const i = index++;
      const poly = document.createElementNS(SVG, "polygon");
      poly.setAttribute("points", line.box.map((p) => p.join(",")).join(" "));
      poly.setAttribute("class", "box");
      poly.dataset.i = i;
      const tip = document.createElementNS(SVG, "title");
      tip.textContent = `${line.text} (${line.score.toFixed(3)})`;
      poly.appendChild(tip);
      svg.appendChild(poly);
      if (!src) svg.appendChild(boxText(line));
      boxes[i] = poly;
      list.appendChild(lineItem(line, i));
    }
    frame.append(bg, svg);
    fig.append(cap, frame);
    pagesEl.appendChild(fig);
  }
  fitFrames();
  const n = index;
  $("#count").textContent = `${n} line${n === 1 ? "" : "s"}`;
  if (!n) {
    const li = document.createElement("li");
    li.className = "pagehead";
    li.textContent = "No text found.";
    list.appendChild(li);
  }
  link(boxes);
  showTimings(body.timings_ms || {}, roundTrip, body.request_id);
  if (body.visualization && body.visualization.base64) {
    const fig = $("#server-picture");
    fig.querySelector("img").src = `data:${body.visualization.media_type};base64,${body.visualization.base64}`;
    fig.hidden = false;
  }
}

// options.structure: each region a rectangle coloured by its type (app.css
// .region-TYPE), a legend of the types found, and each table as a table.
function drawRegions(svg, list, regions) {
  const found = new Set();
  for (const r of regions) {
    const poly = document.createElementNS(SVG, "polygon");
    poly.setAttribute("points", r.box.map((p) => p.join(",")).join(" "));
    poly.setAttribute("class", `region region-${r.type}`);
    const tip = document.createElementNS(SVG, "title");
    tip.textContent = `${r.type} (${Number(r.score).toFixed(2)})` + (r.note ? ` · ${r.note}` : "");
    poly.appendChild(tip);
    svg.appendChild(poly);
    found.add(r.type);
  }
  const legend = document.createElement("li");
  legend.className = "pagehead regions-legend";
  for (const type of found) {
    const item = document.createElement("span");
    item.className = `region-key region-${type}`;
    item.textContent = type.replace("_", " ");
    legend.appendChild(item);
  }
  if (found.size) list.appendChild(legend);
  for (const r of regions) {
    if (r.type !== "table" || !r.table) continue;
    const li = document.createElement("li");
    li.className = "table-item";
    li.appendChild(tableOf(r.table));
    if (r.table.note || r.note) {
      const note = document.createElement("small");
      note.textContent = r.table.note || r.note;
      li.appendChild(note);
    }
    list.appendChild(li);
  }
}

// A table from its cells (text set as text, never as HTML), spans honoured.
function tableOf(table) {
  const el = document.createElement("table");
  el.className = "rendered";
  const rows = [];
  for (const c of table.cells) (rows[c.row] = rows[c.row] || []).push(c);
  for (const cells of rows) {
    const tr = el.insertRow();
    for (const c of (cells || []).sort((a, b) => a.col - b.col)) {
      const td = tr.insertCell();
      td.textContent = c.text;
      if (c.rowspan > 1) td.rowSpan = c.rowspan;
      if (c.colspan > 1) td.colSpan = c.colspan;
    }
  }
  return el;
}

// Each picture as large as its column allows (small images up to twice
// their size), at most 72% of the window's height; the overlay follows.
function fitFrames() {
  for (const frame of document.querySelectorAll(".frame")) {
    const w = Number(frame.dataset.w), h = Number(frame.dataset.h);
    const room = frame.parentElement.clientWidth;
    const scale = Math.min(room / w, (0.72 * window.innerHeight) / h, 2);
    frame.style.width = `${Math.floor(w * scale)}px`;
    frame.style.height = `${Math.floor(h * scale)}px`;
  }
}
window.addEventListener("resize", fitFrames);

function boxText(line) {
  const ys = line.box.map((p) => p[1]), xs = line.box.map((p) => p[0]);
  const h = Math.max(...ys) - Math.min(...ys);
  const t = document.createElementNS(SVG, "text");
  t.setAttribute("x", Math.min(...xs) + 2);
  t.setAttribute("y", Math.min(...ys) + h * 0.8);
  t.setAttribute("font-size", Math.max(6, h * 0.75));
  t.setAttribute("class", "boxtext");
  t.textContent = line.text;
  return t;
}

function lineItem(line, i) {
  const li = document.createElement("li");
  li.dataset.i = i;
  const n = document.createElement("span");
  n.className = "n";
  n.textContent = i + 1;
  const text = document.createElement("span");
  text.className = "text";
  text.textContent = line.text;
  const score = document.createElement("span");
  score.className = "score" + (line.score < 0.8 ? " low" : "");
  score.textContent = line.score.toFixed(3);
  li.append(n, text, score);
  return li;
}

// Hovering a box highlights its line and the other way round.
function link(boxes) {
  const items = document.querySelectorAll("#lines li[data-i]");
  const rows = [];
  for (const li of items) rows[li.dataset.i] = li;
  const on = (i, scroll) => {
    boxes[i].classList.add("active");
    rows[i].classList.add("active");
    if (scroll) rows[i].scrollIntoView({ block: "nearest" });
  };
  const off = (i) => { boxes[i].classList.remove("active"); rows[i].classList.remove("active"); };
  boxes.forEach((poly, i) => {
    poly.addEventListener("mouseenter", () => on(i, true));
    poly.addEventListener("mouseleave", () => off(i));
    rows[i].addEventListener("mouseenter", () => on(i, false));
    rows[i].addEventListener("mouseleave", () => off(i));
  });
}

function showTimings(t, roundTrip, requestId) {
  const el = $("#timings");
  el.textContent = "";
  const steps = Object.keys(t).filter((k) => k !== "total");
  const total = t.total || steps.reduce((a, k) => a + t[k], 0);
  const row = document.createElement("div");
  row.className = "row";
  row.innerHTML = `<span><span class="total"></span> <span class="muted">in the service</span></span><span class="muted"></span>`;
  row.querySelector(".total").textContent = `${total.toFixed(0)} ms`;
  row.lastChild.textContent = `round trip ${roundTrip.toFixed(0)} ms` + (requestId ? ` · ${requestId.slice(0, 8)}` : "");
  const bar = document.createElement("div");
  bar.className = "tbar";
  const legend = document.createElement("div");
  legend.className = "tlegend";
  for (const k of steps) {
    const color = STEP_COLORS[k] || "#64748b";
    const seg = document.createElement("span");
    seg.style.width = `${(100 * t[k]) / Math.max(total, 1e-9)}%`;
    seg.style.background = color;
    seg.title = `${k} ${t[k].toFixed(1)} ms`;
    bar.appendChild(seg);
    const item = document.createElement("span");
    item.innerHTML = `<i></i>`;
    item.firstChild.style.background = color;
    item.append(`${k} ${t[k].toFixed(1)} ms`);
    legend.appendChild(item);
  }
  el.append(row, bar, legend);
  el.hidden = false;
}

// -- the live view: GET v1/stats every 2 s while it is shown ------------------------
const live = {
  timer: null,
  start() {
    if (!this.timer) { this.poll(); this.timer = setInterval(() => this.poll(), 2000); }
  },
  stop() { clearInterval(this.timer); this.timer = null; },
  async poll() {
    const status = $("#live-status");
    let resp;
    try {
      resp = await fetch("v1/stats", { headers: authHeaders() });
    } catch (e) {
      setStatus(status, "The service did not answer: " + e, true);
      return;
    }
    if (!resp.ok) { setStatus(status, await errorText(resp), true); return; }
    setStatus(status, "");
    const stats = await resp.json();
    drawDeployments(stats);
    drawCharts(stats.history);
    $("#live-updated").textContent = "updated " + new Date(stats.time * 1000).toLocaleTimeString();
  },
};

const ORDER = ["OcrIngress", "OcrPipeline", "TextDetector", "DirectionClassifier", "TextRecognizer", "JobStore"];

function drawDeployments(stats) {
  const grid = $("#deployments");
  grid.textContent = "";
  const byDeployment = {};
  for (const [stage, s] of Object.entries(stats.stages || {})) byDeployment[s.deployment] = { stage, ...s };
  const names = Object.keys(stats.deployments || {}).sort((a, b) => rank(a) - rank(b));
  for (const name of names) {
    const d = stats.deployments[name];
    const s = byDeployment[name];
    const card = document.createElement("div");
    card.className = "card dep";
    card.dataset.deployment = name;
    const top = document.createElement("div");
    top.className = "top";
    const title = document.createElement("span");
    title.className = "name";
    title.textContent = name;
    const chip = document.createElement("span");
    chip.className = "chip" + (d.status === "HEALTHY" ? "" : " warn");
    chip.textContent = d.status.toLowerCase();
    top.append(title, chip);
    const big = document.createElement("div");
    big.className = "big replicas";
    const count = document.createElement("span");
    count.className = "count";
    count.textContent = d.running;
    big.appendChild(count);
    const small = document.createElement("small");
    small.textContent = `replica${d.running === 1 ? "" : "s"} running` +
      (Object.keys(d.replica_states).length > 1 ? " · " + fmtStates(d.replica_states) : "");
    big.appendChild(small);
    card.append(top, big);
    const kv = [];
    if (name === "OcrIngress" && stats.ingress) kv.push(["requests in flight", `${stats.ingress.in_flight} / ${stats.ingress.max_in_flight}`]);
    if (s) {
      const r = s.recent;
      kv.push(["queued calls", s.queue_depth]);
      if (s.pending_crops !== null && s.pending_crops !== undefined) kv.push(["crops waiting", s.pending_crops]);
      kv.push([`batches (last ${r.window_s} s)`, r.batches]);
      kv.push(["mean / max batch", r.batches ? `${r.mean_items} / ${r.max_items}` : "–"]);
      kv.push(["batch limit", s.max_batch_size]);
      kv.push(["time per batch", r.mean_ms !== null ? `${r.mean_ms} ms` : "–"]);
    }
    if (kv.length) card.appendChild(kvList(kv));
    if (s && s.recent.batches) card.appendChild(histogram(s.recent.sizes, s.max_batch_size));
    grid.appendChild(card);
  }
}

function rank(name) { const k = ORDER.indexOf(name); return k < 0 ? ORDER.length : k; }
function fmtStates(states) { return Object.entries(states).map(([k, v]) => `${v} ${k.toLowerCase()}`).join(", "); }

function kvList(pairs) {
  const dl = document.createElement("dl");
  dl.className = "kv";
  for (const [k, v] of pairs) {
    const dt = document.createElement("dt");
    dt.textContent = k;
    const dd = document.createElement("dd");
    dd.textContent = v;
    dl.append(dt, dd);
  }
  return dl;
}

// Batches formed, by size (1 .. the batch limit).
function histogram(sizes, limit) {
  const wrap = document.createElement("div");
  const max = Math.max(limit || 1, ...Object.keys(sizes).map(Number));
  const peak = Math.max(...Object.values(sizes));
  const bars = document.createElement("div");
  bars.className = "hist";
  bars.title = "batches formed, by size";
  for (let k = 1; k <= max; k++) {
    const b = document.createElement("span");
    const n = sizes[String(k)] || 0;
    b.style.height = `${(100 * n) / peak}%`;
    b.title = `${n} batch${n === 1 ? "" : "es"} of ${k}`;
    bars.appendChild(b);
  }
  const label = document.createElement("div");
  label.className = "histlabel";
  label.innerHTML = `<span>size 1</span><span>batch sizes formed</span><span></span>`;
  label.lastChild.textContent = String(max);
  wrap.append(bars, label);
  return wrap;
}

// The last minute at a glance, from the history's newest buckets.
function drawSummary(history) {
  const per = history.bucket_s;
  const lastMin = history.buckets.slice(-Math.max(1, Math.round(60 / per)));
  const n = lastMin.reduce((a, x) => a + x.requests, 0);
  const weighted = (key) => {
    const with_ = lastMin.filter((x) => x[key] !== null);
    const w = with_.reduce((a, x) => a + x.requests, 0);
    return w ? with_.reduce((a, x) => a + x[key] * x.requests, 0) / w : null;
  };
  const p99 = Math.max(...lastMin.map((x) => x.p99_ms ?? -1));
  const errors = history.buckets.reduce((a, x) => a + x.errors, 0);
  const rejected = history.buckets.reduce((a, x) => a + x.client_errors, 0);
  const tiles = [
    ["Throughput", n ? `${(n / (lastMin.length * per)).toFixed(2)}` : "0", "requests/s, last minute"],
    ["Latency p50", weighted("p50_ms") !== null ? `${weighted("p50_ms").toFixed(0)}` : "–", "ms, last minute"],
    ["Latency p99", p99 >= 0 ? `${p99.toFixed(0)}` : "–", "ms, worst 5 s of the last minute"],
    ["Errors", `${errors}`, `server errors, last ${Math.round((history.buckets.length * per) / 60)} min · ${rejected} refused (4xx)`],
  ];
  const el = $("#summary");
  el.textContent = "";
  for (const [title, value, note] of tiles) {
    const tile = document.createElement("div");
    tile.className = "card tile";
    const t = document.createElement("span");
    t.textContent = title;
    const v = document.createElement("b");
    v.textContent = value;
    const small = document.createElement("small");
    small.textContent = note;
    tile.append(t, v, small);
    el.appendChild(tile);
  }
}

function drawCharts(history) {
  if (!history) return;
  drawSummary(history);
  const per = history.bucket_s;
  // From the first bucket with requests (at least the last 2 minutes) to now.
  const first = history.buckets.findIndex((x) => x.requests > 0);
  const keep = Math.max(Math.round(120 / per), first < 0 ? 0 : history.buckets.length - first);
  const b = history.buckets.slice(-keep);
  const t = b.map((x) => x.t);
  chart($("#chart-rate"), t, [
    { values: b.map((x) => (x.requests - x.errors - x.client_errors) / per), color: "#3b82f6", bars: true },
    { values: b.map((x) => (x.errors + x.client_errors) / per), color: "#dc2626", bars: true, stacked: true },
  ], "/s");
  chart($("#chart-latency"), t, [
    { values: b.map((x) => x.p50_ms), color: "#3b82f6" },
    { values: b.map((x) => x.p99_ms), color: "#f59e0b" },
  ], " ms");
  const known = Object.keys(STEP_COLORS);
  const steps = [...new Set(b.flatMap((x) => Object.keys(x.steps_ms || {})))].filter((k) => k !== "total")
    .sort((a, c) => (known.indexOf(a) + 1 || 99) - (known.indexOf(c) + 1 || 99));
  chart($("#chart-steps"), t, steps.map((k) => ({ values: b.map((x) => (x.steps_ms || {})[k] ?? null),
                                                   color: STEP_COLORS[k] || "#64748b" })), " ms");
  const legend = $("#steps-legend");
  legend.textContent = "";
  for (const k of steps) {
    const i = document.createElement("i");
    i.style.background = STEP_COLORS[k] || "#64748b";
    legend.append(i, k);
  }
}

// A small time chart on a canvas: bars (stacked on the previous series) or lines.
function chart(canvas, times, series, unit) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (!w || !h) return;
  canvas.width = w * dpr;
  canvas.height = h * dpr;
  const ctx = canvas.getContext("2d");
  ctx.scale(dpr, dpr);
  ctx.clearRect(0, 0, w, h);
  const padL = 40, padB = 18, padT = 6, padR = 6;
  const n = times.length;
  const stackedTop = times.map((_, k) => series.filter((s) => s.bars).reduce((a, s) => a + (s.values[k] || 0), 0));
  const peak = Math.max(1e-9, ...stackedTop, ...series.filter((s) => !s.bars).flatMap((s) => s.values.filter((v) => v !== null)));
  const top = niceCeil(peak);
  const x = (k) => padL + ((w - padL - padR) * k) / Math.max(1, n);
  const y = (v) => h - padB - ((h - padB - padT) * v) / top;
  ctx.font = "10.5px system-ui, sans-serif";
  ctx.fillStyle = "#6b7385";
  ctx.strokeStyle = "#eef1f5";
  ctx.lineWidth = 1;
  for (let g = 0; g <= 4; g++) {
    const v = (top * g) / 4;
    ctx.beginPath();
    ctx.moveTo(padL, y(v) + 0.5);
    ctx.lineTo(w - padR, y(v) + 0.5);
    ctx.stroke();
    ctx.textAlign = "right";
    ctx.fillText(fmtNum(v), padL - 6, y(v) + 3);
  }
  ctx.textAlign = "center";
  for (const [k, label] of [[0, `-${Math.round((times[n - 1] - times[0]) / 60)} min`], [n - 1, "now"]]) {
    ctx.fillText(label, Math.min(Math.max(x(k), padL + 16), w - 16), h - 4);
  }
  const base = new Array(n).fill(0);
  const bw = Math.max(1, (w - padL - padR) / Math.max(1, n) - 1);
  for (const s of series) {
    ctx.fillStyle = s.color;
    ctx.strokeStyle = s.color;
    if (s.bars) {
      s.values.forEach((v, k) => {
        if (!v) return;
        const y0 = y(base[k]), y1 = y(base[k] + v);
        ctx.fillRect(x(k), y1, bw, y0 - y1);
        base[k] += v;
      });
    } else {
      ctx.lineWidth = 1.8;
      ctx.beginPath();
      let down = false;
      s.values.forEach((v, k) => {
        if (v === null || v === undefined) { down = false; return; }
        const px = x(k) + bw / 2;
        if (down) ctx.lineTo(px, y(v)); else ctx.moveTo(px, y(v));
        down = true;
        ctx.fillRect(px - 1.5, y(v) - 1.5, 3, 3);
      });
      ctx.stroke();
    }
  }
}

// A round top for a 4-line grid: 4 x (1, 2, 2.5 or 5 x a power of ten).
function niceCeil(v) {
  const quarter = v / 4;
  const p = Math.pow(10, Math.floor(Math.log10(quarter)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= quarter) return 4 * m * p;
  return 40 * p;
}
function fmtNum(v) { return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1).replace(/\.0$/, "") : v.toFixed(2).replace(/\.?0+$/, ""); }

loadConfig();
showView(location.hash === "#live" ? "live" : "read");
