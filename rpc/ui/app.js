// The gpuplane dashboard: one call per refresh (DashboardService.Summary)
// returns what the page draws, and, given the revision of the page's last
// answer, only the cards, models and tenants that changed since; the page
// follows the residency controllers' decisions as they are recorded. It
// changes nothing. Only what changed is redrawn: a changed card's bar, a
// changed model's row, a cell whose text changed (a refresh with a
// thousand replicas and nothing new touches almost no DOM).
"use strict";

const $ = id => document.getElementById(id);
const REFRESH_MS = 2000;
const HOUR_S = 3600;
const P95_WINDOW_S = 300;
const RATE_WINDOW_S = 30;
const MAX_DECISIONS = 5000;
const SHOWN_DECISIONS = 300;

// stats is read by the browser tests and the benchmark: when the first
// render finished, how long each refresh took, and how many there were.
const stats = window.gpuplaneStats = {firstRenderMs: 0, lastRefreshMs: 0, fetchMs: 0, renderMs: 0, refreshes: 0, decisions: 0, bytes: 0};

const tokenInput = $("token");
tokenInput.value = localStorage.getItem("gpuplane-token") || "";
$("tokenform").addEventListener("submit", e => {
  e.preventDefault();
  localStorage.setItem("gpuplane-token", tokenInput.value);
  // Another token may see another cluster's worth: start over.
  revision = "0";
  followDecisions();
  refresh();
});

function authHeaders(contentType) {
  const h = {"Content-Type": contentType};
  if (tokenInput.value) h["Authorization"] = "Bearer " + tokenInput.value;
  return h;
}

async function call(service, method, body) {
  const resp = await fetch(`/gpuplane.v1.${service}/${method}`, {
    method: "POST", headers: authHeaders("application/json"), body: JSON.stringify(body || {})});
  const text = await resp.text();
  stats.bytes = text.length;
  let j = {};
  try { j = JSON.parse(text); } catch (e) { j = {message: text.slice(0, 200)}; }
  if (!resp.ok) {
    const err = new Error(resp.status === 401 ? tokenHint() : `${method}: ${j.message || resp.status}`);
    err.code = j.code;
    throw err;
  }
  return j;
}

// tokenHint is what the page says when the API wants a token: the API's
// own message names the CLI's flags, which a browser has not.
function tokenHint() {
  // Unless the user is busy elsewhere on the page (a filter, say).
  if (!document.activeElement || document.activeElement === document.body) tokenInput.focus();
  if (tokenInput.value) return "the token in the token box is not known to this cluster: paste another there and press use";
  return "this cluster runs with ACLs on: paste a token into the token box and press use (an admin makes one with 'gpuplane acl token create')";
}

const esc = s => String(s ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const num = x => Number(x || 0);
const mib = n => n >= 1024 ? `${(n / 1024).toFixed(1)}Gi` : `${n}Mi`;
const rfc3339 = t => t ? new Date(t).toISOString().replace(/\.\d+Z$/, "Z") : "";

// sizeWidths sizes the elements under el that carry a width in data-w
// (percent): the page's content security policy forbids style attributes
// in markup.
function sizeWidths(el) {
  if (el.dataset?.w) el.style.width = el.dataset.w + "%";
  for (const w of el.querySelectorAll("[data-w]")) w.style.width = w.dataset.w + "%";
}

// set replaces el's content when html differs from what it holds.
const shown = new WeakMap();
function set(el, html) {
  if (shown.get(el) === html) return false;
  shown.set(el, html);
  el.innerHTML = html;
  sizeWidths(el);
  return true;
}

function attr(el, name, value) {
  if (el.getAttribute(name) !== value) el.setAttribute(name, value);
}

const template = document.createElement("template");
function element(html) {
  template.innerHTML = html.trim();
  return template.content.firstElementChild;
}

// cells is a row's cells: text, or {html, attrs} for markup.
const cells = r => r.map(c => (typeof c === "object" && c !== null) ? `<td${c.attrs || ""}>${c.html}</td>`
  : `<td>${esc(c === undefined || c === "" ? "-" : c)}</td>`).join("");

function table(header, rows) {
  return "<thead><tr>" + header.map(x => `<th scope="col">${esc(x)}</th>`).join("") + "</tr></thead><tbody>" +
    rows.map(r => `<tr>${cells(r)}</tr>`).join("") + "</tbody>";
}

const LOADED = new Set(["Loading", "Resident", "Waking", "Draining"]);
const KIND_TEXT = {resident: "resident", lent: "asleep: its residual stays on the card, the rest of its reserved share is lent",
  host: "asleep: its residual stays on the card, the rest of its share is free",
  reserved: "reserved, not loaded", cold: "cold (on disk)", headroom: "headroom", free: "free"};

// ---- what the page holds: the answers so far, merged

let revision = "0";
const cards = new Map(); // "node/index" → DashboardCard
const models = new Map(); // name → DashboardModel
const tenants = new Map(); // name → DashboardTenant
let members = [];
let bounds = [];
let health = {};

// merge takes one Summary answer into the page's state and says what
// changed.
function merge(s) {
  const full = !!s.full;
  if (full) {
    cards.clear();
    models.clear();
    tenants.clear();
  }
  const changedCards = [], changedModels = [];
  for (const c of s.cards || []) {
    const k = `${c.node}/${num(c.index)}`;
    cards.set(k, c);
    changedCards.push(k);
  }
  for (const k of s.removedCards || []) {
    cards.delete(k);
    changedCards.push(k);
  }
  for (const m of s.models || []) {
    models.set(m.name, m);
    changedModels.push(m.name);
  }
  for (const n of s.removedModels || []) {
    models.delete(n);
    changedModels.push(n);
  }
  for (const t of s.tenants || []) tenants.set(t.name, t);
  for (const n of s.removedTenants || []) tenants.delete(n);
  if (s.members) members = s.members.members || [];
  bounds = s.ttftBounds || [];
  health = s.health || {};
  revision = s.revision || "0";
  return {full, changedCards, changedModels};
}

// ---- the gateway's counters over time

// A sample is the models' and tenants' counters at one refresh: the maps
// are copied, their entries (replaced when they change) are shared.
const samples = [];

function addSample(t) {
  const s = {t, models: new Map(models), tenants: new Map(tenants)};
  samples.push(s);
  while (samples.length > 2 && t - samples[1].t > P95_WINDOW_S * 1000) samples.shift();
  return s;
}

// p95Base is the sample the p95 and the tenants' shares count from: the
// oldest kept (about 5 minutes old once the page has been open that long);
// on the first refresh none, so the page opens on the figures since the
// node started.
function p95Base() {
  return samples.length > 1 ? samples[0] : null;
}
// rateBase is the sample a rate counts from: the oldest within the rate
// window and at least a second old (the page refreshes again 150 ms after
// a decision arrives; a rate over so short a span reads 0). None until
// then: the rate is being measured.
function rateBase(now) {
  for (const s of samples) if (s !== now && now.t - s.t <= RATE_WINDOW_S * 1000 && now.t - s.t >= 1000) return s;
  return null;
}

// quantile interpolates within the histogram's buckets as Prometheus's
// histogram_quantile does; the +Inf bucket holds every request.
function quantile(q, now, base) {
  const total = num(now?.requests) - num(base?.requests);
  if (!(total > 0)) return NaN;
  const nb = now.ttftBuckets || [], bb = base?.ttftBuckets || [];
  const rank = q * total;
  let prevLe = 0, prevC = 0;
  for (let i = 0; i < bounds.length; i++) {
    const c = num(nb[i]) - num(bb[i]);
    if (c >= rank) return prevLe + (bounds[i] - prevLe) * (c === prevC ? 0 : (rank - prevC) / (c - prevC));
    prevLe = bounds[i];
    prevC = c;
  }
  return prevLe;
}

// ---- decisions (followed live)

let decisions = [];
let decisionKeys = new Set();
let decisionState = "";
let decisionAbort = null;
// byModel indexes the decisions by deployment, for the timelines; a
// deployment's timeline is redrawn when it gets a new one.
let byModel = new Map();
let timelinesStale = true;
const staleTimelines = new Set();

const deploymentOf = id => { const i = (id || "").lastIndexOf("/"); return i < 0 ? id : id.slice(0, i); };

function indexDecision(d) {
  const name = deploymentOf(d.model);
  if (!byModel.has(name)) byModel.set(name, []);
  byModel.get(name).push(d);
  staleTimelines.add(name);
}

function addDecisions(ds) {
  for (const d of ds) {
    const k = `${d.node}#${d.seq}`;
    if (decisionKeys.has(k)) continue;
    decisionKeys.add(k);
    d.at = Date.parse(d.time);
    decisions.push(d);
    indexDecision(d);
  }
  if (decisions.length > MAX_DECISIONS) {
    decisions.sort((a, b) => a.at - b.at);
    for (const d of decisions.splice(0, decisions.length - MAX_DECISIONS)) decisionKeys.delete(`${d.node}#${d.seq}`);
    byModel = new Map();
    for (const d of decisions) indexDecision(d);
  }
  stats.decisions = decisions.length;
}

const sleep = ms => new Promise(r => setTimeout(r, ms));

// followDecisions reads ResidencyService.ListDecisions with follow over the
// Connect protocol's server streaming (enveloped JSON messages), and
// reconnects after an error.
async function followDecisions() {
  if (decisionAbort) decisionAbort.abort();
  const ctl = new AbortController();
  decisionAbort = ctl;
  decisions = [];
  decisionKeys = new Set();
  byModel = new Map();
  timelinesStale = true;
  while (!ctl.signal.aborted) {
    try {
      const body = new TextEncoder().encode(JSON.stringify({follow: true}));
      const frame = new Uint8Array(5 + body.length);
      new DataView(frame.buffer).setUint32(1, body.length);
      frame.set(body, 5);
      const h = authHeaders("application/connect+json");
      h["Connect-Protocol-Version"] = "1";
      const resp = await fetch("/gpuplane.v1.ResidencyService/ListDecisions", {method: "POST", headers: h, body: frame, signal: ctl.signal});
      if (!resp.ok) throw new Error(resp.status === 401 ? `decisions: ${tokenHint()}` : `decisions: HTTP ${resp.status}`);
      decisionState = "following";
      renderDecisions();
      const reader = resp.body.getReader();
      let buf = new Uint8Array(0);
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        const joined = new Uint8Array(buf.length + value.length);
        joined.set(buf);
        joined.set(value, buf.length);
        buf = joined;
        while (buf.length >= 5) {
          const len = new DataView(buf.buffer, buf.byteOffset).getUint32(1);
          if (buf.length < 5 + len) break;
          const flags = buf[0];
          const msg = JSON.parse(new TextDecoder().decode(buf.subarray(5, 5 + len)) || "{}");
          buf = buf.slice(5 + len);
          if (flags & 2) {
            if (msg.error) throw new Error(`decisions: ${msg.error.message || msg.error.code}`);
            continue;
          }
          addDecisions(msg.decisions || []);
          renderDecisions();
          soon();
        }
      }
      decisionState = "stream ended; reconnecting";
    } catch (e) {
      if (ctl.signal.aborted) return;
      decisionState = e.message;
    }
    renderDecisions();
    await sleep(REFRESH_MS);
  }
}

function renderDecisions() {
  const f = $("decisionfilter").value.trim().toLowerCase();
  const rows = [];
  for (let i = decisions.length - 1; i >= 0 && rows.length < SHOWN_DECISIONS; i--) {
    const d = decisions[i];
    const action = d.action + (d.advised ? " (advised)" : "");
    const cells = [rfc3339(d.time), d.node, d.card, action, d.model, d.trigger, d.reason];
    if (f && !cells.join(" ").toLowerCase().includes(f)) continue;
    rows.push(cells);
  }
  // Newest first, as they arrive (the stream is in order per node).
  rows.sort((a, b) => (a[0] < b[0] ? 1 : a[0] > b[0] ? -1 : 0));
  set($("decisiontable"), table(["TIME", "NODE", "CARD", "ACTION", "MODEL", "TRIGGER", "REASON"], rows));
  $("decisionstate").textContent = `${decisions.length} decisions · ${decisionState}`;
}

// ---- timeline of the last hour per deployment

const ACTION_AFTER = {load: "resident", prewarm: "resident", wake: "resident", sleep: "sleeping", evict: "cold", unload: "cold"};
const ACTION_BEFORE = {load: "cold", prewarm: "cold", wake: "sleeping", sleep: "resident", evict: "resident", unload: "resident"};
const stateOf = s => (LOADED.has(s) ? "resident" : s === "Sleeping" ? "sleeping" : "cold");

function timeline(name, reps, evsOfModel, now) {
  const from = now - HOUR_S * 1000;
  const rows = reps.slice(0, 4);
  const h = 10 / Math.max(1, rows.length);
  let svg = "";
  rows.forEach((r, i) => {
    const id = `${name}/${num(r.index)}`;
    const evs = evsOfModel.filter(d => d.model === id && !d.advised && d.at >= from);
    let t = from, state = evs.length ? (ACTION_BEFORE[evs[0].action] || stateOf(r.state)) : stateOf(r.state);
    const y = (i * h).toFixed(2);
    const rect = (a, b, s) => {
      if (b > a) svg += `<rect class="tl-${s}" x="${((a - from) / 1000).toFixed(0)}" y="${y}" width="${((b - a) / 1000).toFixed(0)}" height="${h.toFixed(2)}"></rect>`;
    };
    for (const d of evs) {
      const at = d.at;
      const next = ACTION_AFTER[d.action];
      if (!next) continue;
      rect(t, at, state);
      t = at;
      state = next;
      const x = ((at - from) / 1000).toFixed(0);
      const up = next === "resident";
      svg += `<path class="${up ? "tl-up" : "tl-down"}" d="M${x} ${up ? 10 : 0} l-30 ${up ? -5 : 5} h60 z"><title>${esc(rfc3339(d.time) + " " + d.action + " " + id + ": " + d.reason)}</title></path>`;
    }
    rect(t, now, evs.length ? state : stateOf(r.state));
  });
  return `<svg class="timeline" viewBox="0 0 ${HOUR_S} 10" preserveAspectRatio="none" role="img" aria-label="${esc(name)}: residency over the last hour">${svg}</svg>`;
}

// ---- refresh

let lastCommit = {index: -1, at: 0};
let refreshing = null;
let again = false;
let soonTimer = 0;

// soon refreshes shortly after a decision arrives, so that the residency
// it caused shows without waiting for the next period.
function soon() {
  if (soonTimer) return;
  soonTimer = setTimeout(() => { soonTimer = 0; refresh(); }, 150);
}

async function refresh() {
  if (refreshing) { again = true; return refreshing; }
  refreshing = (async () => {
    const started = performance.now();
    const status = $("status");
    try {
      await load();
      stats.lastRefreshMs = performance.now() - started;
      stats.refreshes++;
      if (!stats.firstRenderMs) stats.firstRenderMs = performance.now();
      document.body.dataset.refreshes = String(stats.refreshes);
      status.className = "";
      // When the page last refreshed and how often, apart from how long
      // the node took to answer.
      status.textContent = `updated ${new Date().toLocaleTimeString()} (every ${REFRESH_MS / 1000} s) · answered in ${stats.lastRefreshMs.toFixed(0)} ms`;
    } catch (e) {
      status.className = "error";
      status.textContent = e.message;
    }
  })();
  await refreshing;
  refreshing = null;
  if (again) { again = false; return refresh(); }
}

// While a replica is between states (loading, waking, draining: for about
// as long as its engine takes), the page asks again sooner, so that the
// state it reaches shows within a moment rather than at the next period.
const TRANSITIONAL = new Set(["Loading", "Waking", "Draining"]);
const QUICK_MS = 500;
const moving = new Set();
let quickTimer = 0;

function watchTransitions(changed) {
  for (const name of changed) {
    if ((models.get(name)?.replicas || []).some(r => TRANSITIONAL.has(r.state))) moving.add(name);
    else moving.delete(name);
  }
  if (moving.size && !quickTimer) quickTimer = setTimeout(() => { quickTimer = 0; refresh(); }, QUICK_MS);
}

async function load() {
  const started = performance.now();
  const s = await call("DashboardService", "Summary", {since: revision});
  const fetched = performance.now();
  const now = Date.now();
  const phase = {};
  let mark = performance.now();
  const lap = name => { const t = performance.now(); phase[name] = t - mark; mark = t; };
  const {full, changedCards, changedModels} = merge(s);
  if (full) moving.clear();
  watchTransitions(changedModels);
  const sample = addSample(now);
  lap("merge");
  renderHealth(now, s.planError || "");
  lap("health");
  renderCards(full, changedCards);
  lap("cards");
  renderModels(full, changedModels, sample, now);
  lap("models");
  renderTenants(sample);
  lap("tenants");
  stats.phases = phase;
  stats.fetchMs = fetched - started;
  stats.renderMs = performance.now() - fetched;
}

function renderHealth(now, planError) {
  const st = health;
  if (st.error) {
    set($("health-body"), `<p class="miss">${esc(st.error)}</p>`);
    return;
  }
  const commit = num(st.commitIndex);
  if (commit !== lastCommit.index) lastCommit = {index: commit, at: now};
  const ago = Math.round((now - lastCommit.at) / 1000);
  let h = `<div class="health">
    <span>leader <b id="h-leader">${esc(st.leader || "none")}</b></span>
    <span>term <b>${esc(st.term || 0)}</b></span>
    <span>last commit <b id="h-commit">${commit}</b> <span class="note">(${ago < 3 ? "just now" : `unchanged for ${ago} s`})</span></span>
    <span>applied here <b>${esc(st.appliedIndex || 0)}</b></span>
    <span>nodes <b>${num(st.nodesAlive)}/${num(st.nodes)}</b> alive</span>
    <span>answering <b>${esc(st.node || "")}</b> (${esc((st.raftState || "").toLowerCase() || "client")})</span></div>`;
  if (members.length) {
    h += `<div class="members" aria-label="members">` + members.slice(0, 200).map(m => {
      const down = m.status !== "alive";
      return `<span class="member${down ? " down" : ""}${m.leader ? " leader" : ""}" title="${esc(`${m.name} ${m.role} ${m.status} raft ${m.raft}`)}">${esc(m.name)}${m.leader ? " ★" : ""} <span class="note">${esc(m.role)}${down ? " " + esc(m.status) : ""}</span></span>`;
    }).join("") + (members.length > 200 ? `<span class="note">and ${members.length - 200} more</span>` : "") + `</div>`;
  }
  if (planError) h += `<p class="note">residency plans: ${esc(planError)}</p>`;
  set($("health-body"), h);
}

// ---- memory per card: one element per card, replaced when it changed

const cardEls = new Map(); // "node/index" → .card element
const nodeEls = new Map(); // node → .node element

function nodeHead(node, n) {
  return `<h3>${esc(node)} <span>${n} card${n === 1 ? "" : "s"}</span></h3>`;
}

function renderCards(full, changed) {
  const box = $("cards");
  if (full) {
    const groups = new Map();
    for (const k of [...cards.keys()].sort((a, b) => cardOrder(cards.get(a), cards.get(b)))) {
      const node = cards.get(k).node;
      if (!groups.has(node)) groups.set(node, []);
      groups.get(node).push(cardBar(cards.get(k)));
    }
    let html = "";
    for (const [node, bars] of groups) html += `<div class="node" data-node="${esc(node)}">${nodeHead(node, bars.length)}${bars.join("")}</div>`;
    box.innerHTML = html;
    sizeWidths(box);
    cardEls.clear();
    nodeEls.clear();
    for (const g of box.children) nodeEls.set(g.dataset.node, g);
    for (const el of box.querySelectorAll(".card")) cardEls.set(`${el.dataset.node}/${el.dataset.card}`, el);
    filterCards(cardEls.keys());
    return;
  }
  const touched = new Set();
  for (const k of changed) {
    const c = cards.get(k), old = cardEls.get(k);
    if (!c) {
      if (old) {
        touched.add(old.parentElement);
        old.remove();
        cardEls.delete(k);
      }
      continue;
    }
    const el = element(cardBar(c));
    if (old) old.replaceWith(el);
    else touched.add(insertCard(c, el));
    sizeWidths(el);
    cardEls.set(k, el);
  }
  for (const g of touched) {
    const n = g.querySelectorAll(".card").length;
    if (!n) {
      nodeEls.delete(g.dataset.node);
      g.remove();
    } else {
      g.querySelector("h3").outerHTML = nodeHead(g.dataset.node, n);
    }
  }
  filterCards(changed);
}

const cardOrder = (a, b) => a.node.localeCompare(b.node) || num(a.index) - num(b.index);

// insertCard puts a new card's element in its node's box (made when the
// node is new), in order, and returns the box.
function insertCard(c, el) {
  let g = nodeEls.get(c.node);
  if (!g) {
    g = element(`<div class="node" data-node="${esc(c.node)}">${nodeHead(c.node, 0)}</div>`);
    const after = [...nodeEls.keys()].filter(n => n.localeCompare(c.node) > 0).sort((a, b) => a.localeCompare(b))[0];
    $("cards").insertBefore(g, after ? nodeEls.get(after) : null);
    nodeEls.set(c.node, g);
  }
  const next = [...g.querySelectorAll(".card")].find(e => num(e.dataset.card) > num(c.index));
  g.insertBefore(el, next || null);
  return g;
}

// filterCards shows the cards among keys whose node or replicas match the
// filter box, and hides the others (and nodes left with none).
function filterCards(keys) {
  const f = $("cardfilter").value.trim().toLowerCase();
  const groups = new Set();
  for (const k of keys) {
    const el = cardEls.get(k), c = cards.get(k);
    if (!el || !c) continue;
    el.hidden = !!f && !c.node.toLowerCase().includes(f) && !(c.segments || []).some(s => s.replica.toLowerCase().includes(f));
    groups.add(el.parentElement);
  }
  for (const g of groups) g.hidden = !g.querySelector(".card:not([hidden])");
  let any = false;
  for (const el of cardEls.values()) if (!el.hidden) { any = true; break; }
  const note = $("nocards");
  note.hidden = any;
  note.textContent = cards.size ? "no cards match" : "no cards";
}

function cardBar(c) {
  const node = c.node, index = num(c.index), memory = num(c.memoryMib);
  const pct = m => (memory ? (100 * m / memory) : 0).toFixed(3);
  let segs = "", off = "";
  for (const s of c.segments || []) {
    const kind = s.kind, m = num(s.memoryMib);
    const tip = `${s.replica} (${s.residency}): ${KIND_TEXT[kind]}, ${mib(m)} (${m} MiB) on ${node} card ${index}; ${s.state || ""}${s.reason ? " — " + s.reason : ""}`;
    const data = `data-replica="${esc(s.replica)}" data-kind="${esc(kind)}" data-mib="${m}" data-state="${esc(s.state)}" title="${esc(tip)}"`;
    if (kind === "cold" || m === 0) off += `<button type="button" class="chip ${esc(kind)}" ${data}>${esc(s.replica)}</button>`;
    else segs += `<button type="button" class="seg ${esc(kind)}" data-w="${pct(m)}" ${data}>${esc(s.replica)} ${mib(m)}</button>`;
  }
  const free = num(c.freeMib), headroom = num(c.headroomMib);
  const seg = (kind, m, text, more) => {
    const tip = `${KIND_TEXT[kind]}: ${mib(m)} (${m} MiB) on ${node} card ${index}${more}`;
    return `<button type="button" class="seg ${kind}" data-kind="${kind}" data-mib="${m}" data-w="${pct(m)}" title="${esc(tip)}"${text ? "" : ` aria-label="${esc(tip)}"`}>${text}</button>`;
  };
  // One free figure, as `devices get` gives it: the headroom the
  // controller keeps unused is drawn apart inside it, and says so.
  if (headroom > 0) segs += seg("headroom", headroom, "", `, part of the ${mib(free)} free`);
  segs += seg("free", free - headroom, `free ${mib(free)}`, headroom > 0 ? ` (free ${mib(free)} in all, ${mib(headroom)} of it headroom)` : "");
  const used = num(c.usedMib), reserved = num(c.reservedMib), resident = num(c.residentMib), sleeping = num(c.sleepingMib);
  const label = `${node} card ${index}: ${mib(memory)}, used ${mib(used)}, reserved ${mib(reserved)}, resident ${mib(resident)}, sleeping ${mib(sleeping)}, free ${mib(free)}`;
  const sum = `${esc(c.accelerator || "unbound")}${c.pinnedOnly ? ' · <span class="miss">pinned-only after a ledger violation</span>' : ""} · reserved ${mib(reserved)} · resident ${mib(resident)} · sleeping ${mib(sleeping)} · free ${mib(free)}`;
  return `<div class="card" data-node="${esc(node)}" data-card="${index}" data-memory="${memory}" data-used="${used}" data-reserved="${reserved}" data-resident="${resident}" data-sleeping="${sleeping}" data-free="${free}">
    <span class="label">#${index} ${esc(c.device || "")}</span>
    <div><div class="bar" role="group" aria-label="${esc(label)}">${segs}</div>
    <div class="cardsum">${sum}</div>${off ? `<div class="offcard">${off}</div>` : ""}</div></div>`;
}

$("cards").addEventListener("click", e => {
  const b = e.target.closest("[data-kind]");
  if (!b) return;
  const d = $("detail");
  d.hidden = false;
  d.textContent = b.title;
});
$("cardfilter").addEventListener("input", () => filterCards(cardEls.keys()));
$("decisionfilter").addEventListener("input", renderDecisions);

// ---- models: one row per deployment; each cell written when its text
// changes, the timeline when the deployment or its decisions change (or
// once a minute, as its hour moves on)

const MODEL_HEADER = ["MODEL", "RESIDENCY", "STATE", "LAST HOUR", "REQ/S", "QUEUE", "P95 TTFT (5 MIN) / TARGET", "TOKENS/S", "REASON"];
const rows = new Map(); // name → {tr, td: [cells]}
let timelineEnd = 0;

function modelRow(name) {
  const tr = document.createElement("tr");
  tr.dataset.model = name;
  const td = [];
  for (let i = 0; i < MODEL_HEADER.length; i++) td.push(tr.insertCell());
  for (const i of [4, 5, 6, 7]) td[i].className = "num";
  td[8].className = "note";
  return {tr, td};
}

function renderModels(full, changed, sample, now) {
  const tbl = $("modeltable");
  if (!tbl.tBodies.length) set(tbl, table(MODEL_HEADER, []));
  const body = tbl.tBodies[0];
  if (full) {
    body.replaceChildren();
    rows.clear();
  }
  let added = false;
  for (const name of changed) {
    const m = models.get(name);
    let row = rows.get(name);
    if (!m) {
      if (row) {
        row.tr.remove();
        rows.delete(name);
      }
      continue;
    }
    if (!row) {
      row = modelRow(name);
      rows.set(name, row);
      added = true;
    }
    drawModel(row, m);
    staleTimelines.add(name);
  }
  if (added) for (const name of [...rows.keys()].sort()) body.appendChild(rows.get(name).tr);

  // The timelines end at the next whole minute: they are redrawn once a
  // minute, or when a decision or the deployment changes them, rather
  // than at every refresh.
  const end = Math.ceil(now / 60000) * 60000;
  if (end !== timelineEnd || timelinesStale) {
    timelineEnd = end;
    timelinesStale = false;
    for (const name of rows.keys()) staleTimelines.add(name);
  }
  for (const name of staleTimelines) {
    const row = rows.get(name), m = models.get(name);
    if (!row || !m) continue;
    const evs = (byModel.get(name) || []).sort((a, b) => a.at - b.at);
    const reps = [...(m.replicas || [])].sort((a, b) => num(a.index) - num(b.index));
    set(row.td[3], timeline(name, reps, evs, end));
  }
  staleTimelines.clear();

  const base = p95Base();
  const rb = rateBase(sample);
  const dt = rb ? (sample.t - rb.t) / 1000 : 0;
  for (const [name, row] of rows) drawFigures(row, models.get(name), base?.models.get(name), rb?.models.get(name), rb, dt);
}

// drawModel writes what a deployment's own answer says: its name,
// residency and priority, its replicas' state and its reason.
function drawModel(row, m) {
  const served = m.servedModelName || m.name;
  set(row.td[0], `<b>${esc(m.name)}</b>${served !== m.name ? ` <span class="note">${esc(served)}</span>` : ""}`);
  // A best-effort model (its card cannot hold every model with demand)
  // is marked, with why in numbers on hover and in the reason column.
  set(row.td[1], esc(`${m.residency} · ${m.priority}`) +
    (m.bestEffort ? ` · <span class="besteffort" title="${esc(m.bestEffort)}">best-effort</span>` : ""));
  attr(row.td[1], "data-best-effort", m.bestEffort ? "true" : "false");
  const states = {};
  const reps = m.replicas || [];
  for (const r of reps) states[r.state] = (states[r.state] || 0) + 1;
  const state = Object.entries(states).map(([s, n]) => (reps.length > 1 ? `${s}×${n}` : s)).join(" ") || "-";
  const main = Object.keys(states)[0] || "";
  set(row.td[2], esc(state));
  attr(row.td[2], "class", `state-${main}`);
  attr(row.td[2], "data-state", state);
  set(row.td[8], esc(m.reason || (m.bestEffort ? "best-effort: " + m.bestEffort : "")));
}

// drawFigures writes the figures taken from the gateway's counters: they
// move with the windows even when the answer did not change.
function drawFigures(row, m, base, rateFrom, rb, dt) {
  const p95 = quantile(0.95, m, base) * 1000;
  const target = num(m.ttftTargetMs);
  const missed = target > 0 && p95 > target;
  const ttftText = isNaN(p95) ? "-" : `${p95.toFixed(0)} ms`;
  const ttftLabel = `p95 TTFT ${ttftText}${target ? `, target ${target} ms${isNaN(p95) ? "" : missed ? ", missed" : ", met"}` : ", no target"}`;
  const rate = rb ? (num(m.requests) - num(rateFrom?.requests)) / dt : NaN;
  const tps = rb ? (num(m.tokens) - num(rateFrom?.tokens)) / dt : NaN;
  const planned = m.plannedRatePerMinute;
  // A rate needs two samples of the counters: until then it is being
  // measured (the controller's estimate, where it has one), never a 0.
  const measuring = `<span class="note">measuring…</span>`;
  set(row.td[4], isNaN(rate) ? (planned !== undefined ? `${(num(planned) / 60).toFixed(2)} <span class="note">est.</span>` : measuring) : rate.toFixed(2));
  set(row.td[5], String(num(m.queued)));
  const td = row.td[6];
  set(td, `${ttftText}${target ? ` / ${target} ms` : ""}`);
  attr(td, "class", `num ttft${missed ? " miss" : target && !isNaN(p95) ? " ok" : ""}`);
  attr(td, "data-missed", String(missed));
  attr(td, "aria-label", ttftLabel);
  attr(td, "title", ttftLabel);
  set(row.td[7], isNaN(tps) ? measuring : tps.toFixed(1));
}

function renderTenants(sample) {
  const base = p95Base();
  const served = {};
  let total = 0, wtotal = 0;
  for (const [name, t] of sample.tenants) {
    served[name] = num(t.tokens) - num(base?.tenants.get(name)?.tokens);
    total += served[name];
    wtotal += num(t.weight) || 1;
  }
  const rows = [...sample.tenants.keys()].sort().map(name => {
    const w = num(sample.tenants.get(name).weight) || 1;
    const share = total ? served[name] / total : 0;
    const wshare = w / wtotal;
    return [name, String(w), String(served[name]),
      {html: `<span class="sharebar" data-w="${(share * 60).toFixed(1)}"></span> ${(share * 100).toFixed(1)}%`, attrs: ` aria-label="${esc(`${name} served ${(share * 100).toFixed(1)}% of tokens`)}"`},
      {html: `<span class="sharebar weight" data-w="${(wshare * 60).toFixed(1)}"></span> ${(wshare * 100).toFixed(1)}%`, attrs: ` aria-label="${esc(`${name} weight share ${(wshare * 100).toFixed(1)}%`)}"`}];
  });
  set($("tenanttable"), rows.length ? table(["TENANT", "WEIGHT", "TOKENS", "SHARE OF SERVICE", "SHARE OF WEIGHT"], rows)
    : `<tbody><tr><td class="note">no requests through this node's gateway yet</td></tr></tbody>`);
}

followDecisions();
refresh();
setInterval(refresh, REFRESH_MS);
