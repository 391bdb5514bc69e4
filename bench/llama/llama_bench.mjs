// llama.cpp baseline for bench/compare: the prebuilt CPU llama.cpp of the npm package node-llama-cpp
// (no build, no network). Same protocol as `strata bench`: ppN = N pseudo-random tokens evaluated from
// an empty context in batches of --batch (logits of the last token only); tgN = N tokens generated
// greedily one at a time from a one-token prompt (each step computes the logits, as strata's does).
// Prints one JSON line.
//   node llama_bench.mjs MODEL.gguf [-p 512] [-n 128] [-t THREADS] [--batch 512] [--reps 1]
import {getLlama} from "node-llama-cpp";

const args = process.argv.slice(2);
const opt = {p: 512, n: 128, t: 2, batch: 512, reps: 1, vocab: 0};
let model_path = null;
for (let i = 0; i < args.length; ++i) {
  const a = args[i];
  if (a === "-p") opt.p = +args[++i];
  else if (a === "-n") opt.n = +args[++i];
  else if (a === "-t") opt.t = +args[++i];
  else if (a === "--batch") opt.batch = +args[++i];
  else if (a === "--reps") opt.reps = +args[++i];
  else if (a === "--vocab") opt.vocab = +args[++i];
  else model_path = a;
}
if (!model_path || !(opt.vocab > 0)) {
  console.error("usage: node llama_bench.mjs MODEL.gguf --vocab N_VOCAB [-p N] [-n N] [-t N] [--batch N] [--reps N]");
  process.exit(2);
}

const llama = await getLlama({gpu: false, build: "never", maxThreads: opt.t, logLevel: "error"});
const model = await llama.loadModel({modelPath: model_path, gpuLayers: 0});
const ctx_size = Math.max(opt.p, opt.n) + 16;
const context = await model.createContext({contextSize: ctx_size, batchSize: opt.batch,
                                           threads: {ideal: opt.t, min: opt.t}, sequences: 1});
const seq = context.getSequence();
// Pseudo-random ids below the vocabulary size (an LCG; the ids need not equal strata's).
let state = 1234n;
const vocab = opt.vocab;
function rand_tok() {
  state = (state * 6364136223846793005n + 1442695040888963407n) & ((1n << 64n) - 1n);
  return Number((state >> 33n) % BigInt(vocab));
}
let pp = 0, tg = 0;
for (let r = 0; r < opt.reps; ++r) {
  if (opt.p > 0) {
    await seq.clearHistory();
    const toks = Array.from({length: opt.p}, rand_tok);
    const t0 = process.hrtime.bigint();
    // The last token's logits are computed, as in strata bench: evaluate and take one generated token.
    for await (const _ of seq.evaluate(toks, {temperature: 0})) break;
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    pp = Math.max(pp, opt.p / s);
  }
  if (opt.n > 0) {
    await seq.clearHistory();
    const t0 = process.hrtime.bigint();
    let n = 0;
    for await (const _ of seq.evaluate([rand_tok()], {temperature: 0})) if (++n >= opt.n) break;
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    tg = Math.max(tg, n / s);
  }
}
console.log(JSON.stringify({engine: "llama.cpp (node-llama-cpp " + "3.21.1" + ", prebuilt CPU)",
                            model: model_path, threads: opt.t, batch: opt.batch, pp: opt.p,
                            pp_tok_s: pp, tg: opt.n, tg_tok_s: tg}));
await context.dispose();
await model.dispose();
