// Shared by the JavaScript oracles (tests/chat/oracle, tests/tokenizer/oracle):
// their command-line flags, and loading packages from the node_modules that
// tests/oracle/npm_install.sh installed into a work directory.
"use strict";

const fs = require("fs");
const path = require("path");
const { createRequire } = require("module");

// The value after `--<name>`; exits 2 naming `program` and the flag if absent.
function arg(program, name) {
  const i = process.argv.indexOf(`--${name}`);
  if (i < 0 || i + 1 >= process.argv.length) {
    console.error(`${program}: missing --${name}`);
    process.exit(2);
  }
  return process.argv[i + 1];
}

// A require() that resolves packages in `modules` (a node_modules directory).
function requireFrom(modules) {
  return createRequire(path.join(path.resolve(modules), "_oracle_anchor.js"));
}

// The version of package `pkg` installed in `modules`. Read by path:
// package.json is not in every package's "exports".
function packageVersion(modules, pkg) {
  return JSON.parse(fs.readFileSync(path.join(path.resolve(modules), pkg, "package.json"), "utf8"))
    .version;
}

// What a corpus oracle is run with: --modules (node_modules dir), --corpus
// and --out; `req` resolves packages in the modules, `version` names theirs.
function corpusOracle(program) {
  const modules = path.resolve(arg(program, "modules"));
  return {
    modules,
    corpusPath: arg(program, "corpus"),
    outPath: arg(program, "out"),
    req: requireFrom(modules),
    version: (pkg) => packageVersion(modules, pkg),
  };
}

module.exports = { arg, requireFrom, packageVersion, corpusOracle };
