// The official `openai` npm client against `strata serve`: non-streaming and streaming chat (the
// stream's text equals the non-streamed reply for the same seed), completions, and a 400 surfacing
// as the client's BadRequestError. Usage: node openai_client.mjs BASE_URL API_KEY
import { createRequire } from "node:module";
const require = createRequire(process.env.OPENAI_NPM_DIR + "/node_modules/");
const OpenAI = require("openai");

const [base, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + "/v1", apiKey, maxRetries: 0, timeout: 60000 });
let failed = 0, passed = 0;
function check(what, cond, detail = "") {
  if (cond) { passed++; console.log("ok: " + what); }
  else { failed++; console.error("FAIL: " + what + " " + detail); }
}

const req = {
  model: "tiny",
  messages: [{ role: "system", content: "You are helpful." }, { role: "user", content: "Write a haiku about the sea." }],
  max_tokens: 32, temperature: 0.8, top_p: 0.9, seed: 99,
};
const full = await client.chat.completions.create(req);
check("chat.completion object", full.object === "chat.completion", full.object);
const text = full.choices[0].message.content;
check("non-empty reply", typeof text === "string" && text.length > 0);
check("usage", full.usage.completion_tokens > 0 && full.usage.prompt_tokens > 0, JSON.stringify(full.usage));

const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
let streamed = "", chunks = 0, finish = null, usage = null;
for await (const chunk of stream) {
  if (chunk.object !== "chat.completion.chunk") throw new Error("bad chunk object " + chunk.object);
  if (chunk.usage) usage = chunk.usage;
  if (chunk.choices.length) {
    const c = chunk.choices[0];
    if (c.delta.content) { streamed += c.delta.content; chunks++; }
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check("stream text equals non-streamed text for the same seed", streamed === text,
      JSON.stringify({ streamed, text }));
check("stream came in several chunks", chunks > 1, String(chunks));
check("stream finish_reason", finish === full.choices[0].finish_reason, String(finish));
check("stream usage", usage && usage.completion_tokens === full.usage.completion_tokens, JSON.stringify(usage));

const comp = await client.completions.create({ model: "tiny", prompt: "The capital of France is", max_tokens: 8, temperature: 0 });
check("completions", comp.object === "text_completion" && comp.choices[0].text.length > 0 && comp.usage.completion_tokens === 8,
      JSON.stringify(comp));

try {
  await client.chat.completions.create({ ...req, temperature: 5 });
  check("400 raises BadRequestError", false, "no error");
} catch (e) {
  check("400 raises BadRequestError", e instanceof OpenAI.BadRequestError && e.status === 400 && /temperature/.test(e.message), String(e));
}
try {
  const bad = new OpenAI({ baseURL: base + "/v1", apiKey: "wrong", maxRetries: 0 });
  await bad.models.list();
  check("401 raises AuthenticationError", false, "no error");
} catch (e) {
  check("401 raises AuthenticationError", e instanceof OpenAI.AuthenticationError, String(e));
}
const models = await client.models.list();
check("models.list", models.data.length === 1 && models.data[0].id.length > 0);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
