// Cairn dashboard: polls /api/metrics and /api/info every second and
// /api/tier and /api/snapshots every five, and draws with plain canvas/SVG.
"use strict";
const $ = (id) => document.getElementById(id);
const HIST = 120;
const series = { t: [], read: [], write: [], latR: [], latW: [], latM: [] };
let prev = null;

function human(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n.toFixed(0)) + " " + u[i];
}
function set(id, text, value) {
  const e = $(id);
  if (!e) return;
  e.textContent = text;
  if (value !== undefined) e.dataset.value = String(value);
}
async function get(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}
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

function onMetrics(m) {
  const now = Date.now() / 1000;
  const cur = {
    t: now,
    read: sum(m, "cairn_fuse_read_bytes"),
    write: sum(m, "cairn_fuse_write_bytes"),
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
  const hits = sum(m, "cairn_ssd_cache_hits"), miss = sum(m, "cairn_ssd_cache_misses");
  const rows = [["RAM read cache", human(sum(m, "cairn_ram_cache_bytes"))]];
  if (m.some((x) => x.name === "cairn_ssd_cache_hits")) {
    rows.push(["SSD cache hit rate", hits + miss ? ((100 * hits) / (hits + miss)).toFixed(1) + " % (" + hits + " hits, " + miss + " misses)" : "no reads yet"]);
  } else rows.push(["SSD cache", "none"]);
  $("cache").tBodies[0].innerHTML = rows.map((r) => "<tr><td>" + r[0] + "</td><td>" + r[1] + "</td></tr>").join("");
}
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
    set("snapage", s.newest_snapshot_age_seconds == null ? "none yet" : "newest " + Math.round(s.newest_snapshot_age_seconds) + " s ago");
  }
  if (i) {
    $("pool").textContent = i.pool + " (" + i.uuid + ")";
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
  $("devices").tBodies[0].innerHTML = t.map((d) => {
    const pct = d.size ? (100 * d.used) / d.size : 0;
    const heat = d.heat.map((n, b) => '<i title="heat ' + HEAT_NAME[b] + ": " + n + ' segments" style="background:' + HEAT[b] + ";opacity:" + (n ? 1 : 0.25) + '">' + n + "</i>").join("");
    return '<tr data-device="' + d.id + '" data-used="' + d.used + '" data-size="' + d.size + '"><td>' + d.id + "</td><td>" + d.class + "</td><td>" + d.role + "</td><td>" + d.path +
      '</td><td><span class="bar"><i style="width:' + pct.toFixed(1) + '%"></i></span> ' + human(d.used) + " / " + human(d.size) +
      "</td><td>" + d.segments + ' (' + d.hot_segments + ' hot)</td><td><span class="heat">' + heat + "</span></td></tr>";
  }).join("");
}
function onSnapshots(list) {
  const svg = $("timeline"), W = svg.clientWidth || 800;
  svg.dataset.count = String(list.length);
  if (!list.length) { svg.innerHTML = '<text x="10" y="45" fill="#778">no snapshots</text>'; return; }
  const ts = list.map((s) => s.time_ns / 1e9), lo = Math.min(...ts), hi = Math.max(Date.now() / 1000, ...ts);
  const x = (t) => 20 + ((W - 40) * (t - lo)) / Math.max(hi - lo, 1);
  let h = '<line x1="20" y1="45" x2="' + (W - 20) + '" y2="45" stroke="#aab"/>';
  list.forEach((s, k) => {
    const px = x(s.time_ns / 1e9);
    h += '<circle class="snap" cx="' + px + '" cy="45" r="6" fill="' + (s.auto ? "#6a9f3a" : "#3b7dd8") + '"><title>' + s.name + " (TID " + s.tid + ", " + new Date(s.time_ns / 1e6).toISOString() + ")</title></circle>";
    h += '<text x="' + px + '" y="' + (k % 2 ? 75 : 25) + '" font-size="11" text-anchor="middle">' + s.name.replace(/[<&]/g, "") + "</text>";
  });
  svg.innerHTML = h;
}

async function tick() {
  try {
    const [m, j] = await Promise.all([get("/api/metrics"), get("/api/info")]);
    onMetrics(m); onInfo(j);
    set("status", "updated " + new Date().toLocaleTimeString());
  } catch (e) { set("status", "error: " + e.message); }
}
async function slow() {
  try { onTier(await get("/api/tier")); onSnapshots(await get("/api/snapshots")); } catch (e) { set("status", "error: " + e.message); }
}
tick(); slow();
setInterval(tick, 1000);
setInterval(slow, 5000);
