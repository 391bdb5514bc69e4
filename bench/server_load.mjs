// Load run against a running `strata serve`: N concurrent chat clients (streaming, multi-turn
// conversations that reuse their KV, random lengths) for a bounded time; samples the server's
// resident memory every second. Prints a JSON summary; exit 1 on any error or growing memory.
// Usage: node server_load.mjs BASE_URL SERVER_PID CLIENTS SECONDS
import { readFileSync } from "node:fs";

const [base, pidArg, clientsArg, secondsArg] = process.argv.slice(2);
const pid = Number(pidArg), clients = Number(clientsArg || 8), seconds = Number(secondsArg || 60);
const deadline = Date.now() + seconds * 1000;
const topics = ["the sea", "a robot", "mountains", "coffee", "a city at night", "old books", "rain", "trains"];
let seed = 12345;
const rnd = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32);

const stats = { requests: 0, errors: 0, error_samples: [], completion_tokens: 0, prompt_tokens: 0,
                cached_tokens: 0, ttft_ms: [], latency_ms: [] };

function rssBytes() {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) * 1024 : 0;
}

async function streamChat(messages, maxTokens) {
  const t0 = performance.now();
  const res = await fetch(base + "/v1/chat/completions", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ messages, max_tokens: maxTokens, temperature: 0.8, stream: true,
                           stream_options: { include_usage: true } }),
  });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const dec = new TextDecoder();
  let buf = "", text = "", usage = null, done = false, ttft = null;
  for await (const part of res.body) {
    buf += dec.decode(part, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, i); buf = buf.slice(i + 2);
      if (!ev.startsWith("data: ")) throw new Error("bad SSE event: " + ev.slice(0, 80));
      const data = ev.slice(6);
      if (data === "[DONE]") { done = true; continue; }
      const j = JSON.parse(data);
      if (j.error) throw new Error("stream error: " + j.error.message);
      if (j.usage) usage = j.usage;
      const c = j.choices[0];
      if (c && c.delta.content) { if (ttft === null) ttft = performance.now() - t0; text += c.delta.content; }
    }
  }
  if (!done || !usage) throw new Error("stream ended without [DONE]/usage");
  return { text, usage, ttft: ttft ?? performance.now() - t0, latency: performance.now() - t0 };
}

async function client(id) {
  let history = [];
  while (Date.now() < deadline) {
    if (history.length === 0 || history.length > 8 || rnd() < 0.3)
      history = [{ role: "system", content: `You are client ${id}. Be brief.` }];
    history.push({ role: "user", content: `Tell me about ${topics[Math.floor(rnd() * topics.length)]}.` });
    try {
      const r = await streamChat(history, 16 + Math.floor(rnd() * 48));
      history.push({ role: "assistant", content: r.text });
      stats.requests++;
      stats.completion_tokens += r.usage.completion_tokens;
      stats.prompt_tokens += r.usage.prompt_tokens;
      stats.cached_tokens += r.usage.prompt_tokens_details.cached_tokens;
      stats.ttft_ms.push(r.ttft);
      stats.latency_ms.push(r.latency);
    } catch (e) {
      stats.errors++;
      if (stats.error_samples.length < 5) stats.error_samples.push(String(e.message || e));
      history = [];
    }
  }
}

const rss = [];
const t0 = Date.now();
const sampler = setInterval(() => rss.push({ t: (Date.now() - t0) / 1000, rss: rssBytes() }), 1000);
rss.push({ t: 0, rss: rssBytes() });
await Promise.all(Array.from({ length: clients }, (_, i) => client(i)));
clearInterval(sampler);
rss.push({ t: (Date.now() - t0) / 1000, rss: rssBytes() });

const pct = (a, p) => { const s = [...a].sort((x, y) => x - y); return s.length ? s[Math.min(s.length - 1, Math.floor(p * s.length))] : 0; };
const median = (a) => pct(a, 0.5);
// Flat memory: the median RSS of the last quarter vs the second quarter (after warm-up).
const q = Math.max(1, Math.floor(rss.length / 4));
const early = median(rss.slice(q, 2 * q).map((x) => x.rss)), late = median(rss.slice(-q).map((x) => x.rss));
const growth = early ? (late - early) / early : 0;
const elapsed = (Date.now() - t0) / 1000;
const summary = {
  clients, seconds: elapsed, requests: stats.requests, errors: stats.errors, error_samples: stats.error_samples,
  completion_tokens: stats.completion_tokens, tok_per_s: stats.completion_tokens / elapsed,
  prompt_tokens: stats.prompt_tokens, cached_prompt_tokens: stats.cached_tokens,
  cached_fraction: stats.prompt_tokens ? stats.cached_tokens / stats.prompt_tokens : 0,
  ttft_ms_p50: pct(stats.ttft_ms, 0.5), ttft_ms_p95: pct(stats.ttft_ms, 0.95),
  latency_ms_p50: pct(stats.latency_ms, 0.5), latency_ms_p95: pct(stats.latency_ms, 0.95),
  rss_mib_start: rss[0].rss / 2 ** 20, rss_mib_q2_median: early / 2 ** 20, rss_mib_last_q_median: late / 2 ** 20,
  rss_mib_max: Math.max(...rss.map((x) => x.rss)) / 2 ** 20, rss_growth_fraction: growth,
  rss_samples_mib: rss.map((x) => Math.round(x.rss / 2 ** 20 * 10) / 10),
};
// One field per line, the memory samples on one line.
console.log(JSON.stringify(summary, null, 1).replace(/\[\s+([\d.,\s]+?)\s+\]/g, (_, xs) => "[" + xs.replace(/\s+/g, " ") + "]"));
const flat = growth < 0.05;
if (stats.errors || !stats.requests || !flat) {
  console.error(`load run FAILED: errors=${stats.errors} requests=${stats.requests} rss growth=${(100 * growth).toFixed(1)}%`);
  process.exit(1);
}
