// Prints llama.cpp's greedy continuation of a prompt given as token ids:
//   node greedy.mjs MODEL.gguf '[1,2,3]' N
// as a JSON list of N token ids (the prompt not included). The CPU build
// shipped with node-llama-cpp is used; nothing is compiled or downloaded.
import {getLlama} from "node-llama-cpp";

const [path, ids, n] = [process.argv[2], JSON.parse(process.argv[3]), Number(process.argv[4])];
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath: path});
// K and V in f32, as Tandem's f32 KV cache keeps them (llama.cpp's default
// is f16).
const context = await model.createContext({
    contextSize: 256, batchSize: 256, flashAttention: false,
    experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
});
const seq = context.getSequence();
const out = [];
if (n > 0) {
    for await (const tok of seq.evaluate(ids, {temperature: 0})) {
        out.push(tok);
        if (out.length >= n) break;
    }
}
console.log(JSON.stringify(out));
await context.dispose();
await model.dispose();
await llama.dispose();
