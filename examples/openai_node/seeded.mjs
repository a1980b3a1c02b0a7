// Seeded sampling through the official `openai` npm client, against a model
// whose next-token distribution is broad (the trained models/target on a CPU
// worker; tests/integration/examples_test.cc starts it):
//
//   TESSERA_BASE_URL=http://127.0.0.1:8000/v1 node seeded.mjs
//
// At temperature 1 the same seed must give the same text, and a different
// seed a different text, on both /v1/chat/completions and /v1/completions.
// Exits 1 on the first failed check.
//
// Why the "different seed" check does not pass or fail by luck: each reply
// is 24 tokens (ignore_eos keeps short replies out). Two independent samples
// agree at one step with probability sum(p^2), which at models/target's
// 2.81 nats/token (held-out loss) is typically well under 1/2; the texts of
// two seeds coincide only if all 24 steps agree, so with a probability far
// below 1e-6. And a broken seed (ignored, or fixed) makes the first or the
// second check fail: the same request twice would differ, or two seeds agree.
import OpenAI from "openai";

const baseURL = process.env.TESSERA_BASE_URL ?? "http://127.0.0.1:8000/v1";
const client = new OpenAI({ baseURL, apiKey: process.env.TESSERA_API_KEY ?? "none" });
const model = process.env.TESSERA_MODEL ?? "default";
const kTokens = 24;

let failures = 0;
function expect(what, ok, got) {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}${ok ? "" : `: got ${JSON.stringify(got)}`}`);
  if (!ok) failures++;
}

// ignore_eos is a common extension (vLLM's); the client sends it as given.
const sampling = { temperature: 1, top_p: 1, max_tokens: kTokens, ignore_eos: true };

async function chat(seed) {
  const r = await client.chat.completions.create({
    model, seed, ...sampling,
    messages: [{ role: "user", content: "def parse_args(argv):" }],
  });
  return { text: r.choices[0].message.content, tokens: r.usage.completion_tokens };
}

async function complete(seed) {
  const r = await client.completions.create({ model, seed, ...sampling, prompt: "import os\n\n" });
  return { text: r.choices[0].text, tokens: r.usage.completion_tokens };
}

for (const [name, call] of [["chat", chat], ["completions", complete]]) {
  const a = await call(1234), b = await call(1234), c = await call(4321);
  console.log(`${name}: seed 1234 -> ${JSON.stringify(a.text)}; seed 4321 -> ${JSON.stringify(c.text)}`);
  expect(`${name}: ${kTokens} tokens each`, [a, b, c].every((r) => r.tokens === kTokens), [a, b, c]);
  expect(`${name}: the same seed gives the same text`, a.text === b.text, [a.text, b.text]);
  expect(`${name}: another seed gives another text`, a.text !== c.text, [a.text, c.text]);
}

if (failures > 0) {
  console.log(`${failures} check(s) failed`);
  process.exit(1);
}
console.log("all checks passed");
