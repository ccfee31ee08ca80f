// The spoolmq console's pages. Plain JavaScript, no libraries: each page reads the JSON API
// (/api/...), stays live through server-sent events (/api/live?view=...), and sends every
// action as a POST carrying the session's CSRF token. Everything shown from the store is
// escaped (esc) before it reaches innerHTML: a message's value is data, never markup.
"use strict";

const body = document.body;
const PAGE = body.dataset.page, CSRF = body.dataset.csrf, ARG = body.dataset.arg;
const READ_ONLY = body.dataset.readonly === "true";
const main = document.getElementById("main");
const COLORS = { published: "#2f6fed", delivered: "#8e59d9", acked: "#1a7f4b", nacked: "#e09b1a",
  dead_lettered: "#c0362c", expired: "#7a8699" };

function esc(v) {
  return String(v).replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
function n(v) { return v === null || v === undefined ? "" : Number(v).toLocaleString("en"); }
function when(ms) { return ms ? new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : ""; }
function bytes(b) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : b) + " " + units[i];
}
function duration(s) {
  if (s === null || s === undefined) return "";
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  return (d ? d + "d " : "") + (d || h ? h + "h " : "") + m + "m " + Math.floor(s % 60) + "s";
}
// A stored value: raw bytes arrive as {"hex": ...} and are shown as hex; JSON pretty-printed.
function value(v) {
  if (v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length === 1 && "hex" in v) {
    return '<pre class="hex" title="raw bytes, as hex">' + esc(v.hex) + "</pre>";
  }
  if (typeof v === "string") return "<pre>" + esc(v) + "</pre>";
  const line = JSON.stringify(v); // short values on one line, longer ones indented
  return "<pre>" + esc(line.length <= 90 ? line : JSON.stringify(v, null, 2)) + "</pre>";
}
function short(v) {
  if (v === null || v === undefined) return '<span class="muted">none</span>';
  if (typeof v === "object" && "hex" in v) return '<span class="hex">' + esc(v.hex) + "</span>";
  return esc(v);
}
function showError(message) {
  const box = document.getElementById("error");
  box.textContent = message; box.hidden = false;
  clearTimeout(showError.timer); showError.timer = setTimeout(() => { box.hidden = true; }, 8000);
}
async function get(path) {
  const response = await fetch(path, { credentials: "same-origin" });
  if (response.status === 401) { location.href = "/login"; throw new Error("logged out"); }
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}
async function post(path, payload) {
  const response = await fetch(path, { method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": CSRF }, body: JSON.stringify(payload) });
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}
// A page's live view: each snapshot to its handler; an {"error"} (a store error, or the
// login gone: the server then ends the stream) is shown instead of drawn.
function live(view, handler) {
  const source = new EventSource("/api/live?view=" + view);
  source.addEventListener(view, e => {
    const data = JSON.parse(e.data);
    if (data && data.error) { showError(data.error); return; }
    handler(data);
  });
  return source;
}
function table(headers, rows, id) {
  return `<table${id ? ` id="${id}"` : ""}><thead><tr>${headers.map(h => `<th${h.startsWith("#") ? ' class="num"' : ""}>${esc(h.replace(/^#/, ""))}</th>`).join("")}</tr></thead><tbody>` +
    (rows.length ? rows.join("") : `<tr><td colspan="${headers.length}" class="muted">nothing</td></tr>`) + "</tbody></table>";
}
function params(form) {
  const out = new URLSearchParams();
  for (const [k, v] of new FormData(form)) if (v !== "") out.set(k, v);
  return out;
}

// A series' colour: fixed for the overview's counters, from a small palette for groups.
// (Set as SVG attributes: the Content-Security-Policy allows no inline style.)
function colorOf(name, k) { return COLORS[name] || ["#2f6fed", "#c0362c", "#1a7f4b", "#8e59d9", "#e09b1a"][k % 5]; }

// A hand-written SVG line chart: one polyline per series over the minutes given.
function chart(minutes, series, title) {
  const W = 1000, H = 200, L = 50, B = 20, T = 10;
  const names = Object.keys(series);
  let top = 1;
  for (const name of names) for (const v of series[name]) if (v !== null && v > top) top = v;
  const x = i => L + (W - L - 10) * (minutes.length > 1 ? i / (minutes.length - 1) : 0);
  const y = v => T + (H - T - B) * (1 - v / top);
  let svg = `<svg class="chart" viewBox="0 0 ${W} ${H}" preserveAspectRatio="none" role="img" aria-label="${esc(title)}">`;
  for (const f of [0, 0.5, 1]) {
    svg += `<line x1="${L}" x2="${W - 10}" y1="${y(top * f)}" y2="${y(top * f)}" stroke="#e3e7ee"/>` +
      `<text x="4" y="${y(top * f) + 4}">${esc(n(Math.round(top * f)))}</text>`;
  }
  if (minutes.length) {
    svg += `<text x="${L}" y="${H - 4}">${esc(when(minutes[0]).slice(11, 16))}</text>` +
      `<text x="${W - 50}" y="${H - 4}">${esc(when(minutes[minutes.length - 1]).slice(11, 16))}</text>`;
  }
  names.forEach((name, k) => {
    const color = colorOf(name, k);
    const points = series[name].map((v, i) => v === null ? null : `${x(i).toFixed(1)},${y(v).toFixed(1)}`).filter(Boolean);
    if (points.length) svg += `<polyline fill="none" stroke="${color}" stroke-width="2" points="${points.join(" ")}"/>`;
  });
  svg += "</svg>";
  const legend = names.map((name, k) => `<span><svg width="12" height="12" aria-hidden="true"><rect width="12" height="12" fill="${colorOf(name, k)}"/></svg> ${esc(name)}</span>`).join("");
  return `<div class="legend">${legend}</div>` + svg;
}

function brokerState(info) {
  const pill = document.getElementById("broker-state");
  pill.textContent = info.running ? "broker running" : "broker stopped: showing the files";
  pill.className = "pill " + (info.running ? "good" : "bad");
}

// -- pages ------------------------------------------------------------------------------------

const pages = {};

pages.overview = async () => {
  main.innerHTML = `<h1>Overview</h1><div class="cards" id="cards"></div>
    <h2>Rates now (per second)</h2><div id="rates"></div>
    <h2>Last hour (messages per minute, from the files)</h2><div id="chart"></div>`;
  // The broker's counters reach its admin answer every second or two, so a rate is taken
  // over the snapshots of the last 10 s, not between two neighbours (which would jump).
  let seen = [];
  const draw = data => {
    brokerState(data.broker);
    const stats = data.broker.stats || {};
    const cards = [["Topics", n(data.topics)], ["Messages stored", n(data.messages)], ["On disk", bytes(data.bytes)],
      ["Consumers", n(stats.clients ? stats.clients.consumer : 0)], ["Publishers", n(stats.clients ? stats.clients.publisher : 0)],
      ["In flight", n(stats.consumer ? stats.consumer.in_flight : 0)]];
    document.getElementById("cards").innerHTML = cards.map(([k, v]) => `<div class="card"><div class="v">${esc(v)}</div><div class="k">${esc(k)}</div></div>`).join("");
    const now = performance.now();
    const counters = stats.publisher ? { published: stats.publisher.messages, delivered: stats.consumer.delivered,
      acked: stats.consumer.acked, nacked: stats.consumer.nacked, dead_lettered: stats.consumer.dead_lettered } : null;
    if (!counters || (seen.length && counters.published < seen[seen.length - 1].counters.published)) seen = []; // stopped or restarted
    if (counters) seen.push({ at: now, counters });
    while (seen.length > 2 && now - seen[1].at >= 10000) seen.shift();
    let rates;
    if (!counters) rates = '<p class="muted">No broker runs: no live rates. The chart below is read from the files.</p>';
    else if (seen.length > 1 && now - seen[0].at >= 1000) {
      const first = seen[0], seconds = (now - first.at) / 1000;
      rates = table(Object.keys(counters).map(k => "#" + k), ["<tr>" + Object.keys(counters).map(k =>
        `<td class="num" data-rate="${k}">${esc(Math.max(0, (counters[k] - first.counters[k]) / seconds).toFixed(1))}</td>`).join("") + "</tr>"]);
    } else rates = '<p class="muted">measuring…</p>';
    document.getElementById("rates").innerHTML = rates;
  };
  const drawHistory = async () => {
    try {
      const h = await get("/api/history");
      document.getElementById("chart").innerHTML = chart(h.minutes, h.series, "messages per minute, last hour");
    } catch (e) { showError(e.message); }
  };
  draw(await get("/api/overview"));
  drawHistory(); setInterval(drawHistory, 30000);
  live("overview", draw);
};

function topicRows(list) {
  return list.map(t => `<tr><td><a href="/topics/${encodeURIComponent(t.name)}">${esc(t.name)}</a></td>
    <td class="num">${n(t.partitions.length)}</td><td class="num">${n(t.messages)}</td><td class="num">${esc(bytes(t.bytes))}</td>
    <td>${t.retention_ms < 0 ? "forever" : esc(duration(t.retention_ms / 1000))}</td><td>${esc(t.cleanup_policy)}</td>
    <td>${t.partitions.map(p => `${p.partition}: ${n(p.log_start_offset)}…${n(p.log_end_offset)}`).map(esc).join("<br>")}</td>
    <td>${t.name.endsWith(".dlq") ? "" : `<a href="/dlq/${encodeURIComponent(t.name)}">dead letters</a>`}</td></tr>`);
}

pages.topics = async () => {
  main.innerHTML = `<h1>Topics</h1><div id="topics"></div>`;
  const draw = list => {
    document.getElementById("topics").innerHTML = table(["topic", "#partitions", "#messages", "#size", "retention", "cleanup", "log start…end per partition", ""], topicRows(list), "topic-table");
  };
  draw(await get("/api/topics"));
  get("/api/broker").then(brokerState);
  live("topics", draw);
};

function messageRows(list) {
  return list.map(m => `<tr class="message"><td class="num">${m.partition}</td><td class="num">${m.offset}</td><td>${esc(when(m.timestamp))}</td>
    <td class="key">${short(m.key)}</td><td class="value">${value(m.value)}</td>
    <td>${m.headers.map(([h, v]) => esc(h) + "=" + short(v)).join("<br>")}</td><td>${m.tags.map(esc).join(", ")}</td>
    <td>${m.deliver_at ? "deliver at " + esc(when(m.deliver_at)) : ""}${m.expires_at ? "<br>expires " + esc(when(m.expires_at)) : ""}</td></tr>`);
}
const MESSAGE_HEADERS = ["#partition", "#offset", "time (UTC)", "key", "value", "headers", "tags", "schedule"];

pages.topic = async () => {
  const topic = ARG, base = "/api/topics/" + encodeURIComponent(topic);
  const topics = await get("/api/topics");
  const info = topics.find(t => t.name === topic);
  get("/api/broker").then(brokerState);
  if (!info) { main.innerHTML = `<h1>No topic ${esc(topic)}</h1>`; return; }
  main.innerHTML = `<h1>Topic ${esc(topic)}</h1>
    <p><a href="/dlq/${encodeURIComponent(topic)}">dead letters of ${esc(topic)}</a></p>
    <h2>Browse</h2>
    <form class="bar" id="seek"><label>Partition <select name="partition" id="partition">${info.partitions.map(p => `<option>${p.partition}</option>`).join("")}</select></label>
      <label>Offset <input name="offset" id="offset" inputmode="numeric" size="10"></label>
      <label>or time (ISO, UTC) <input name="time" id="time" placeholder="2026-11-23T21:00:00Z" size="22"></label>
      <label>Page size <input name="limit" value="50" size="4"></label>
      <button type="submit" id="seek-button">Go</button>
      <button type="button" class="secondary" id="older">◀ Older</button>
      <button type="button" class="secondary" id="newer">Newer ▶</button>
      <button type="button" class="secondary" id="newest">Newest</button></form>
    <p id="page-info" class="muted"></p><div id="page"></div>
    <h2>Search</h2>
    <form class="bar" id="search"><label>Key <input name="key" id="search-key"></label>
      <label>Header (name=value) <input name="header"></label><label>Tag <input name="tag"></label>
      <label>JSON field (path=value) <input name="field" placeholder="customer.id=7"></label>
      <label>Partition <select name="partition"><option value="">all</option>${info.partitions.map(p => `<option>${p.partition}</option>`).join("")}</select></label>
      <label>From offset <input name="offset" size="8"></label>
      <label>or from time (ISO, UTC) <input name="time" id="search-time" placeholder="2026-11-23T21:00:00Z" size="22"></label>
      <label>Scan at most <input name="max_scan" value="10000" size="8"></label>
      <button type="submit" id="search-button">Search</button></form>
    <p id="search-info" class="muted"></p><div id="results"></div>`;
  let current = null;
  const load = async query => {
    try {
      current = await get(base + "/messages?" + query.toString());
      const last = current.messages.length ? current.messages[current.messages.length - 1].offset : current.offset;
      document.getElementById("page-info").textContent = `partition ${current.partition}: offsets ${current.log_start_offset}…${current.log_end_offset - 1} stored; showing ${current.messages.length} from offset ${current.offset}` + (current.messages.length ? ` to ${last}` : "");
      document.getElementById("page").innerHTML = table(MESSAGE_HEADERS, messageRows(current.messages), "messages");
    } catch (e) { showError(e.message); }
  };
  const form = document.getElementById("seek");
  form.addEventListener("submit", e => { e.preventDefault(); load(params(form)); });
  const move = back => {
    if (!current) return;
    const q = params(form); q.delete("time");
    const next = back ? current.offset : (current.messages.length ? current.messages[current.messages.length - 1].offset + 1 : current.offset);
    q.set("offset", next); if (back) q.set("direction", "back");
    load(q);
  };
  document.getElementById("older").onclick = () => move(true);
  document.getElementById("newer").onclick = () => move(false);
  document.getElementById("newest").onclick = () => { const q = params(form); q.delete("offset"); q.delete("time"); load(q); };
  document.getElementById("partition").onchange = () => document.getElementById("newest").click();
  load(new URLSearchParams({ partition: "0" }));

  const search = document.getElementById("search");
  search.addEventListener("submit", async e => {
    e.preventDefault();
    const info = document.getElementById("search-info"), results = document.getElementById("results");
    results.innerHTML = table(MESSAGE_HEADERS, [], "search-results");
    const tbody = results.querySelector("tbody"); tbody.innerHTML = "";
    info.textContent = "searching…";
    let found = 0;
    try {
      const response = await fetch(base + "/search?" + params(search).toString(), { credentials: "same-origin" });
      if (!response.ok) throw new Error((await response.json()).error);
      // Matches stream in as NDJSON lines; each is shown as it arrives.
      const reader = response.body.getReader(), decoder = new TextDecoder();
      let buffered = "";
      for (;;) {
        const { done, value: chunk } = await reader.read();
        if (done) break;
        buffered += decoder.decode(chunk, { stream: true });
        let cut;
        while ((cut = buffered.indexOf("\n")) >= 0) {
          const item = JSON.parse(buffered.slice(0, cut)); buffered = buffered.slice(cut + 1);
          if (item.match) { found++; tbody.insertAdjacentHTML("beforeend", messageRows([item.match])[0]); info.textContent = `${found} found so far…`; }
          if (item.error) { info.textContent = `stopped after ${found} match(es): ${item.error}`; showError(item.error); }
          if (item.done) info.textContent = `${n(item.matches)} match(es) in ${n(item.scanned)} message(s) scanned` + (item.bounded ? " (stopped at the bound: raise it or narrow the search)" : "");
        }
      }
      if (!found) tbody.innerHTML = `<tr><td colspan="${MESSAGE_HEADERS.length}" class="muted">no match</td></tr>`;
    } catch (e2) { showError(e2.message); info.textContent = ""; }
  });
};

pages.groups = async () => {
  main.innerHTML = `<h1>Consumer groups</h1><div id="group-notice"></div><div id="groups"></div><h2>Lag, last hour</h2><div id="lag-chart"></div>`;
  get("/api/broker").then(brokerState);
  const topics = (await get("/api/topics")).map(t => t.name);
  let lastSeen = {}; // consumer -> ms of its last delivery or ACK in events/ (last hour)
  const draw = groups => {
    const holder = document.getElementById("groups");
    if (holder.querySelector("input:focus, select:focus") || holder.querySelector(".preview")) return; // not while the user acts
    holder.innerHTML = Object.keys(groups).length ? "" : '<p class="muted">no consumer groups yet</p>';
    for (const [name, g] of Object.entries(groups)) {
      const section = document.createElement("section");
      section.className = "group"; section.dataset.group = name;
      section.innerHTML = `<h2>${esc(name)} <span class="muted">lag ${n(g.lag)}, in flight ${n(g.in_flight)}, parked ${n(g.parked)}</span></h2>
        <p>Consumers: ${g.consumers.length ? g.consumers.map(c => `<span class="member">${esc(c.id)}` + (c.name ? ` “${esc(c.name)}”` : "") +
          (c.kind === "kafka" ? ` (Kafka client at ${esc(c.host)})</span>` :
          ` (pid ${esc(c.pid ?? "?")}, in flight ${n(c.in_flight)}, last seen ${esc(when(c.last_seen || lastSeen[c.id]).slice(11) || "not yet")})</span>`)).join(", ") : '<span class="muted">none connected</span>'}</p>` +
        table(["topic", "#partition", "#committed", "#log end", "#lag", "#in flight", "#parked", "consumers"], g.partitions.map(r =>
          `<tr><td>${esc(r.topic)}</td><td class="num">${r.partition}</td><td class="num committed">${n(r.committed)}</td><td class="num">${n(r.log_end_offset)}</td>
          <td class="num lag">${n(r.lag)}</td><td class="num">${n(r.in_flight)}</td><td class="num parked">${n(r.parked)}</td><td>${(r.consumers || []).map(esc).join(", ")}</td></tr>`)) +
        (READ_ONLY ? "" : `<form class="bar reset"><label>Reset topic <select name="topic">${[...new Set(g.partitions.map(r => r.topic).concat(topics))].map(t => `<option>${esc(t)}</option>`).join("")}</select></label>
          <label>to <select name="to"><option>earliest</option><option>latest</option><option>offset</option><option>time</option></select></label>
          <label>offset or time <input name="value" size="20"></label><button type="submit" class="secondary">Preview reset</button></form>
          <div class="reset-result"></div>`);
      holder.appendChild(section);
      const form = section.querySelector("form.reset");
      if (form) form.addEventListener("submit", e => { e.preventDefault(); previewReset(name, form, section.querySelector(".reset-result")); });
    }
  };
  const history = await get("/api/history");
  lastSeen = history.last_seen;
  draw(await get("/api/groups"));
  live("groups", draw);
  document.getElementById("lag-chart").innerHTML = Object.keys(history.lag).length ? chart(history.minutes, history.lag, "lag per group") : '<p class="muted">no lag snapshots in events/ in the last hour</p>';
};

async function previewReset(group, form, out) {
  const notice = document.getElementById("group-notice");
  notice.innerHTML = "";
  const request = { topic: form.topic.value, to: form.to.value, value: form.value.value || undefined };
  if (request.to === "offset") request.value = Number(form.value.value);
  try {
    const plan = await post(`/api/groups/${encodeURIComponent(group)}/reset`, { ...request, execute: false });
    out.innerHTML = `<div class="preview notice"><b>Preview</b>: nothing changed yet.` +
      table(["topic", "#partition", "#from", "#to"], plan.changes.map(c => `<tr><td>${esc(c.topic)}</td><td class="num">${c.partition}</td><td class="num">${c.from === null ? "never committed" : n(c.from)}</td><td class="num">${n(c.to)}</td></tr>`)) +
      `<button type="button" class="danger confirm-reset">Confirm reset</button> <button type="button" class="secondary cancel-reset">Cancel</button></div>`;
    out.querySelector(".cancel-reset").onclick = () => { out.innerHTML = ""; };
    out.querySelector(".confirm-reset").onclick = async () => {
      try {
        const done = await post(`/api/groups/${encodeURIComponent(group)}/reset`, { ...request, execute: true });
        notice.innerHTML = `<p class="good reset-done">Reset of ${esc(group)} done: ${done.changes.length} partition(s) moved.</p>`;
      } catch (e) { notice.innerHTML = `<p class="bad reset-refused">Reset of ${esc(group)} refused: ${esc(e.message)}</p>`; }
      out.innerHTML = ""; // the live table below shows the new offsets
    };
  } catch (e) { showError(e.message); }
}

pages.dlq = async () => {
  const topic = ARG, base = "/api/dlq/" + encodeURIComponent(topic);
  get("/api/broker").then(brokerState);
  main.innerHTML = `<h1>Dead letters of <a href="/topics/${encodeURIComponent(topic)}">${esc(topic)}</a></h1>
    <form class="bar" id="dlq-filter"><label>Key <input name="key"></label><label>Header (name=value) <input name="header"></label>
      <label>Tag <input name="tag"></label><label>JSON field (path=value) <input name="field"></label><button type="submit">Filter</button></form>
    ${READ_ONLY ? "" : `<div class="bar"><label>Redrive to <select id="redrive-to"><option value="">the original topic (every group)</option></select></label>
      <button type="button" id="redrive-selected">Redrive selected</button><button type="button" id="redrive-all">Redrive all matching</button>
      <button type="button" class="danger" id="purge">Purge…</button></div>`}
    <p id="dlq-result"></p><p id="dlq-info" class="muted"></p><div id="letters"></div>`;
  const filter = document.getElementById("dlq-filter");
  const draw = data => {
    if (data.error) { showError(data.error); return; }
    {
      document.getElementById("dlq-info").textContent = `${data.dead_letters.length} dead letter(s) in ${data.dlq_topic}`;
      document.getElementById("letters").innerHTML = table([READ_ONLY ? "" : "pick", "#offset", "reason", "#attempts", "origin", "group", "key", "value"],
        data.dead_letters.map(d => `<tr class="letter"><td>${READ_ONLY ? "" : `<input type="checkbox" class="pick" data-partition="${d.dlq_partition}" data-offset="${d.dlq_offset}">`}</td>
          <td class="num">${d.dlq_partition}/${d.dlq_offset}</td><td>${esc(d.reason || "")}</td><td class="num">${n(d.attempts)}</td>
          <td>${esc(d.origin.topic || "")}/${esc(d.origin.partition ?? "")}@${esc(d.origin.offset ?? "")}</td><td>${esc(d.group || "")}</td>
          <td>${short(d.message.key)}</td><td>${value(d.message.value)}</td></tr>`), "dead-letters");
    }
  };
  const load = async () => {
    try { draw(await get(base + "?" + params(filter).toString())); } catch (e) { showError(e.message); }
  };
  let source = null;
  // Live while the page is open (a dead letter arrives after its last NACK is answered),
  // but never redrawn under the user's hand: not while a letter is ticked.
  const follow = () => {
    if (source) source.close();
    const q = params(filter); q.set("view", "dlq"); q.set("topic", topic);
    source = new EventSource("/api/live?" + q.toString());
    source.addEventListener("dlq", e => { if (!document.querySelector("input.pick:checked")) draw(JSON.parse(e.data)); });
  };
  filter.addEventListener("submit", e => { e.preventDefault(); load(); follow(); });
  await load();
  follow();
  if (READ_ONLY) return;
  const groups = await get("/api/groups");
  const to = document.getElementById("redrive-to");
  for (const g of Object.keys(groups)) to.insertAdjacentHTML("beforeend", `<option value="${esc(g)}">only group ${esc(g)}</option>`);
  const act = async payload => {
    try {
      const result = await post(base + "/redrive", { ...payload, to_group: to.value || undefined,
        filter: Object.fromEntries(params(filter)) });
      document.getElementById("dlq-result").innerHTML = `<span class="good redrive-done">Redriven: ${n(result.replayed)}` +
        (result.already_replayed ? `, ${n(result.already_replayed)} had been redriven before` : "") +
        (result.tasks_queued ? `, ${n(result.tasks_queued)} dead-lettered task(s) queued again` : "") + "</span>";
    } catch (e) { showError(e.message); }
  };
  document.getElementById("redrive-selected").onclick = () => {
    const letters = [...document.querySelectorAll("input.pick:checked")].map(c => [Number(c.dataset.partition), Number(c.dataset.offset)]);
    if (!letters.length) { showError("pick one or more dead letters first"); return; }
    act({ letters });
  };
  document.getElementById("redrive-all").onclick = () => act({ all: true });
  // Purge the letters ticked, or else every letter the filter shows (all of them without one).
  document.getElementById("purge").onclick = async () => {
    const letters = [...document.querySelectorAll("input.pick:checked")].map(c => [Number(c.dataset.partition), Number(c.dataset.offset)]);
    const matching = Object.fromEntries(params(filter));
    const what = letters.length ? `the ${letters.length} dead letter(s) picked`
      : Object.keys(matching).length ? `every dead letter of ${topic} the filter shows` : `every dead letter of ${topic}`;
    if (!confirm(`Delete ${what}? This cannot be undone.`)) return;
    const body = letters.length ? { confirm: true, letters } : { confirm: true, all: true, filter: matching };
    try { const r = await post(base + "/purge", body); document.getElementById("dlq-result").innerHTML = `<span class="good purge-done">Purged: ${n(r.purged)}</span>`; load(); }
    catch (e) { showError(e.message); }
  };
};

pages.pending = async () => {
  main.innerHTML = `<h1>Scheduled and in flight</h1><p class="muted">Retries and deliveries as the broker last checkpointed them to state.db (about once a second while it runs); delayed messages from the newest records of each partition.</p><div id="pending"></div>`;
  get("/api/broker").then(brokerState);
  const draw = p => {
    document.getElementById("pending").innerHTML =
      p.damaged.map(d => `<p class="notice bad">Partition ${esc(d.topic)}/${d.partition}: ${esc(d.error)}</p>`).join("") +
      "<h2>Delayed messages</h2>" + table(["topic", "#partition", "#offset", "deliver at (UTC)", "key", "value"], p.delayed.map(m =>
        `<tr><td>${esc(m.topic)}</td><td class="num">${m.partition}</td><td class="num">${m.offset}</td><td>${esc(when(m.deliver_at))}</td><td>${short(m.key)}</td><td>${value(m.value)}</td></tr>`)) +
      "<h2>Retries scheduled</h2>" + table(["group", "topic", "#partition", "#offset", "due (UTC)", "#attempt", "reason"], p.scheduled.map(r =>
        `<tr><td>${esc(r.group)}</td><td>${esc(r.topic)}</td><td class="num">${r.partition}</td><td class="num">${r.offset}</td><td>${r.due_at ? esc(when(r.due_at)) : "now (waiting for a consumer)"}</td><td class="num">${r.attempt}</td><td>${esc(r.reason || "")}</td></tr>`)) +
      "<h2>In flight</h2>" + table(["group", "topic", "#partition", "#offset", "consumer", "#attempt", "delivered (UTC)", "lease ends (UTC)"], p.in_flight.map(r =>
        `<tr><td>${esc(r.group)}</td><td>${esc(r.topic)}</td><td class="num">${r.partition}</td><td class="num">${r.offset}</td><td>${esc(r.consumer)}</td><td class="num">${r.attempt}</td><td>${esc(when(r.delivered_at))}</td><td>${esc(when(r.lease_expires_at))}</td></tr>`));
  };
  draw(await get("/api/pending"));
  live("pending", draw);
};

pages.broker = async () => {
  main.innerHTML = `<h1>Broker</h1><div id="broker"></div>`;
  const draw = b => {
    brokerState(b);
    if (!b.running) { document.getElementById("broker").innerHTML = '<p class="muted">No broker holds this data directory now: the pages show what is on disk.</p>'; return; }
    const s = b.stats;
    document.getElementById("broker").innerHTML = table(["process", "#pid", "uptime", "#restarts"], b.processes.map(p =>
      `<tr><td>${esc(p.role)}</td><td class="num">${p.pid}</td><td>${esc(duration(p.uptime_s))}</td><td class="num">${p.restarts === undefined ? "" : n(p.restarts)}</td></tr>`)) +
      "<h2>Connections</h2>" + table(Object.keys(s.clients).map(k => "#" + k), ["<tr>" + Object.values(s.clients).map(v => `<td class="num">${n(v)}</td>`).join("") + "</tr>"]) +
      "<h2>Counters since start</h2>" + table(["figure", "#value"], Object.entries({ ...s.publisher, ...s.consumer }).filter(([, v]) => typeof v === "number").map(([k, v]) => `<tr><td>${esc(k)}</td><td class="num">${n(v)}</td></tr>`)) +
      (s.listen ? `<p>TCP listener: ${esc(s.listen.join(":"))}</p>` : "");
  };
  draw(await get("/api/broker"));
  live("broker", draw);
};

document.getElementById("mode").textContent = READ_ONLY ? "read-only" : "";
for (const a of document.querySelectorAll("[data-nav]")) if (a.dataset.nav === PAGE || (PAGE === "topic" || PAGE === "dlq") && a.dataset.nav === "topics") a.classList.add("active");
(pages[PAGE] || pages.overview)().catch(e => showError(e.message));
