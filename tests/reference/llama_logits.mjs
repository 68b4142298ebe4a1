// llama.cpp (npm node-llama-cpp, its prebuilt CPU build) on a GGUF file: its tokenization of
// given strings and its next-token logits at every position of a token sequence.
// usage: node llama_logits.mjs PACKAGE_DIR MODEL.gguf SPEC.json OUT_PREFIX
//   PACKAGE_DIR: where scripts/fetch_interop_peers.sh installed node-llama-cpp@3.22.1
//   SPEC: {"tokens": [ids...], "strings": ["...", ...]}
//   OUT_PREFIX.json: {"n_vocab", "positions", "tokenized": [[ids...], ...]}
//   OUT_PREFIX.f32:  positions x n_vocab float32 logits, row-major
import fs from "node:fs";
import path from "node:path";
import {pathToFileURL} from "node:url";

const [pkgDir, modelPath, specPath, outPrefix] = process.argv.slice(2);
const entry = path.join(pkgDir, "node_modules", "node-llama-cpp", "dist", "index.js");
const {getLlama} = await import(pathToFileURL(entry).href);
const spec = JSON.parse(fs.readFileSync(specPath, "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath});
const tokenized = spec.strings.map((s) => Array.from(model.tokenize(s, false)));
// An F32 key/value cache and no flash attention (with either, llama.cpp's logits move by
// ~2e-2); a context larger than what is evaluated (equal to it, llama.cpp shifts it).
const ctx = await model.createContext({
  contextSize: spec.tokens.length + 16,
  flashAttention: false,
  experimentalKvCacheKeyType: "F32",
  experimentalKvCacheValueType: "F32",
});
const seq = ctx.getSequence();
const res = await seq.controlledEvaluate(spec.tokens.map((t) => [t, {generateNext: {logits: true}}]));
const V = spec.vocab ?? 50257;
const out = new Float32Array(spec.tokens.length * V);
res.forEach((r, i) => {
  for (const [tok, logit] of r.next.logits) out[i * V + tok] = logit;
});
fs.writeFileSync(outPrefix + ".f32", Buffer.from(out.buffer));
fs.writeFileSync(outPrefix + ".json", JSON.stringify({n_vocab: V, positions: spec.tokens.length, tokenized}));
await ctx.dispose();
await model.dispose();
await llama.dispose();
