// Loads GGUF files with llama.cpp (npm node-llama-cpp, prebuilt CPU binaries) and greedily generates 8
// tokens from a fixed prompt: proof that llama.cpp accepts files written by `strata quantize`.
//   npm install node-llama-cpp@3.21.1 (in any directory), then: node tools/llama_load_check.mjs A.gguf B.gguf ...
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.warn});
for (const path of process.argv.slice(2)) {
  const model = await llama.loadModel({modelPath: path});
  const ctx = await model.createContext({contextSize: 128});
  const seq = ctx.getSequence();
  const prompt = [10, 20, 30, 40, 50, 60, 70, 80];
  const out = [];
  for await (const t of seq.evaluate(prompt, {temperature: 0})) { out.push(t); if (out.length >= 8) break; }
  console.log(path, "loaded; greedy ids:", out.join(" "));
  await ctx.dispose(); await model.dispose();
}
