// Loads the Cairn dashboard in the system's headless Chromium, reads the
// figures it shows, writes more data into the mount and checks that the
// page's counters and charts move; reads the heat map's cells per device;
// shows the history of a file saved again by rename over it; looks for
// markup or script injected by pool strings (the test pool's
// path and a snapshot name carry an <img onerror> payload); saves
// screenshots. Prints JSON for tests/service.rs to compare with
// `cairn info --json` and /api/heatmap.
// Usage: node dashboard.mjs URL MOUNTPOINT SCREENSHOT_DIR
// With CAIRN_METRICS_TOKEN set, the browser logs in as a user would at
// its prompt: any name, the token as password.
import { chromium } from "playwright-core";
import fs from "node:fs";
import path from "node:path";

const [url, mnt, outDir] = process.argv.slice(2);
// Debian's chromium only: playwright-core downloads no browser.
const exe = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].find((p) => fs.existsSync(p));
if (!exe) throw new Error("no chromium (scripts/deps.sh test installs it)");
const browser = await chromium.launch({ executablePath: exe, args: ["--no-sandbox"] });
try {
  // bypassCSP: Playwright's waitForFunction evaluates strings, which the
  // page's policy forbids; and without the policy's wall the injection
  // checks below test the page's own text-only insertion of pool strings.
  const token = process.env.CAIRN_METRICS_TOKEN;
  const httpCredentials = token ? { username: "cairn", password: token } : undefined;
  const page = await browser.newPage({ viewport: { width: 1280, height: 1000 }, bypassCSP: true, httpCredentials });
  const dialogs = [], errors = [];
  page.on("dialog", (d) => { dialogs.push(d.message()); d.dismiss(); });
  page.on("pageerror", (e) => errors.push(String(e)));
  // The payload's onerror sets window.__xss; nothing may.
  await page.goto(url);
  const val = (sel) => page.$eval(sel, (e) => Number(e.dataset.value ?? NaN));
  await page.waitForFunction(() => document.getElementById("files").dataset.value !== undefined &&
    document.querySelector("#devices tbody tr") && document.getElementById("timeline").dataset.count !== undefined &&
    document.querySelector("#heatmap canvas"), null, { timeout: 15000 });
  await page.waitForFunction(() => Number(document.getElementById("chart-throughput").dataset.points) >= 2, null, { timeout: 15000 });
  const row = await page.$eval("#devices tbody tr", (r) => ({ used: Number(r.dataset.used), size: Number(r.dataset.size) }));
  const out = {
    tid: await val("#tid"),
    files: await val("#files"),
    logical: await val("#logical"),
    snapshots: await val("#snapcount"),
    timeline: await page.$eval("#timeline", (e) => Number(e.dataset.count)),
    device0_used: row.used,
    device0_size: row.size,
    written_before: await val("#write-total"),
    points_before: await page.$eval("#chart-throughput", (e) => Number(e.dataset.points)),
    heatmap: await page.$$eval("#heatmap canvas", (cs) => cs.map((c) => ({
      device: Number(c.dataset.device), cells: Number(c.dataset.cells), drawn: Number(c.dataset.drawn),
      slots: Number(c.dataset.slots), per_cell: Number(c.dataset.perCell), segments: Number(c.dataset.used),
      painted: c.width > 0 && c.height > 0,
    }))),
    // What the page shows of the pool's strings, as text.
    pool_text: await page.$eval("#pool", (e) => e.textContent),
    path_cells: await page.$$eval("#devices td.path", (tds) => tds.map((t) => t.textContent)),
    state_cells: await page.$$eval("#devices td.state", (tds) => tds.map((t) => t.textContent)),
    snapshot_names: await page.$$eval("#timeline text.snap-name", (ts) => ts.map((t) => t.textContent)),
  };
  await page.screenshot({ path: path.join(outDir, "dashboard-before.png"), fullPage: true });
  // More writes: the page's counter and chart must follow without a reload.
  const buf = Buffer.alloc(4 << 20, 7);
  for (let i = 0; i < 3; i++) {
    fs.writeFileSync(path.join(mnt, `more${i}`), buf);
    await page.waitForTimeout(700);
  }
  await page.waitForFunction((w) => Number(document.getElementById("write-total").dataset.value) > w, out.written_before, { timeout: 15000 });
  await page.waitForTimeout(1500);
  out.written_after = await val("#write-total");
  out.points_after = await page.$eval("#chart-throughput", (e) => Number(e.dataset.points));
  // The history of a path: more0 as written, then saved again by rename
  // over it (each answer commits first, so that is a second version).
  const showHistory = async () => {
    await page.$eval("#hist-status", (e) => { e.textContent = ""; });
    await page.click("#hist-go");
    await page.waitForFunction(() => / versions?$/.test(document.getElementById("hist-status").textContent), null, { timeout: 15000 });
    return page.$$eval("#history tbody tr", (rs) => rs.map((r) => ({ ino: Number(r.cells[3].textContent), mark: r.cells[4].textContent })));
  };
  await page.fill("#hist-path", "more0");
  out.history_before = await showHistory();
  fs.writeFileSync(path.join(mnt, "more0.tmp"), "saved again");
  fs.renameSync(path.join(mnt, "more0.tmp"), path.join(mnt, "more0"));
  out.history_after = await showHistory();
  // Injection: no element the payload would make, no script it would run.
  out.injected_imgs = await page.$$eval("img", (l) => l.length);
  out.injected_onerror = await page.$$eval("[onerror]", (l) => l.length);
  out.xss = await page.evaluate(() => window.__xss ?? null);
  out.dialogs = dialogs;
  out.page_errors = errors;
  await page.screenshot({ path: path.join(outDir, "dashboard.png"), fullPage: true });
  process.stdout.write(JSON.stringify(out) + "\n");
} finally {
  await browser.close();
}
