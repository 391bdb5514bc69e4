// The page at "/": a chat that streams replies from /v1/chat/completions (SSE read with fetch), and
// a live monitor that polls /stats once a second. Plain HTML/JS, no build step, no external assets.
#include "server/http_server.h"

namespace strata::server {

const std::string& web_page_html() {
  static const std::string html = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>strata</title>
<style>
  :root { --bg:#0f1115; --panel:#181b22; --fg:#e6e6e6; --mut:#8a90a0; --acc:#5aa2ff; --me:#243247; }
  * { box-sizing: border-box; }
  body { margin:0; font:14px/1.45 system-ui, sans-serif; background:var(--bg); color:var(--fg);
         display:grid; grid-template-columns: 1fr 320px; height:100vh; }
  #chat { display:flex; flex-direction:column; min-width:0; }
  header { padding:10px 16px; border-bottom:1px solid #262a33; display:flex; gap:12px; align-items:center; }
  header b { font-size:16px; } header span { color:var(--mut); }
  #log { flex:1; overflow:auto; padding:16px; display:flex; flex-direction:column; gap:10px; }
  .msg { max-width:80%; padding:8px 12px; border-radius:10px; white-space:pre-wrap; word-break:break-word; }
  .user { align-self:flex-end; background:var(--me); }
  .assistant { align-self:flex-start; background:var(--panel); }
  .error { align-self:flex-start; background:#4a1d1d; }
  form { display:flex; gap:8px; padding:12px 16px; border-top:1px solid #262a33; }
  textarea { flex:1; resize:none; height:48px; background:var(--panel); color:var(--fg);
             border:1px solid #2c313c; border-radius:8px; padding:8px; font:inherit; }
  button { background:var(--acc); color:#fff; border:0; border-radius:8px; padding:0 16px; font:inherit; cursor:pointer; }
  button:disabled { opacity:.5; cursor:default; }
  aside { border-left:1px solid #262a33; padding:12px 16px; overflow:auto; background:#12141a; }
  aside h2 { font-size:13px; text-transform:uppercase; letter-spacing:.08em; color:var(--mut); margin:8px 0; }
  table { width:100%; border-collapse:collapse; } td { padding:3px 0; } td.v { text-align:right; font-variant-numeric:tabular-nums; }
  canvas { width:100%; height:80px; background:var(--panel); border-radius:6px; }
  label { display:block; color:var(--mut); margin-top:10px; font-size:12px; }
  input { width:100%; background:var(--panel); color:var(--fg); border:1px solid #2c313c; border-radius:6px; padding:5px; font:inherit; }
</style>
</head>
<body>
<section id="chat">
  <header><b>strata</b><span id="model">…</span><span id="health"></span></header>
  <div id="log"></div>
  <form id="form">
    <textarea id="input" placeholder="Message (Enter to send, Shift+Enter for a new line)"></textarea>
    <button id="send" type="submit">Send</button>
  </form>
</section>
<aside>
  <h2>Monitor</h2>
  <canvas id="spark" width="288" height="80"></canvas>
  <table>
    <tr><td>decode tok/s</td><td class="v" id="m-tps">–</td></tr>
    <tr><td>prefill tok/s</td><td class="v" id="m-pps">–</td></tr>
    <tr><td>running / parallel</td><td class="v" id="m-run">–</td></tr>
    <tr><td>queue</td><td class="v" id="m-queue">–</td></tr>
    <tr><td>parked conversations</td><td class="v" id="m-parked">–</td></tr>
    <tr><td>expert-cache hit rate</td><td class="v" id="m-hit">–</td></tr>
    <tr><td>KV memory</td><td class="v" id="m-kv">–</td></tr>
    <tr><td>process memory</td><td class="v" id="m-rss">–</td></tr>
    <tr><td>requests</td><td class="v" id="m-req">–</td></tr>
    <tr><td>tokens generated</td><td class="v" id="m-gen">–</td></tr>
    <tr><td>prompt tokens reused</td><td class="v" id="m-reuse">–</td></tr>
  </table>
  <h2>Settings</h2>
  <label>API key <input id="key" type="password" autocomplete="off"></label>
  <label>Temperature <input id="temp" type="number" min="0" max="2" step="0.1" value="0.7"></label>
  <label>Max tokens <input id="maxtok" type="number" min="1" placeholder="until the end (context size)"></label>
  <label><input id="reset" type="button" value="New conversation"></label>
</aside>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const history = [];
const keyInput = $("key");
keyInput.value = localStorage.getItem("strata-key") || "";
keyInput.addEventListener("change", () => localStorage.setItem("strata-key", keyInput.value));
function headers() {
  const h = { "Content-Type": "application/json" };
  if (keyInput.value) h["Authorization"] = "Bearer " + keyInput.value;
  return h;
}
function bubble(cls, text) {
  const d = document.createElement("div");
  d.className = "msg " + cls;
  d.textContent = text;
  $("log").appendChild(d);
  $("log").scrollTop = $("log").scrollHeight;
  return d;
}
async function send(text) {
  history.push({ role: "user", content: text });
  bubble("user", text);
  const out = bubble("assistant", "");
  out.dataset.state = "streaming";
  $("send").disabled = true;
  let reply = "";
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(),
      body: JSON.stringify(Object.assign({ messages: history, stream: true, temperature: Number($("temp").value) },
                                         $("maxtok").value ? { max_tokens: Number($("maxtok").value) } : {})),
    });
    if (!res.ok) {
      const body = await res.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || ("HTTP " + res.status));
    }
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, i); buf = buf.slice(i + 2);
        for (const line of ev.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message);
          const delta = j.choices && j.choices[0] && j.choices[0].delta;
          if (delta && delta.content) {
            reply += delta.content;
            out.textContent = reply;
            out.dataset.chunks = String(Number(out.dataset.chunks || 0) + 1);
            $("log").scrollTop = $("log").scrollHeight;
          }
        }
      }
    }
    history.push({ role: "assistant", content: reply });
    out.dataset.state = "done";
  } catch (e) {
    out.className = "msg error";
    out.textContent = "Error: " + e.message;
    out.dataset.state = "error";
    history.pop();
  } finally {
    $("send").disabled = false;
  }
}
$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text || $("send").disabled) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); }
});
$("reset").addEventListener("click", () => { history.length = 0; $("log").innerHTML = ""; });

const tps = [];
function mib(b) { return (b / 1048576).toFixed(1) + " MiB"; }
function draw() {
  const c = $("spark"), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const max = Math.max(1, ...tps);
  g.strokeStyle = "#5aa2ff"; g.lineWidth = 2; g.beginPath();
  tps.forEach((v, i) => {
    const x = (i / 59) * (c.width - 4) + 2, y = c.height - 4 - (v / max) * (c.height - 8);
    i ? g.lineTo(x, y) : g.moveTo(x, y);
  });
  g.stroke();
  g.fillStyle = "#8a90a0"; g.font = "11px sans-serif"; g.fillText("max " + max.toFixed(1) + " tok/s", 6, 12);
}
async function poll() {
  try {
    const r = await fetch("/stats", { headers: headers() });
    if (r.ok) {
      const s = await r.json();
      $("model").textContent = s.model + " · " + s.device + " · ctx " + s.n_ctx;
      $("m-tps").textContent = s.decode_tok_s.toFixed(1);
      $("m-pps").textContent = s.prefill_tok_s.toFixed(1);
      $("m-run").textContent = s.running + " / " + s.parallel;
      $("m-queue").textContent = s.queue_depth;
      $("m-parked").textContent = s.parked;
      $("m-hit").textContent = s.expert_cache_bytes ? (100 * s.expert_cache_hit_rate).toFixed(1) + " %" : "n/a (no expert cache)";
      $("m-kv").textContent = mib(s.kv_bytes_running + s.kv_bytes_parked);
      $("m-rss").textContent = mib(s.rss_bytes);
      $("m-req").textContent = s.requests_total;
      $("m-gen").textContent = s.generated_tokens_total;
      $("m-reuse").textContent = s.prompt_tokens_reused_total;
      tps.push(s.decode_tok_s); if (tps.length > 60) tps.shift();
      draw();
      $("health").textContent = s.draining ? "draining" : "";
    } else {
      $("health").textContent = r.status === 401 ? "set the API key" : "stats: HTTP " + r.status;
    }
  } catch (e) {
    $("health").textContent = "offline";
  }
}
poll(); setInterval(poll, 1000);
</script>
</body>
</html>
)HTML";
  return html;
}

}  // namespace strata::server
