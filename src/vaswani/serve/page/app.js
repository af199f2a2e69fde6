// vaswani's page: use a loaded run, and look at its attention. Plain JavaScript, no library,
// nothing fetched from other hosts. With window.VASWANI_DATA set (the standalone file that
// `vaswani attention --out FILE.html` writes) only the explorer is shown, over that data.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const state = { models: [], model: null, view: null, pinned: null };

// --- talking to the server --------------------------------------------------------------
function headers() {
  const h = { "Content-Type": "application/json" };
  if ($("key").value) h.Authorization = "Bearer " + $("key").value;
  return h;
}

async function api(path, body) {
  const response = await fetch(path, body === undefined ? { headers: headers() }
    : { method: "POST", headers: headers(), body: JSON.stringify(body) });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error((data.error && data.error.message) || response.statusText);
  return data;
}

function showError(e) { $("error").textContent = e ? String(e.message || e) : ""; }

async function busy(button, work) {
  button.disabled = true; showError(null);
  try { await work(); } catch (e) { showError(e); } finally { button.disabled = false; }
}

// --- choosing a model ----------------------------------------------------------------------
async function loadModels() {
  const health = await api("/health");
  $("key-label").hidden = !health.auth;
  if (health.auth && !$("key").value) { showError("this server needs an API key"); return; }
  state.models = (await api("/v1/models")).data;
  $("model").replaceChildren(...state.models.map((m) => new Option(`${m.id} (${m.task})`, m.id)));
  chooseModel();
}

// Each model says what it does (its "action": the route the page calls), in a line for the
// page ("summary"), and whether the explorer can be given an output ("target").
const BUTTON = { translate: "Translate", generate: "Generate", classify: "Classify", embed: "Compare" };

function chooseModel() {
  state.model = state.models.find((m) => m.id === $("model").value) || state.models[0];
  if (!state.model) return;
  const action = state.model.action;
  $("task").textContent = state.model.summary;
  document.querySelectorAll("[data-action]").forEach((el) => { el.hidden = el.dataset.action !== action; });
  $("input2").hidden = $("input2-label").hidden = action !== "embed";
  $("target-label").hidden = !state.model.target;
  $("go").textContent = BUTTON[action] || "Run";
  $("output").replaceChildren();
}

// --- using it --------------------------------------------------------------------------------
function result(text, score) {
  const div = document.createElement("div");
  div.className = "result"; div.textContent = text;
  if (score !== undefined) {
    const s = document.createElement("span");
    s.className = "score"; s.textContent = score.toFixed(3); div.append(s);
  }
  return div;
}

function bars(probabilities) {
  return Object.entries(probabilities).sort((a, b) => b[1] - a[1]).map(([label, p]) => {
    const row = document.createElement("div"); row.className = "bar";
    const fill = document.createElement("div"); fill.className = "fill";
    fill.style.width = (100 * p).toFixed(1) + "%";
    const track = document.createElement("div"); track.append(fill);
    row.append(label, track, (100 * p).toFixed(1) + "%");
    return row;
  });
}

async function run() {
  const model = state.model.id, text = $("input").value, out = $("output");
  out.replaceChildren();
  const action = state.model.action;
  if (action === "translate") {
    const data = await api("/v1/translate", { model, input: text,
      beam: +$("beam").value, n_best: +$("nbest").value });
    out.append(...data.data[0].translations.map((t) => result(t.text, t.score)));
  } else if (action === "generate") {
    await stream(model, text, out);
  } else if (action === "classify") {
    const data = await api("/v1/classify", { model, input: text });
    out.append(...bars(data.data[0].probabilities));
  } else {
    const data = await api("/v1/embeddings", { model, input: [text, $("input2").value] });
    const [a, b] = data.data.map((d) => d.embedding);
    const cosine = a.reduce((s, x, i) => s + x * b[i], 0);
    out.append(result(`cosine similarity ${cosine.toFixed(4)}`));
  }
}

async function stream(model, prompt, out) {
  const body = { model, prompt, stream: true, max_tokens: +$("max-tokens").value,
    temperature: +$("temperature").value, seed: +$("seed").value };
  const response = await fetch("/v1/completions", { method: "POST", headers: headers(),
    body: JSON.stringify(body) });
  if (!response.ok) throw new Error(((await response.json()).error || {}).message || response.statusText);
  const box = result(prompt); box.id = "generated"; out.append(box);
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const events = buffer.split("\n\n"); buffer = events.pop();
    for (const event of events) {
      const data = event.replace(/^data: /, "");
      if (data === "[DONE]") return;
      box.textContent += JSON.parse(data).choices[0].text;
    }
  }
}

// --- the attention explorer -------------------------------------------------------------
const KIND_NAMES = { "encoder self-attention": "encoder self-attention",
  "decoder self-attention": "decoder self-attention", "cross-attention": "cross-attention",
  "self-attention": "self-attention" };

async function explore() {
  const body = { model: state.model.id, input: $("input").value };
  if (!$("target-label").hidden && $("target").value.trim()) body.target = $("target").value;
  showView(await api("/v1/attention", body));
}

function showView(view) {
  state.view = view; state.pinned = null;
  const kinds = Object.keys(view.attention);
  $("kind").replaceChildren(...kinds.map((k) => new Option(KIND_NAMES[k] || k, k)));
  $("kind").value = kinds.includes("cross-attention") ? "cross-attention" : kinds[0];
  $("explorer-controls").hidden = false;
  fillLayers();
  const probs = $("probabilities");
  probs.replaceChildren(...(view.probabilities || []).map((p) => {
    const span = document.createElement("span"); span.className = "prob";
    const b = document.createElement("b"); b.textContent = p.token;
    span.append(b, p.p === null ? "" : " " + (100 * p.p).toFixed(1) + "%");
    span.title = "the model's probability for this token";
    return span;
  }));
}

function fillLayers() {
  const a = state.view.attention[$("kind").value];
  const layer = $("layer").value, head = $("head").value;
  $("layer").replaceChildren(...[...Array(a.layers).keys()].map((i) => new Option(`${i}`, i)));
  $("head").replaceChildren(new Option("all (mean)", "mean"),
    ...[...Array(a.heads).keys()].map((i) => new Option(`${i}`, i)));
  $("layer").value = layer && +layer < a.layers ? layer : a.layers - 1;
  $("head").value = head && (head === "mean" || +head < a.heads) ? head : "mean";
  draw();
}

function matrix() {
  const a = state.view.attention[$("kind").value];
  const heads = a.weights[+$("layer").value];  // [H][Tq][Tk]
  if ($("head").value !== "mean") return heads[+$("head").value];
  return heads[0].map((row, q) => row.map((_, k) =>
    heads.reduce((s, h) => s + h[q][k], 0) / heads.length));
}

function draw() {
  if (!state.view) return;
  const a = state.view.attention[$("kind").value], w = matrix();
  const svg = $("view").value === "heatmap" ? heatmap(a, w) : lines(a, w);
  $("viz").replaceChildren(svg);
  highlight(state.pinned);
}

function token(svg, text, x, y, anchor, side, index) {
  const t = document.createElementNS(SVG, "text");
  t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("text-anchor", anchor);
  t.dataset.side = side; t.dataset.index = index; t.textContent = text;
  t.addEventListener("mouseenter", () => highlight({ side, index }));
  t.addEventListener("mouseleave", () => highlight(state.pinned));
  t.addEventListener("click", () => { state.pinned = { side, index }; highlight(state.pinned); });
  svg.append(t);
}

function lines(a, w) {
  const row = 20, width = 520, left = 150, right = width - 150;
  const height = row * Math.max(a.queries.length, a.keys.length) + 20;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", width); svg.setAttribute("height", height);
  svg.setAttribute("class", "lines");
  w.forEach((weights, q) => weights.forEach((p, k) => {
    if (p < 0.01) return;
    const l = document.createElementNS(SVG, "line");
    l.setAttribute("x1", left + 6); l.setAttribute("y1", 16 + q * row - 4);
    l.setAttribute("x2", right - 6); l.setAttribute("y2", 16 + k * row - 4);
    l.setAttribute("stroke", "#2f6fde"); l.setAttribute("stroke-width", 1 + 3 * p);
    l.dataset.q = q; l.dataset.k = k; l.dataset.p = p;
    l.setAttribute("stroke-opacity", p);
    svg.append(l);
  }));
  a.queries.forEach((t, q) => token(svg, t, left, 16 + q * row, "end", "q", q));
  a.keys.forEach((t, k) => token(svg, t, right, 16 + k * row, "start", "k", k));
  return svg;
}

function heatmap(a, w) {
  const cell = 22, left = 120, top = 90;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", left + cell * a.keys.length + 10);
  svg.setAttribute("height", top + cell * a.queries.length + 10);
  svg.setAttribute("class", "heatmap");
  w.forEach((weights, q) => weights.forEach((p, k) => {
    const r = document.createElementNS(SVG, "rect");
    r.setAttribute("x", left + k * cell); r.setAttribute("y", top + q * cell);
    r.setAttribute("width", cell - 1); r.setAttribute("height", cell - 1);
    r.setAttribute("fill", `rgba(47, 111, 222, ${Math.max(p, 0.02).toFixed(3)})`);
    r.dataset.q = q; r.dataset.k = k; r.dataset.p = p;
    const title = document.createElementNS(SVG, "title");
    title.textContent = `${a.queries[q]} → ${a.keys[k]}: ${(100 * p).toFixed(1)}%`;
    r.append(title); svg.append(r);
  }));
  a.queries.forEach((t, q) => token(svg, t, left - 6, top + q * cell + 15, "end", "q", q));
  a.keys.forEach((t, k) => {
    token(svg, t, 0, 0, "start", "k", k);
    svg.lastChild.setAttribute("transform",
      `translate(${left + k * cell + 15}, ${top - 6}) rotate(-60)`);
  });
  return svg;
}

function highlight(focus) {
  const svg = $("viz").firstChild;
  if (!svg) return;
  svg.querySelectorAll("text").forEach((t) => t.classList.toggle("active",
    !!focus && t.dataset.side === focus.side && +t.dataset.index === focus.index));
  svg.querySelectorAll("line, rect").forEach((el) => {
    const mine = !focus || +el.dataset[focus.side] === focus.index;
    const p = +el.dataset.p;
    if (el.tagName === "line") el.setAttribute("stroke-opacity", mine ? Math.max(p, focus ? 0.15 : 0) : 0.03);
    else el.setAttribute("opacity", mine ? 1 : 0.25);
  });
}

// --- start ---------------------------------------------------------------------------------
function start() {
  ["kind"].forEach((id) => $(id).addEventListener("change", fillLayers));
  ["layer", "head", "view"].forEach((id) => $(id).addEventListener("change", draw));
  if (window.VASWANI_DATA) {  // the standalone explorer: no server, the data is in the page
    $("use").hidden = true; $("model-label").hidden = true; $("explore").hidden = true;
    $("task").textContent = window.VASWANI_DATA.title || "";
    $("explorer-help").textContent = "Hover or click a token to see where it attends.";
    showView(window.VASWANI_DATA);
    return;
  }
  $("model").addEventListener("change", chooseModel);
  $("key").addEventListener("change", () => loadModels().catch(showError));
  $("go").addEventListener("click", () => busy($("go"), run));
  $("explore").addEventListener("click", () => busy($("explore"), explore));
  loadModels().catch(showError);
}

start();
