// The gpuplane dashboard: reads the Connect JSON API the CLI uses, this
// node's /metrics, and follows the residency controllers' decisions. It
// changes nothing. Sections are rendered as HTML strings and replaced only
// when their text changes, so a refresh that finds nothing new touches no
// DOM (this keeps a refresh cheap with a thousand replicas).
"use strict";

const $ = id => document.getElementById(id);
const REFRESH_MS = 2000;
const HOUR_S = 3600;
const P95_WINDOW_S = 300;
const RATE_WINDOW_S = 30;
const MAX_DECISIONS = 5000;
const SHOWN_DECISIONS = 300;
// The page reads the answering node's state without confirming it with the
// leader (--stale): a view that refreshes every 2 s needs no linearizable
// read, and a follower answers it without a round trip to the leader.
const STALE = {stale: true};

// stats is read by the browser tests and the benchmark: when the first
// render finished, how long each refresh took, and how many there were.
const stats = window.gpuplaneStats = {firstRenderMs: 0, lastRefreshMs: 0, fetchMs: 0, renderMs: 0, refreshes: 0, decisions: 0};

const tokenInput = $("token");
tokenInput.value = localStorage.getItem("gpuplane-token") || "";
$("tokenform").addEventListener("submit", e => {
  e.preventDefault();
  localStorage.setItem("gpuplane-token", tokenInput.value);
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
  let j = {};
  try { j = JSON.parse(text); } catch (e) { j = {message: text.slice(0, 200)}; }
  if (!resp.ok) {
    const err = new Error(`${method}: ${j.message || resp.status}`);
    err.code = j.code;
    throw err;
  }
  return j;
}

const esc = s => String(s ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const num = x => Number(x || 0);
const word = (s, prefix) => (s || "").replace(prefix, "").toLowerCase();
const cap = s => s ? s.charAt(0).toUpperCase() + s.slice(1) : s;
const mib = n => n >= 1024 ? `${(n / 1024).toFixed(1)}Gi` : `${n}Mi`;
const rfc3339 = t => t ? new Date(t).toISOString().replace(/\.\d+Z$/, "Z") : "";

// set replaces el's content when html differs from what it holds, then
// sizes the elements that carry a width in data-w (percent): the page's
// content security policy forbids style attributes in markup.
const shown = new WeakMap();
function set(el, html) {
  if (shown.get(el) === html) return false;
  shown.set(el, html);
  el.innerHTML = html;
  for (const w of el.querySelectorAll("[data-w]")) w.style.width = w.dataset.w + "%";
  return true;
}

// cells is a row's cells: text, or {html, attrs} for markup.
const cells = r => r.map(c => (typeof c === "object" && c !== null) ? `<td${c.attrs || ""}>${c.html}</td>`
  : `<td>${esc(c === undefined || c === "" ? "-" : c)}</td>`).join("");

function table(header, rows) {
  return "<thead><tr>" + header.map(x => `<th scope="col">${esc(x)}</th>`).join("") + "</tr></thead><tbody>" +
    rows.map(r => `<tr>${cells(r)}</tr>`).join("") + "</tbody>";
}

// ---- residency vocabulary

const residencyName = r => ({RESIDENCY_WARM: "warm", RESIDENCY_ON_DEMAND: "onDemand"}[r] || "pinned");
const replicaResidency = r => cap(word(r, "REPLICA_RESIDENCY_").replace("unspecified", ""));
const LOADED = new Set(["Loading", "Resident", "Waking", "Draining"]);

// segmentKind is what a replica's share is on its card, counted the way
// `devices get` counts: loaded shares are RESIDENT, asleep ones SLEEPING
// (still on the card, lent while asleep, when reserved; only in host RAM
// when onDemand), reserved shares not loaded are used but not resident.
function segmentKind(rep, spec) {
  const state = replicaResidency(rep.residency);
  const reserves = residencyName(spec?.residency) !== "onDemand";
  if (LOADED.has(state)) return "resident";
  if (state === "Sleeping") return reserves ? "lent" : "host";
  return reserves ? "reserved" : "cold";
}
const KIND_TEXT = {resident: "resident", lent: "asleep in host RAM; its reserved share is lent", host: "asleep in host RAM",
  reserved: "reserved, not loaded", cold: "cold (on disk)", headroom: "headroom", free: "free"};

// ---- metrics from /metrics (this node's gateway)

const samples = [];

// label reads one label's value from a series' label text (the part
// between the braces); Prometheus escapes only backslash, quote and newline.
function label(ls, name) {
  const i = ls.indexOf(name + '="');
  if (i < 0 || (i > 0 && ls[i - 1] !== ",")) return i < 0 ? "" : label(ls.slice(i + 1), name);
  let v = "";
  for (let j = i + name.length + 2; j < ls.length; j++) {
    const c = ls[j];
    if (c === "\\") { v += ls[++j] === "n" ? "\n" : ls[j]; continue; }
    if (c === '"') break;
    v += c;
  }
  return v;
}

// parseMetrics reads the gateway's series from /metrics text. It looks at
// each line's name before anything else: a node's /metrics holds
// thousands of lines, most of them buckets.
function parseMetrics(text, t) {
  const s = {t, ttft: {}, count: {}, tokens: {}, tenantTokens: {}, queue: {}, weights: {}};
  let at = 0;
  for (;;) {
    const i = text.indexOf("\ngpuplane_gateway_", at);
    if (i < 0) break;
    const end = text.indexOf("\n", i + 1);
    const line = text.slice(i + 1, end < 0 ? text.length : end);
    at = end < 0 ? text.length : end;
    const open = line.indexOf("{"), close = line.lastIndexOf("}");
    const name = open < 0 ? line.slice(0, line.indexOf(" ")) : line.slice(0, open);
    const ls = open < 0 ? "" : line.slice(open + 1, close);
    const v = Number(line.slice((close < 0 ? line.indexOf(" ") : close + 1)).trim().split(" ")[0]);
    switch (name) {
      case "gpuplane_gateway_ttft_seconds_bucket": {
        const model = label(ls, "model"), le = label(ls, "le");
        const b = s.ttft[model] ||= {};
        b[le] = (b[le] || 0) + v;
        break;
      }
      case "gpuplane_gateway_ttft_seconds_count": {
        const model = label(ls, "model");
        s.count[model] = (s.count[model] || 0) + v;
        break;
      }
      case "gpuplane_gateway_tokens_total": {
        const model = label(ls, "model"), tenant = label(ls, "tenant");
        s.tokens[model] = (s.tokens[model] || 0) + v;
        s.tenantTokens[tenant] = (s.tenantTokens[tenant] || 0) + v;
        break;
      }
      case "gpuplane_gateway_queue_depth": {
        const r = label(ls, "replica");
        s.queue[r] = (s.queue[r] || 0) + v;
        break;
      }
      case "gpuplane_gateway_tenant_weight": s.weights[label(ls, "tenant")] = v; break;
    }
  }
  return s;
}

function addSample(s) {
  samples.push(s);
  while (samples.length > 2 && s.t - samples[1].t > P95_WINDOW_S * 1000) samples.shift();
}

// p95Base is the sample the p95 and the tenants' shares count from: the
// oldest kept (about 5 minutes old once the page has been open that long);
// on the first refresh none, so the page opens on the figures since the
// node started.
function p95Base() {
  return samples.length > 1 ? samples[0] : null;
}
function rateBase(now) {
  for (const s of samples) if (s !== now && now.t - s.t <= RATE_WINDOW_S * 1000) return s;
  return null;
}

// quantile interpolates within the histogram's buckets as Prometheus's
// histogram_quantile does.
function quantile(q, now, base) {
  if (!now) return NaN;
  const les = Object.keys(now).sort((a, b) => (a === "+Inf" ? Infinity : Number(a)) - (b === "+Inf" ? Infinity : Number(b)));
  const cum = les.map(le => (now[le] || 0) - (base?.[le] || 0));
  const total = cum[cum.length - 1];
  if (!(total > 0)) return NaN;
  const rank = q * total;
  let prevLe = 0, prevC = 0;
  for (let i = 0; i < les.length; i++) {
    if (cum[i] >= rank) {
      if (les[i] === "+Inf") return prevLe;
      const le = Number(les[i]);
      return prevLe + (le - prevLe) * (cum[i] === prevC ? 0 : (rank - prevC) / (cum[i] - prevC));
    }
    prevLe = les[i] === "+Inf" ? prevLe : Number(les[i]);
    prevC = cum[i];
  }
  return prevLe;
}

// ---- decisions (followed live)

let decisions = [];
let decisionKeys = new Set();
let decisionState = "";
let decisionAbort = null;

function addDecisions(ds) {
  for (const d of ds) {
    const k = `${d.node}#${d.seq}`;
    if (decisionKeys.has(k)) continue;
    decisionKeys.add(k);
    d.at = Date.parse(d.time);
    decisions.push(d);
  }
  if (decisions.length > MAX_DECISIONS) {
    decisions.sort((a, b) => a.at - b.at);
    for (const d of decisions.splice(0, decisions.length - MAX_DECISIONS)) decisionKeys.delete(`${d.node}#${d.seq}`);
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
  while (!ctl.signal.aborted) {
    try {
      const body = new TextEncoder().encode(JSON.stringify({follow: true}));
      const frame = new Uint8Array(5 + body.length);
      new DataView(frame.buffer).setUint32(1, body.length);
      frame.set(body, 5);
      const h = authHeaders("application/connect+json");
      h["Connect-Protocol-Version"] = "1";
      const resp = await fetch("/gpuplane.v1.ResidencyService/ListDecisions", {method: "POST", headers: h, body: frame, signal: ctl.signal});
      if (!resp.ok) throw new Error(`decisions: HTTP ${resp.status}`);
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
const stateOf = r => {
  const s = replicaResidency(r.residency);
  if (LOADED.has(s)) return "resident";
  if (s === "Sleeping") return "sleeping";
  return "cold";
};

function timeline(name, reps, byReplica, now) {
  const from = now - HOUR_S * 1000;
  const rows = reps.slice(0, 4);
  const h = 10 / Math.max(1, rows.length);
  let svg = "";
  rows.forEach((r, i) => {
    const id = `${name}/${r.index || 0}`;
    const evs = (byReplica.get(id) || []).filter(d => !d.advised && d.at >= from);
    let t = from, state = evs.length ? (ACTION_BEFORE[evs[0].action] || stateOf(r)) : stateOf(r);
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
    rect(t, now, evs.length ? state : stateOf(r));
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
      status.textContent = `updated ${new Date().toLocaleTimeString()} · refresh ${stats.lastRefreshMs.toFixed(0)} ms`;
    } catch (e) {
      status.className = "error";
      status.textContent = e.message;
    }
  })();
  await refreshing;
  refreshing = null;
  if (again) { again = false; return refresh(); }
}

async function load() {
  const started = performance.now();
  const [nodes, devs, models, reps, plan, st, members, metricsText] = await Promise.all([
    call("NodeService", "ListNodes", STALE), call("DeviceService", "ListDevices", STALE),
    call("ModelService", "ListModels", STALE), call("ModelService", "ListReplicas", STALE),
    call("ResidencyService", "GetPlan").catch(e => ({error: e.message})),
    call("ClusterService", "Status").catch(e => ({error: e.message})),
    call("ClusterService", "Members").catch(e => ({error: e.message})),
    fetch("/metrics").then(r => (r.ok ? r.text() : "")).catch(() => "")]);
  const devices = await Promise.all((devs.devices || []).map(d => call("DeviceService", "GetDevice", {name: d.name, stale: true})));
  const fetched = performance.now();
  const now = Date.now();
  const phase = {};
  let mark = performance.now();
  const lap = name => { const t = performance.now(); phase[name] = t - mark; mark = t; };
  const sample = parseMetrics(metricsText, now);
  addSample(sample);
  lap("metrics");

  const specs = new Map((models.models || []).map(m => [m.name, m.spec || {}]));
  const modelStatus = new Map((models.models || []).map(m => [m.name, m.status || {}]));
  const replicas = new Map();
  const byModel = new Map();
  for (const r of reps.replicas || []) {
    replicas.set(`${r.model}/${r.index || 0}`, r);
    if (!byModel.has(r.model)) byModel.set(r.model, []);
    byModel.get(r.model).push(r);
  }
  lap("index");
  renderHealth(nodes, st, members, now);
  lap("health");
  renderCards(devices, replicas, specs, plan);
  lap("cards");
  renderModels(models.models || [], byModel, specs, modelStatus, sample, plan, now);
  lap("models");
  renderTenants(sample);
  lap("tenants");
  stats.phases = phase;
  stats.fetchMs = fetched - started;
  stats.renderMs = performance.now() - fetched;
}

function renderHealth(nodes, st, members, now) {
  if (st.error) {
    set($("health-body"), `<p class="miss">${esc(st.error)}</p>`);
    return;
  }
  const commit = num(st.commitIndex);
  if (commit !== lastCommit.index) lastCommit = {index: commit, at: now};
  const ago = Math.round((now - lastCommit.at) / 1000);
  const ns = nodes.nodes || [];
  const up = ns.filter(n => n.status === "NODE_STATUS_ALIVE").length;
  const ms = members.members || [];
  let h = `<div class="health">
    <span>leader <b id="h-leader">${esc(st.leader || "none")}</b></span>
    <span>term <b>${esc(st.term || 0)}</b></span>
    <span>last commit <b id="h-commit">${commit}</b> <span class="note">(${ago < 3 ? "just now" : `unchanged for ${ago} s`})</span></span>
    <span>applied here <b>${esc(st.appliedIndex || 0)}</b></span>
    <span>nodes <b>${up}/${ns.length}</b> alive</span>
    <span>answering <b>${esc(st.node || "")}</b> (${esc(word(st.raftState || "", "") || "client")})</span></div>`;
  if (ms.length) {
    h += `<div class="members" aria-label="members">` + ms.slice(0, 200).map(m => {
      const down = m.status !== "alive";
      return `<span class="member${down ? " down" : ""}${m.leader ? " leader" : ""}" title="${esc(`${m.name} ${m.role} ${m.status} raft ${m.raft}`)}">${esc(m.name)}${m.leader ? " ★" : ""} <span class="note">${esc(m.role)}${down ? " " + esc(m.status) : ""}</span></span>`;
    }).join("") + (ms.length > 200 ? `<span class="note">and ${ms.length - 200} more</span>` : "") + `</div>`;
  }
  set($("health-body"), h);
}

function renderCards(devices, replicas, specs, plan) {
  const f = $("cardfilter").value.trim().toLowerCase();
  const plans = new Map();
  for (const c of plan.cards || []) plans.set(`${c.node}/${c.card}`, c);
  const nodes = new Map();
  for (const dev of devices) {
    for (const c of dev.cards || []) {
      if (!nodes.has(c.node)) nodes.set(c.node, []);
      nodes.get(c.node).push({c, dev: dev.device || {}});
    }
  }
  const parts = [];
  for (const [node, cards] of [...nodes].sort((a, b) => a[0].localeCompare(b[0]))) {
    cards.sort((a, b) => num(a.c.index) - num(b.c.index));
    let body = "";
    for (const {c, dev} of cards) {
      const names = c.replicas || [];
      if (f && !node.toLowerCase().includes(f) && !names.some(n => n.toLowerCase().includes(f))) continue;
      body += cardBar(node, c, dev, names, replicas, specs, plans.get(`${node}/${num(c.index)}`) || plans.get(`${node}/${c.uuid}`));
    }
    if (body) parts.push([node, `<h3>${esc(node)} <span>${cards.length} card${cards.length === 1 ? "" : "s"}</span></h3>${body}`]);
  }
  // One box per node, each redrawn only when its own cards changed: a
  // change on one card of a large cluster redraws one node.
  const box = $("cards");
  const keys = parts.map(p => p[0]).join("\n");
  if (box.dataset.nodes !== keys || !parts.length) {
    shown.delete(box);
    box.replaceChildren();
    box.dataset.nodes = keys;
    for (const [node] of parts) {
      const d = document.createElement("div");
      d.className = "node";
      d.dataset.node = node;
      box.appendChild(d);
    }
    if (!parts.length) set(box, `<p class="note">no cards${f ? " match" : ""}</p>`);
  }
  parts.forEach(([, html], i) => set(box.children[i], html));
}

function cardBar(node, c, dev, names, replicas, specs, plan) {
  const memory = num(c.memoryMib);
  const pct = m => (memory ? (100 * m / memory) : 0).toFixed(3);
  let segs = "", off = "";
  const sums = {resident: 0, lent: 0, host: 0, reserved: 0};
  for (const id of names) {
    const r = replicas.get(id) || {model: id.split("/")[0]};
    const spec = specs.get(r.model);
    const kind = segmentKind(r, spec);
    const m = num(r.memoryMib);
    if (kind in sums) sums[kind] += m;
    const state = replicaResidency(r.residency) || cap(word(r.state, "REPLICA_STATE_"));
    const tip = `${id} (${residencyName(spec?.residency)}): ${KIND_TEXT[kind]}, ${mib(m)} (${m} MiB) on ${node} card ${num(c.index)}; ${state}${r.residencyReason ? " — " + r.residencyReason : ""}`;
    const data = `data-replica="${esc(id)}" data-kind="${kind}" data-mib="${m}" data-state="${esc(state)}" title="${esc(tip)}"`;
    if (kind === "host" || kind === "cold") off += `<button type="button" class="chip ${kind}" ${data}>${esc(id)}</button>`;
    else segs += `<button type="button" class="seg ${kind}" data-w="${pct(m)}" ${data}>${esc(id)} ${mib(m)}</button>`;
  }
  const free = num(c.freeMib);
  let headroom = 0;
  if (plan) headroom = Math.min(free, Math.max(0, memory - Math.round(num(plan.usableBytes) / 1048576)));
  const seg = (kind, m, text) => {
    const tip = `${KIND_TEXT[kind]}: ${mib(m)} (${m} MiB) on ${node} card ${num(c.index)}`;
    return `<button type="button" class="seg ${kind}" data-kind="${kind}" data-mib="${m}" data-w="${pct(m)}" title="${esc(tip)}"${text ? "" : ` aria-label="${esc(tip)}"`}>${text}</button>`;
  };
  if (headroom > 0) segs += seg("headroom", headroom, "");
  segs += seg("free", free - headroom, `free ${mib(free - headroom)}`);
  const label = `${node} card ${num(c.index)}: ${mib(memory)}, used ${mib(num(c.usedMib))}, reserved ${mib(num(c.reservedMib))}, resident ${mib(num(c.residentMib))}, sleeping ${mib(num(c.sleepingMib))}, free ${mib(free)}`;
  const sum = `${esc(c.accelerator || "unbound")}${plan?.pinnedOnly ? ' · <span class="miss">pinned-only after a ledger violation</span>' : ""} · reserved ${mib(num(c.reservedMib))} · resident ${mib(num(c.residentMib))} · sleeping ${mib(num(c.sleepingMib))} · free ${mib(free)}`;
  return `<div class="card" data-node="${esc(node)}" data-card="${num(c.index)}" data-memory="${memory}" data-used="${num(c.usedMib)}" data-reserved="${num(c.reservedMib)}" data-resident="${num(c.residentMib)}" data-sleeping="${num(c.sleepingMib)}" data-free="${free}">
    <span class="label">#${num(c.index)} ${esc(dev.name || "")}</span>
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
$("cardfilter").addEventListener("input", () => refresh());
$("decisionfilter").addEventListener("input", renderDecisions);

function renderModels(models, byModel, specs, modelStatus, sample, plan, now) {
  const base = p95Base();
  const rb = rateBase(sample);
  const dt = rb ? (sample.t - rb.t) / 1000 : 0;
  const planRate = new Map();
  for (const c of plan.cards || []) for (const e of c.entries || []) {
    const name = (e.model || "").split("/")[0];
    planRate.set(name, (planRate.get(name) || 0) + num(e.ratePerMinute));
  }
  const byReplica = new Map();
  for (const d of decisions) {
    if (!byReplica.has(d.model)) byReplica.set(d.model, []);
    byReplica.get(d.model).push(d);
  }
  for (const evs of byReplica.values()) evs.sort((a, b) => a.at - b.at);
  const queues = new Map();
  for (const [k, v] of Object.entries(sample.queue)) {
    const name = k.slice(0, k.lastIndexOf("/"));
    queues.set(name, (queues.get(name) || 0) + v);
  }
  // The timelines end at the next whole minute: they are redrawn once a
  // minute, or when a decision changes them, rather than at every refresh.
  const end = Math.ceil(now / 60000) * 60000;
  const rows = [];
  const names = [];
  for (const m of [...models].sort((a, b) => a.name.localeCompare(b.name))) {
    const spec = m.spec || {};
    const served = spec.servedModelName || m.name;
    const reps = (byModel.get(m.name) || []).sort((a, b) => num(a.index) - num(b.index));
    const states = {};
    for (const r of reps) {
      const s = replicaResidency(r.residency) || cap(word(r.state, "REPLICA_STATE_"));
      states[s] = (states[s] || 0) + 1;
    }
    const state = Object.entries(states).map(([s, n]) => (reps.length > 1 ? `${s}×${n}` : s)).join(" ") || "-";
    const main = Object.keys(states)[0] || "";
    const queue = queues.get(m.name) || 0;
    const p95 = quantile(0.95, sample.ttft[served], base?.ttft[served]) * 1000;
    const target = num(spec.slo?.ttftMs);
    const missed = target > 0 && p95 > target;
    const ttftText = isNaN(p95) ? "-" : `${p95.toFixed(0)} ms`;
    const ttftLabel = `p95 TTFT ${ttftText}${target ? `, target ${target} ms${isNaN(p95) ? "" : missed ? ", missed" : ", met"}` : ", no target"}`;
    const rate = rb ? (num(sample.count[served]) - num(rb.count[served])) / dt : NaN;
    const tps = rb ? (num(sample.tokens[served]) - num(rb.tokens[served])) / dt : NaN;
    const pr = planRate.get(m.name);
    rows.push([
      {html: `<b>${esc(m.name)}</b>${served !== m.name ? ` <span class="note">${esc(served)}</span>` : ""}`},
      `${residencyName(spec.residency)} · ${word(spec.priority, "PRIORITY_").replace("unspecified", "") || "standard"}`,
      {html: esc(state), attrs: ` class="state-${esc(main)}" data-state="${esc(state)}"`},
      {html: timeline(m.name, reps, byReplica, end)},
      {html: isNaN(rate) ? (pr !== undefined ? `${(pr / 60).toFixed(2)} <span class="note">est.</span>` : "-") : rate.toFixed(2), attrs: ' class="num"'},
      {html: String(queue), attrs: ' class="num"'},
      {html: `${ttftText}${target ? ` / ${target} ms` : ""}`, attrs: ` class="num ttft${missed ? " miss" : target && !isNaN(p95) ? " ok" : ""}" data-missed="${missed}" aria-label="${esc(ttftLabel)}" title="${esc(ttftLabel)}"`},
      {html: isNaN(tps) ? "-" : tps.toFixed(1), attrs: ' class="num"'},
      {html: esc(modelStatus.get(m.name)?.reason || ""), attrs: ' class="note"'},
    ]);
    names.push(m.name);
  }
  keyedRows($("modeltable"), ["MODEL", "RESIDENCY", "STATE", "LAST HOUR", "REQ/S", "QUEUE", "P95 TTFT (5 MIN) / TARGET", "TOKENS/S", "REASON"],
    names, rows, "model");
}

// keyedRows draws a table with one row per key, each row redrawn only when
// its own cells changed (most models are idle between two refreshes).
function keyedRows(tbl, header, keys, rows, attr) {
  if (!tbl.tBodies.length) set(tbl, table(header, []));
  const body = tbl.tBodies[0];
  const k = keys.join("\n");
  if (body.dataset.keys !== k) {
    body.replaceChildren();
    body.dataset.keys = k;
    for (const key of keys) body.insertRow().dataset[attr] = key;
  }
  rows.forEach((r, i) => set(body.rows[i], cells(r)));
}

function renderTenants(sample) {
  const base = p95Base();
  const tenants = new Set([...Object.keys(sample.tenantTokens), ...Object.keys(sample.weights)]);
  const served = {};
  let total = 0, wtotal = 0;
  for (const t of tenants) {
    served[t] = num(sample.tenantTokens[t]) - num(base?.tenantTokens[t]);
    total += served[t];
    wtotal += sample.weights[t] || 1;
  }
  const rows = [...tenants].sort().map(t => {
    const share = total ? served[t] / total : 0;
    const wshare = (sample.weights[t] || 1) / wtotal;
    return [t, String(sample.weights[t] || 1), String(served[t]),
      {html: `<span class="sharebar" data-w="${(share * 60).toFixed(1)}"></span> ${(share * 100).toFixed(1)}%`, attrs: ` aria-label="${esc(`${t} served ${(share * 100).toFixed(1)}% of tokens`)}"`},
      {html: `<span class="sharebar weight" data-w="${(wshare * 60).toFixed(1)}"></span> ${(wshare * 100).toFixed(1)}%`, attrs: ` aria-label="${esc(`${t} weight share ${(wshare * 100).toFixed(1)}%`)}"`}];
  });
  set($("tenanttable"), rows.length ? table(["TENANT", "WEIGHT", "TOKENS", "SHARE OF SERVICE", "SHARE OF WEIGHT"], rows)
    : `<tbody><tr><td class="note">no requests through this node's gateway yet</td></tr></tbody>`);
}

followDecisions();
refresh();
setInterval(refresh, REFRESH_MS);
