// Drives the page at "/" in headless Chromium through ChromeDriver (the W3C WebDriver protocol,
// spoken with Node's fetch: no npm package): types a message, sends it, watches the reply stream in,
// checks the live monitor, and takes a screenshot that must show a rendered page.
// Usage: node webpage.mjs BASE_URL OUT_DIR
import { spawn } from "node:child_process";
import { writeFileSync, mkdtempSync } from "node:fs";
import { createServer } from "node:net";
import { inflateSync } from "node:zlib";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [base, outDir] = process.argv.slice(2);
let failed = 0, passed = 0;
function check(what, cond, detail = "") {
  if (cond) { passed++; console.log("ok: " + what); } else { failed++; console.error("FAIL: " + what + " " + detail); }
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const freePort = () => new Promise((res) => { const s = createServer(); s.listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => res(p)); }); });

const port = await freePort();
const driver = spawn("/usr/bin/chromedriver", [`--port=${port}`, "--allowed-ips=127.0.0.1"], { stdio: "ignore" });
const wd = `http://127.0.0.1:${port}`;
async function call(method, path, body) {
  const r = await fetch(wd + path, { method, headers: { "Content-Type": "application/json" }, body: body ? JSON.stringify(body) : undefined });
  const j = await r.json();
  if (!r.ok) throw new Error(`${method} ${path}: ${JSON.stringify(j.value)}`);
  return j.value;
}
let session = null;
try {
  for (let i = 0; i < 100; i++) { try { await call("GET", "/status"); break; } catch { await sleep(100); } }
  const profile = mkdtempSync(join(tmpdir(), "strata-chromium-"));
  const s = await call("POST", "/session", { capabilities: { alwaysMatch: { browserName: "chrome", "goog:chromeOptions": {
    binary: "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", `--user-data-dir=${profile}`, "--window-size=1280,800"] } } } });
  session = s.sessionId;
  const S = `/session/${session}`;
  const exec = (script, args = []) => call("POST", `${S}/execute/sync`, { script, args });
  const find = async (css) => Object.values(await call("POST", `${S}/element`, { using: "css selector", value: css }))[0];

  await call("POST", `${S}/url`, { url: base + "/" });
  check("page title", (await call("GET", `${S}/title`)) === "strata");
  const input = await find("#input");
  await call("POST", `${S}/element/${input}/value`, { text: "Hello! Tell me about the weather." });
  await call("POST", `${S}/element/${await find("#send")}/click`, {});

  // Watch the reply: it must grow over several polls (streamed), then finish.
  const seen = new Set();
  let state = null;
  for (let i = 0; i < 600; i++) {
    state = await exec(`const b = document.querySelectorAll('.msg.assistant, .msg.error');
      const l = b[b.length - 1]; return l ? {cls: l.className, state: l.dataset.state, text: l.textContent, chunks: Number(l.dataset.chunks || 0)} : null;`);
    if (state && state.text) seen.add(state.text.length);
    if (state && state.state && state.state !== "streaming") break;
    await sleep(20);
  }
  check("the user's message is shown", (await exec("return document.querySelector('.msg.user').textContent")) === "Hello! Tell me about the weather.");
  check("reply finished without error", state && state.state === "done" && state.cls === "msg assistant", JSON.stringify(state));
  check("reply has text", state && state.text.length > 0);
  check("reply arrived in several stream chunks", state && state.chunks > 1, JSON.stringify(state));
  console.log(`reply: ${state && state.chunks} chunks, ${seen.size} distinct lengths seen while polling`);

  // The monitor polls /stats once a second.
  await sleep(1500);
  const mon = await exec(`return {gen: document.getElementById('m-gen').textContent, tps: document.getElementById('m-tps').textContent,
      rss: document.getElementById('m-rss').textContent, hit: document.getElementById('m-hit').textContent, model: document.getElementById('model').textContent}`);
  check("monitor counts generated tokens", Number(mon.gen) > 0, JSON.stringify(mon));
  check("monitor shows tok/s", /^\d+(\.\d)?$/.test(mon.tps), JSON.stringify(mon));
  check("monitor shows memory", / MiB$/.test(mon.rss), JSON.stringify(mon));
  check("monitor shows the expert-cache hit rate (n/a on CPU)", mon.hit.length > 0, JSON.stringify(mon));
  check("header shows the model", mon.model.includes("tiny-qwen3moe"), JSON.stringify(mon));

  const png = Buffer.from(await call("GET", `${S}/screenshot`), "base64");
  writeFileSync(join(outDir, "page.png"), png);
  const img = decodePng(png);
  check("screenshot is 1280 wide", img.width === 1280, String(img.width));
  // A rendered page: the dark background dominates and there are many other colours (text, bubbles).
  const counts = new Map();
  for (let i = 0; i < img.pixels.length; i += 4) {
    const k = (img.pixels[i] << 16) | (img.pixels[i + 1] << 8) | img.pixels[i + 2];
    counts.set(k, (counts.get(k) || 0) + 1);
  }
  // Which of the page's own colours dominates depends on the reply's length (a long reply fills the
  // view with the assistant bubble's panel colour), so: the top colour is one of the page's surfaces,
  // and the body background is visible.
  const top = [...counts.entries()].sort((a, b) => b[1] - a[1])[0];
  const surfaces = [0x0f1115, 0x181b22, 0x12141a];
  check("screenshot's dominant colour is one of the page's surfaces", surfaces.includes(top[0]), top[0].toString(16));
  const bgShare = (counts.get(0x0f1115) || 0) / (img.pixels.length / 4);
  check("screenshot shows the page background", bgShare > 0.02, bgShare.toFixed(3));
  check("screenshot shows content (many colours)", counts.size > 50, String(counts.size));
} catch (e) {
  failed++;
  console.error("FAIL: " + e.stack);
} finally {
  if (session) await call("DELETE", `/session/${session}`).catch(() => {});
  driver.kill();
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);

// Minimal PNG decoder (8-bit RGB/RGBA, non-interlaced: what Chromium writes) -> RGBA pixels.
function decodePng(buf) {
  let pos = 8, width = 0, height = 0, ctype = 0;
  const idat = [];
  while (pos < buf.length) {
    const len = buf.readUInt32BE(pos), type = buf.toString("ascii", pos + 4, pos + 8);
    const data = buf.subarray(pos + 8, pos + 8 + len);
    if (type === "IHDR") { width = data.readUInt32BE(0); height = data.readUInt32BE(4); ctype = data[9]; if (data[8] !== 8 || data[12] !== 0) throw new Error("unsupported PNG"); }
    if (type === "IDAT") idat.push(data);
    pos += 12 + len;
  }
  const bpp = ctype === 6 ? 4 : ctype === 2 ? 3 : 0;
  if (!bpp) throw new Error("unsupported PNG colour type " + ctype);
  const raw = inflateSync(Buffer.concat(idat)), stride = width * bpp;
  const out = Buffer.alloc(width * height * 4), prev = Buffer.alloc(stride), cur = Buffer.alloc(stride);
  for (let y = 0; y < height; y++) {
    const f = raw[y * (stride + 1)];
    raw.copy(cur, 0, y * (stride + 1) + 1, (y + 1) * (stride + 1));
    for (let x = 0; x < stride; x++) {
      const a = x >= bpp ? cur[x - bpp] : 0, b = prev[x], c = x >= bpp ? prev[x - bpp] : 0;
      let p = 0;
      if (f === 1) p = a; else if (f === 2) p = b; else if (f === 3) p = (a + b) >> 1;
      else if (f === 4) { const pa = Math.abs(b - c), pb = Math.abs(a - c), pc = Math.abs(a + b - 2 * c); p = pa <= pb && pa <= pc ? a : pb <= pc ? b : c; }
      cur[x] = (cur[x] + p) & 255;
    }
    for (let x = 0; x < width; x++) {
      out[(y * width + x) * 4] = cur[x * bpp]; out[(y * width + x) * 4 + 1] = cur[x * bpp + 1];
      out[(y * width + x) * 4 + 2] = cur[x * bpp + 2]; out[(y * width + x) * 4 + 3] = bpp === 4 ? cur[x * bpp + 3] : 255;
    }
    cur.copy(prev);
  }
  return { width, height, pixels: out };
}
