// Times llama.cpp (node-llama-cpp's prebuilt CPU build) on a GGUF file, the
// way `llama-bench` would, and prints one JSON object of tokens per second:
//   node bench.mjs MODEL.gguf THREADS
// prefill128 and prefill2048: a prompt of that many tokens in one batch,
// the KV cache cleared before each run (best of runs);
// decode1: one sequence generating 32 tokens after a 128-token prompt;
// decode16: 16 sequences (64-token prompts) generating 16 tokens each at
// once, node-llama-cpp batching their steps into one llama_decode
// (left out when BENCH_DECODE16=0).
// The prompts are fixed token ids below every vocabulary used.
import {getLlama} from "node-llama-cpp";

const [path, threads] = [process.argv[2], Number(process.argv[3] || 2)];
const runs = Number(process.env.BENCH_RUNS || 2);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath: path});
const vocab = Number(process.env.BENCH_VOCAB || 30000);
const tokens = (n, salt) => Array.from({length: n}, (_, i) => (i * 7919 + 13 + salt) % (vocab - 10) + 10);
const now = () => performance.now() / 1000;
const out = {threads};

{
	const ctx = await model.createContext({contextSize: 2304, batchSize: 2048, threads, flashAttention: false});
	const seq = ctx.getSequence();
	for (const n of [128, 2048]) {
		let best = 0;
		for (let r = 0; r < runs; r++) {
			await seq.clearHistory();
			const t0 = now();
			await seq.evaluateWithoutGeneratingNewTokens(tokens(n, r));
			best = Math.max(best, n / (now() - t0));
		}
		out[`prefill${n}`] = best;
	}
	// One stream: 32 tokens after a 128-token prompt.
	await seq.clearHistory();
	await seq.evaluateWithoutGeneratingNewTokens(tokens(128, 7));
	let got = 0;
	const t0 = now();
	for await (const _ of seq.evaluate([42], {temperature: 0})) {
		if (++got >= 32) break;
	}
	out.decode1 = got / (now() - t0);
	await ctx.dispose();
}
if (process.env.BENCH_DECODE16 !== "0") {
	const ctx = await model.createContext({contextSize: 16 * 128, batchSize: 1024, sequences: 16, threads, flashAttention: false});
	const seqs = Array.from({length: 16}, () => ctx.getSequence());
	await Promise.all(seqs.map((s, i) => s.evaluateWithoutGeneratingNewTokens(tokens(64, 100 + i))));
	const t0 = now();
	const counts = await Promise.all(seqs.map(async (s) => {
		let got = 0;
		for await (const _ of s.evaluate([42], {temperature: 0})) {
			if (++got >= 16) break;
		}
		return got;
	}));
	out.decode16 = counts.reduce((a, b) => a + b, 0) / (now() - t0);
	await ctx.dispose();
}
console.log(JSON.stringify(out));
await model.dispose();
await llama.dispose();
