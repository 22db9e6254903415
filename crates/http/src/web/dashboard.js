// Cairn dashboard: polls /api/metrics and /api/info every second and
// /api/tier, /api/heatmap and /api/snapshots every five, and draws with
// plain canvas/SVG; /api/history (the versions of a path) on demand. Every string that comes from the pool (paths, snapshot
// names, classes...) reaches the page as a text node (`el`, `set`): the
// page never parses HTML made from data (no innerHTML with data).
"use strict";
const $ = (id) => document.getElementById(id);
const HIST = 120;
const SVG = "http://www.w3.org/2000/svg";
const series = { t: [], read: [], write: [], latR: [], latW: [], latM: [] };
let prev = null;

function human(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n.toFixed(0)) + " " + u[i];
}
// An element with attributes (set as attributes or dataset, never parsed)
// and children (strings become text nodes).
function el(tag, attrs, ...kids) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "data") for (const [dk, dv] of Object.entries(v)) e.dataset[dk] = String(dv);
    else if (k === "class") e.setAttribute("class", v);
    else if (k === "style") Object.assign(e.style, v);
    else e.setAttribute(k, String(v));
  }
  for (const c of kids) if (c != null) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}
function set(id, text, value) {
  const e = $(id);
  if (!e) return;
  e.textContent = text;
  if (value !== undefined) e.dataset.value = String(value);
}
function rows(tbody, list) { tbody.replaceChildren(...list); }
// null for a route of the detailed API the admin left off (403).
async function get(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (r.status === 403) return null;
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}
const NO_DETAIL = "hidden: the detailed API is off (metrics_detail)";
function sum(samples, name, filter) {
  let s = 0;
  for (const x of samples) if (x.name === name && (!filter || filter(x))) s += typeof x.value === "number" ? x.value : 0;
  return s;
}
function label(x, k) { const l = x.labels.find((p) => p[0] === k); return l ? l[1] : ""; }
function hist(samples, ops) {
  let s = 0, c = 0;
  for (const x of samples) {
    if (x.name === "cairn_fuse_request_duration_seconds" && ops(label(x, "op"))) { s += x.value.sum; c += x.value.count; }
  }
  return { s, c };
}
function rate(h, m) { return h + m ? ((100 * h) / (h + m)).toFixed(1) + " %" : "no lookups yet"; }

function onMetrics(m) {
  const now = Date.now() / 1000;
  const cur = {
    t: now,
    read: sum(m, "cairn_logical_read_bytes"),
    write: sum(m, "cairn_logical_written_bytes"),
    r: hist(m, (o) => o === "read"),
    w: hist(m, (o) => o === "write"),
    md: hist(m, (o) => o !== "read" && o !== "write"),
  };
  set("write-total", human(cur.write), cur.write);
  set("read-total", human(cur.read), cur.read);
  if (prev) {
    const dt = Math.max(cur.t - prev.t, 0.001);
    const lat = (a, b) => (a.c > b.c ? ((a.s - b.s) / (a.c - b.c)) * 1000 : 0);
    push("t", cur.t);
    push("read", (cur.read - prev.read) / dt / 1048576);
    push("write", (cur.write - prev.write) / dt / 1048576);
    push("latR", lat(cur.r, prev.r));
    push("latW", lat(cur.w, prev.w));
    push("latM", lat(cur.md, prev.md));
    draw($("chart-throughput"), [["read", "#3b7dd8"], ["write", "#d8623b"]]);
    draw($("chart-latency"), [["latR", "#3b7dd8"], ["latW", "#d8623b"], ["latM", "#6a9f3a"]]);
  }
  prev = cur;
  const rh = sum(m, "cairn_ram_cache_hits"), rm = sum(m, "cairn_ram_cache_misses");
  const sh = sum(m, "cairn_ssd_cache_hits"), sm = sum(m, "cairn_ssd_cache_misses");
  rows($("cache").tBodies[0], [
    el("tr", {}, el("td", {}, "RAM read cache"), el("td", { id: "ram-rate", data: { hits: rh, misses: rm } }, rate(rh, rm)),
      el("td", {}, rh + " hits, " + rm + " misses, " + human(sum(m, "cairn_ram_cache_bytes")) + " held")),
    el("tr", {}, el("td", {}, "SSD read cache"), el("td", { id: "ssd-rate", data: { hits: sh, misses: sm } }, rate(sh, sm)),
      el("td", {}, sh + " hits, " + sm + " misses, " + sum(m, "cairn_ssd_cache_entries") + " entries")),
  ]);
  set("phys-read", human(sum(m, "cairn_physical_read_bytes")), sum(m, "cairn_physical_read_bytes"));
  set("phys-written", human(sum(m, "cairn_physical_written_bytes")), sum(m, "cairn_physical_written_bytes"));
  const by = (name, task) => sum(m, name, (x) => label(x, "task") === task);
  const tasks = ["gc", "reblock", "scrub", "prune", "migrate"];
  rows($("maint").tBodies[0], tasks.map((t) => {
    const pct = 100 * by("cairn_maintenance_progress_ratio", t);
    return el("tr", { data: { task: t, runs: by("cairn_maintenance_runs", t) } },
      el("td", {}, t), el("td", {}, String(by("cairn_maintenance_runs", t))),
      el("td", {}, by("cairn_maintenance_running", t) ? "running" : "idle"),
      el("td", {}, el("span", { class: "bar" }, el("i", { style: { width: pct.toFixed(1) + "%" } })), " " + pct.toFixed(0) + " %"),
      el("td", {}, human(by("cairn_maintenance_processed_bytes", t))),
      el("td", {}, human(by("cairn_maintenance_reclaimed_bytes", t))));
  }));
  set("promoted", human(sum(m, "cairn_tier_promoted_bytes")) + " (" + sum(m, "cairn_tier_promoted_segments") + " segments)", sum(m, "cairn_tier_promoted_bytes"));
  set("demoted", human(sum(m, "cairn_tier_demoted_bytes")) + " (" + sum(m, "cairn_tier_demoted_segments") + " segments)", sum(m, "cairn_tier_demoted_bytes"));
  devIo = new Map();
  for (const x of m) {
    if (!x.name.startsWith("cairn_device_") || typeof x.value !== "number") continue;
    const id = label(x, "device");
    if (!devIo.has(id)) devIo.set(id, {});
    devIo.get(id)[x.name] = x.value;
  }
}
let devIo = new Map();
function push(k, v) { series[k].push(v); if (series[k].length > HIST) series[k].shift(); }

function draw(c, lines) {
  const g = c.getContext("2d"), W = c.width, H = c.height, n = series.t.length;
  g.clearRect(0, 0, W, H);
  let max = 0.001;
  for (const [k] of lines) for (const v of series[k]) max = Math.max(max, v);
  g.strokeStyle = "#e3e5ea"; g.fillStyle = "#778"; g.font = "11px sans-serif";
  for (let i = 0; i <= 4; i++) {
    const y = H - 14 - ((H - 24) * i) / 4;
    g.beginPath(); g.moveTo(30, y); g.lineTo(W, y); g.stroke();
    g.fillText((max * i / 4).toFixed(max < 4 ? 2 : 0), 0, y + 4);
  }
  for (const [k, color] of lines) {
    g.strokeStyle = color; g.lineWidth = 2; g.beginPath();
    series[k].forEach((v, i) => {
      const x = 30 + ((W - 32) * (i + HIST - n)) / (HIST - 1);
      const y = H - 14 - ((H - 24) * v) / max;
      i ? g.lineTo(x, y) : g.moveTo(x, y);
    });
    g.stroke();
  }
  c.dataset.points = String(n);
}

function onInfo(j) {
  const s = j.stats, i = j.info;
  if (s) {
    set("tid", String(s.current_tid), s.current_tid);
    set("dirty", human(s.dirty_bytes), s.dirty_bytes);
    set("commits", s.commits + " commits");
    set("snapcount", String(s.snapshots), s.snapshots);
    const age = (a) => (a == null ? "–" : Math.round(a) + " s ago");
    set("snapage", s.newest_snapshot_age_seconds == null ? "none yet" : "newest " + age(s.newest_snapshot_age_seconds) + ", oldest " + age(s.oldest_snapshot_age_seconds));
  }
  if (i) {
    set("pool", i.pool + " (" + i.uuid + ")");
    set("files", String(i.files), i.files);
    set("dirs", i.directories + " directories");
    set("logical", human(i.logical_bytes), i.logical_bytes);
    set("physical", human(i.physical_bytes), i.physical_bytes);
    set("capacity", "of " + human(i.capacity_bytes));
    set("dedup", i.dedup_ratio.toFixed(2) + "×", i.dedup_ratio);
    set("dedup-saved", human(i.referenced_bytes - i.unique_bytes) + " saved");
    set("compression", i.compression_ratio.toFixed(2) + "×", i.compression_ratio);
    set("compression-saved", human(Math.max(0, i.unique_bytes - i.stored_bytes)) + " saved (" + i.compression + ")");
  }
  if (j.scan_age_seconds != null) set("scan-age", j.scan_age_seconds.toFixed(0));
}

const HEAT = ["#c9d3e0", "#9fc5e8", "#f6d36b", "#f3a24a", "#e4572e", "#a1122a"];
const HEAT_NAME = ["0", "≤1", "≤4", "≤16", "≤64", ">64"];
function onTier(t) {
  rows($("devices").tBodies[0], t.map((d) => {
    const pct = d.size ? (100 * d.used) / d.size : 0;
    const io = devIo.get(String(d.id)) || {};
    const heat = d.heat.map((n, b) => el("i", { title: "heat " + HEAT_NAME[b] + ": " + n + " segments", style: { background: HEAT[b], opacity: n ? 1 : 0.25 } }, String(n)));
    return el("tr", { data: { device: d.id, used: d.used, size: d.size, path: d.path } },
      el("td", {}, String(d.id)), el("td", {}, d.class), el("td", {}, d.role),
      el("td", { class: "state" + (d.state === "online" ? "" : " bad") }, (d.state || "?") + (d.failing ? " (failing writes)" : "")),
      el("td", { class: "path" }, d.path),
      el("td", {}, el("span", { class: "bar" }, el("i", { style: { width: pct.toFixed(1) + "%" } })), " " + human(d.used) + " / " + human(d.size)),
      el("td", {}, d.segments + " (" + d.hot_segments + " hot)"),
      el("td", {}, "r " + human(io.cairn_device_read_bytes || 0) + ", w " + human(io.cairn_device_written_bytes || 0)),
      el("td", {}, (io.cairn_device_read_errors || 0) + " / " + (io.cairn_device_write_errors || 0)),
      el("td", {}, el("span", { class: "heat" }, ...heat)));
  }));
}

// Heat colour of a cell: grey when no segment, then blue (cold) to red by
// log2 of the decayed reads of its hottest segment.
function heatColor(h, segs) {
  if (!segs) return "#e3e5ea";
  if (h <= 0) return HEAT[1];
  return HEAT[Math.min(5, 2 + Math.floor(Math.log2(1 + h) / 2))];
}
function onHeatmap(list) {
  const box = $("heatmap");
  box.dataset.devices = String(list.length);
  box.replaceChildren(...list.map((d) => {
    const n = d.heat.length, cols = Math.min(128, Math.max(1, n)), px = n > 2048 ? 5 : 8;
    const c = el("canvas", { class: "hm", width: cols * px, height: Math.ceil(n / cols) * px,
      data: { device: d.id, cells: n, slots: d.slots, perCell: d.slots_per_cell, used: d.segments.reduce((a, b) => a + b, 0) } });
    const g = c.getContext("2d");
    for (let k = 0; k < n; k++) {
      g.fillStyle = heatColor(d.heat[k], d.segments[k]);
      g.fillRect((k % cols) * px, Math.floor(k / cols) * px, px - 1, px - 1);
    }
    c.dataset.drawn = String(n);
    const per = d.slots_per_cell > 1 ? ", " + d.slots_per_cell + " slots per cell" : "";
    return el("div", { class: "hm-dev" },
      el("div", { class: "muted" }, "device " + d.id + " (" + d.class + ", " + d.role + "): " + d.slots + " slots, " + n + " cells" + per), c);
  }));
}

function onSnapshots(list) {
  const svg = $("timeline"), W = svg.clientWidth || 800;
  svg.dataset.count = String(list.length);
  if (!list.length) { svg.replaceChildren(el("svg:text", { x: 10, y: 45, fill: "#778" }, "no snapshots")); return; }
  const ts = list.map((s) => s.time_ns / 1e9), lo = Math.min(...ts), hi = Math.max(Date.now() / 1000, ...ts);
  const x = (t) => 20 + ((W - 40) * (t - lo)) / Math.max(hi - lo, 1);
  const kids = [el("svg:line", { x1: 20, y1: 45, x2: W - 20, y2: 45, stroke: "#aab" })];
  list.forEach((s, k) => {
    const px = x(s.time_ns / 1e9);
    kids.push(el("svg:circle", { class: "snap", cx: px, cy: 45, r: 6, fill: s.auto ? "#6a9f3a" : "#3b7dd8" },
      el("svg:title", {}, s.name + " (TID " + s.tid + ", " + new Date(s.time_ns / 1e6).toISOString() + ")")));
    kids.push(el("svg:text", { class: "snap-name", x: px, y: k % 2 ? 75 : 25, "font-size": 11, "text-anchor": px < W / 4 ? "start" : px > (3 * W) / 4 ? "end" : "middle" }, s.name));
  });
  svg.replaceChildren(...kids);
}

// The versions of the path typed in, marking where the inode changed and
// where the path was gone between two versions.
function historyRow(v, next) {
  const tid = "0x" + v.tid.toString(16).padStart(16, "0");
  const gap = v.ended_tid != null && (!next || next.tid !== v.ended_tid);
  const mark = [v.inode_changed ? "new inode" : "", v.ended_tid == null ? "current" : "",
    gap ? "then gone until the next version" : ""].filter((m) => m).join(", ");
  return el("tr", { class: v.inode_changed ? "new-inode" : "" }, el("td", {}, tid),
    el("td", {}, new Date(v.time_ns / 1e6).toISOString().replace("T", " ").slice(0, 19)),
    el("td", {}, human(v.size)), el("td", {}, v.ino), el("td", {}, mark));
}
async function showHistory() {
  const body = $("history").tBodies[0];
  const q = "/api/history?path=" + encodeURIComponent($("hist-path").value) + ($("hist-inode").checked ? "&inode=1" : "");
  set("hist-status", "…");
  try {
    const r = await fetch(q, { cache: "no-store" });
    if (!r.ok) {
      rows(body, []);
      set("hist-status", r.status === 403 ? NO_DETAIL : (await r.text()).trim());
      return;
    }
    const list = await r.json();
    rows(body, list.map((v, i) => historyRow(v, list[i + 1])));
    set("hist-status", list.length + " version" + (list.length === 1 ? "" : "s"));
  } catch (e) { set("hist-status", "error: " + e.message); }
}
$("hist-go").addEventListener("click", showHistory);
$("hist-path").addEventListener("keydown", (e) => { if (e.key === "Enter") showHistory(); });

async function tick() {
  try {
    const [m, j] = await Promise.all([get("/api/metrics"), get("/api/info")]);
    onMetrics(m);
    if (j) onInfo(j); else set("pool", NO_DETAIL);
    set("status", "updated " + new Date().toLocaleTimeString());
  } catch (e) { set("status", "error: " + e.message); }
}
async function slow() {
  try {
    const t = await get("/api/tier");
    if (t) onTier(t);
    onHeatmap(await get("/api/heatmap?cells=4096"));
    const s = await get("/api/snapshots");
    if (s) onSnapshots(s); else set("snapage", NO_DETAIL);
  } catch (e) { set("status", "error: " + e.message); }
}
tick().then(slow);
setInterval(tick, 1000);
setInterval(slow, 5000);
