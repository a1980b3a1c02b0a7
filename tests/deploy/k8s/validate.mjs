// Offline validation of Kubernetes manifests (the output of `kubectl
// kustomize`) against the API schemas, with no cluster:
//
//  1. schema: every document is checked by kubernetes-models (the
//     Kubernetes OpenAPI schemas compiled to JSON-schema validators: types,
//     required fields, enums, formats) or, for ServiceMonitor / PodMonitor,
//     by @kubernetes-models/prometheus-operator (the operator's CRD
//     schemas). A kind neither package knows is an error.
//  2. unknown fields: the OpenAPI schemas allow extra properties, so a
//     misspelt field (terminationGracePeriodSecond) would pass step 1. Each
//     document is also type-checked by the TypeScript compiler against the
//     same packages' type declarations, whose excess-property check rejects
//     any field the API does not define.
//  3. with --tessera: the invariants the deployment relies on (see
//     checkTessera below).
//
// usage: node validate.mjs [--tessera] [--expect-invalid] [--expect=TEXT]... FILE.yaml...
//   Run from a directory whose node_modules holds the packages of
//   package.json (installed by `npm ci`). Exit 0 when every document is
//   valid. The self-tests that prove the checks can fail:
//   --expect-invalid: exit 0 only when every document is rejected;
//   --tessera --expect-invalid: the documents are valid but the Tessera
//   checks must report errors; each --expect=TEXT must occur in one.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseAllDocuments } from "yaml";

const args = process.argv.slice(2);
const tessera = args.includes("--tessera");
const expectInvalid = args.includes("--expect-invalid");
const expected = args.filter((a) => a.startsWith("--expect=")).map((a) => a.slice(9));
const files = args.filter((a) => !a.startsWith("--"));
if (files.length === 0) {
  console.error("usage: node validate.mjs [--tessera] [--expect-invalid] FILE.yaml...");
  process.exit(2);
}

// apiVersion + kind -> module of the model class.
function modulePath(apiVersion, kind) {
  if (!/^[A-Z][A-Za-z0-9]*$/.test(kind)) return null;
  const slash = apiVersion.indexOf("/");
  const group = slash < 0 ? "" : apiVersion.slice(0, slash);
  const version = slash < 0 ? apiVersion : apiVersion.slice(slash + 1);
  if (!/^v[0-9a-z]+$/.test(version) || !/^[a-z0-9.-]*$/.test(group)) return null;
  if (group === "monitoring.coreos.com") {
    return `@kubernetes-models/prometheus-operator/${group}/${version}/${kind}`;
  }
  return group === "" ? `kubernetes-models/${version}/${kind}`
                      : `kubernetes-models/${group}/${version}/${kind}`;
}

// Every document: {file, index, name, obj, errors[], module}.
const docs = [];
for (const file of files) {
  const text = readFileSync(file, "utf8");
  const parsed = parseAllDocuments(text);
  let index = 0;
  for (const d of parsed) {
    const obj = d.toJS();
    const errors = d.errors.map((e) => `YAML: ${e.message}`);
    if (obj === null && errors.length === 0) continue;  // empty document
    const doc = { file, index: index++, obj, errors, module: null };
    doc.name = obj && typeof obj === "object"
      ? `${obj.kind ?? "?"}/${obj.metadata?.name ?? "?"}` : "?";
    docs.push(doc);
  }
}

// 1. Schema validation.
for (const doc of docs) {
  const o = doc.obj;
  if (doc.errors.length) continue;
  if (!o || typeof o !== "object" || Array.isArray(o)) {
    doc.errors.push("not a mapping");
    continue;
  }
  if (typeof o.apiVersion !== "string" || typeof o.kind !== "string") {
    doc.errors.push("apiVersion and kind must be strings");
    continue;
  }
  const path = modulePath(o.apiVersion, o.kind);
  let cls = null;
  if (path) {
    try {
      cls = (await import(path))[o.kind];
    } catch {
      cls = null;
    }
  }
  if (typeof cls !== "function") {
    doc.errors.push(`unknown kind ${o.kind} in ${o.apiVersion} (no schema for it)`);
    continue;
  }
  doc.module = path;
  if (typeof o.metadata?.name !== "string" || o.metadata.name === "") {
    doc.errors.push("metadata.name is required");
  }
  try {
    new cls(o).validate();
  } catch (e) {
    doc.errors.push(`schema: ${e.message}`);
  }
}

// 2. Unknown fields: one TypeScript file, one typed constant per document.
{
  const typed = docs.filter((d) => d.module && d.errors.length === 0);
  if (typed.length) {
    const dir = mkdtempSync(join(process.cwd(), "tscheck-"));
    const lines = [];
    const lineOf = new Map();
    typed.forEach((d, i) => {
      lines.push(`import type { I${d.obj.kind} as T${i} } from ${JSON.stringify(d.module)};`);
    });
    typed.forEach((d, i) => {
      lineOf.set(lines.length + 1, d);
      lines.push(`export const d${i}: T${i} = ${JSON.stringify(d.obj)};`);
    });
    const src = join(dir, "manifests.ts");
    writeFileSync(src, lines.join("\n") + "\n");
    let out = "";
    try {
      execFileSync(process.execPath,
        ["node_modules/typescript/bin/tsc", "--noEmit", "--strict", "--skipLibCheck",
         "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022",
         "--pretty", "false", src],
        { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    } catch (e) {
      out = `${e.stdout ?? ""}${e.stderr ?? ""}`;
      if (!out.trim()) out = `tsc failed: ${e.message}`;
    }
    rmSync(dir, { recursive: true, force: true });
    for (const line of out.split("\n")) {
      if (!line.trim()) continue;
      const m = line.match(/manifests\.ts\((\d+),\d+\): error (TS\d+: .*)$/);
      const d = m && lineOf.get(Number(m[1]));
      if (d) {
        d.errors.push(`fields: ${m[2].replace(/"/g, "")}`);
      } else if (/error/.test(line)) {
        // An error outside the documents (a missing package, a bad import)
        // must not pass silently.
        console.log(`FAIL: type check: ${line}`);
        process.exitCode = 1;
      }
    }
  }
}

// 3. Tessera invariants over one rendered overlay.
const SERVICE_NAMES = {
  "tessera-router": "tessera.v1.Inference",
  "tessera-worker": "tessera.v1.Worker",
  "tessera-drafter": "tessera.v1.Drafter",
};

// An absl duration flag value ("30s", "1m30s", "500ms") in seconds; NaN if
// it does not parse.
function durationSeconds(s) {
  const unit = { h: 3600, m: 60, s: 1, ms: 1e-3, us: 1e-6, ns: 1e-9 };
  const text = String(s);
  if (!/^(\d+(\.\d+)?(h|ms|us|ns|m|s))+$/.test(text)) return NaN;
  let total = 0;
  for (const m of text.matchAll(/(\d+(?:\.\d+)?)(h|ms|us|ns|m|s)/g)) total += Number(m[1]) * unit[m[2]];
  return total;
}

function parseFlags(text) {
  const flags = {};
  for (let line of text.split("\n")) {
    line = line.trim();
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^--([a-z_0-9]+)(?:=(.*))?$/);
    if (m) flags[m[1]] = m[2] ?? "true";
  }
  return flags;
}

function checkTessera(all) {
  const errs = [];
  const byKind = (k) => all.filter((d) => d.obj?.kind === k).map((d) => d.obj);
  const configMaps = new Map(byKind("ConfigMap").map((c) => [c.metadata.name, c]));
  const services = byKind("Service");
  const labelsMatch = (sel, labels) =>
    sel && Object.entries(sel).every(([k, v]) => labels?.[k] === v);
  const workloads = [...byKind("Deployment"), ...byKind("StatefulSet")];
  const seen = new Set();

  for (const w of workloads) {
    const where = `${w.kind}/${w.metadata.name}`;
    const pod = w.spec.template.spec;
    for (const c of pod.containers) {
      const binary = (c.command ?? [])[0]?.split("/").pop();
      if (!SERVICE_NAMES[binary]) continue;
      seen.add(binary);
      // Flags: the flag file from its ConfigMap volume, then the args.
      const flags = {};
      for (const a of c.args ?? []) {
        const m = a.match(/^--flagfile=(.*)$/);
        if (!m) continue;
        const mount = (c.volumeMounts ?? []).find((v) => m[1].startsWith(v.mountPath + "/"));
        const vol = mount && pod.volumes.find((v) => v.name === mount.name);
        const cm = vol?.configMap && configMaps.get(vol.configMap.name);
        const key = m[1].slice(mount?.mountPath.length + 1);
        if (!cm || cm.data?.[key] === undefined) {
          errs.push(`${where}: --flagfile=${m[1]} is not a key of a mounted ConfigMap`);
          continue;
        }
        Object.assign(flags, parseFlags(cm.data[key]));
      }
      Object.assign(flags, parseFlags((c.args ?? []).join("\n")));
      delete flags.flagfile;
      const port = (addr) => Number(String(addr ?? "").split(":").pop());
      const grpcPort = port(flags.listen);
      const metricsPort = port(flags.metrics_listen);
      if (!grpcPort || !/^(0\.0\.0\.0|\[::\]):/.test(flags.listen ?? "")) {
        errs.push(`${where}: --listen must bind all interfaces on a fixed port (is ${flags.listen})`);
      }
      if (!metricsPort || !/^(0\.0\.0\.0|\[::\]):/.test(flags.metrics_listen ?? "")) {
        errs.push(`${where}: --metrics_listen must bind all interfaces on a fixed port (is ${flags.metrics_listen})`);
      }
      const cport = (n) => (c.ports ?? []).find((p) => p.name === n)?.containerPort;
      if (cport("grpc") !== grpcPort) errs.push(`${where}: containerPort grpc ${cport("grpc")} != --listen port ${grpcPort}`);
      if (cport("metrics") !== metricsPort) errs.push(`${where}: containerPort metrics ${cport("metrics")} != --metrics_listen port ${metricsPort}`);
      // Native gRPC probes: liveness "", readiness and startup the service.
      // The kubelet's gRPC probes speak plaintext only: a container serving
      // TLS (--tls_cert) must use TCP probes on its gRPC port instead.
      const ready = SERVICE_NAMES[binary];
      const tls = Boolean(flags.tls_cert);
      for (const [probe, want] of [["livenessProbe", ""], ["readinessProbe", ready], ["startupProbe", ready]]) {
        if (tls) {
          const t = c[probe]?.tcpSocket;
          if (!t) { errs.push(`${where}: ${probe} must be a tcpSocket probe (gRPC probes cannot speak TLS)`); continue; }
          if (t.port !== grpcPort) errs.push(`${where}: ${probe} port ${t.port} != --listen port ${grpcPort}`);
          continue;
        }
        const g = c[probe]?.grpc;
        if (!g) { errs.push(`${where}: ${probe} is not a grpc probe`); continue; }
        if (g.port !== grpcPort) errs.push(`${where}: ${probe} port ${g.port} != --listen port ${grpcPort}`);
        if ((g.service ?? "") !== want) errs.push(`${where}: ${probe} service "${g.service ?? ""}" != "${want}"`);
      }
      // Certificate and key flags name files of a mounted Secret, which the
      // process (a non-root uid) can read.
      for (const f of ["tls_cert", "tls_key", "tls_client_ca", "upstream_tls_ca", "upstream_tls_cert", "upstream_tls_key"]) {
        if (!flags[f]) continue;
        const mount = (c.volumeMounts ?? []).find((v) => flags[f].startsWith(v.mountPath + "/"));
        const vol = mount && pod.volumes.find((v) => v.name === mount.name);
        if (!vol?.secret) { errs.push(`${where}: --${f}=${flags[f]} is not in a mounted Secret`); continue; }
        const mode = vol.secret.defaultMode ?? 0o644;
        if ((mode & 0o004) === 0 && pod.securityContext?.fsGroup === undefined) {
          errs.push(`${where}: Secret ${vol.secret.secretName} (mode ${mode.toString(8)}) is unreadable without fsGroup`);
        }
      }
      // The drain must finish before the kubelet's SIGKILL.
      const pause = c.lifecycle?.preStop?.sleep?.seconds ?? 0;
      const grace = durationSeconds(flags.drain_grace ?? "1s");
      const deadline = durationSeconds(flags.drain_deadline ?? "30s");
      const tgps = pod.terminationGracePeriodSeconds ?? 30;
      if (!(tgps >= pause + grace + deadline + 10)) {
        errs.push(`${where}: terminationGracePeriodSeconds ${tgps} < preStop ${pause} s + --drain_grace ${grace} s + --drain_deadline ${deadline} s + 10 s`);
      }
      if (binary === "tessera-worker") {
        const gpu = c.resources?.limits?.["nvidia.com/gpu"];
        if (!(Number(gpu) >= 1)) errs.push(`${where}: no nvidia.com/gpu limit`);
        if (w.kind !== "StatefulSet") errs.push(`${where}: workers must be a StatefulSet`);
        const anti = pod.affinity?.podAntiAffinity?.requiredDuringSchedulingIgnoredDuringExecution ?? [];
        if (!anti.some((t) => t.topologyKey === "kubernetes.io/hostname")) {
          errs.push(`${where}: no required anti-affinity on kubernetes.io/hostname (one worker per GPU host)`);
        }
        const headless = services.find((s) => s.metadata.name === w.spec.serviceName);
        if (!headless || headless.spec.clusterIP !== "None") {
          errs.push(`${where}: serviceName ${w.spec.serviceName} is not a headless Service`);
        }
        w._grpcPort = grpcPort;
      }
      if (binary === "tessera-router") {
        const file = flags.workers_file;
        const mount = file && (c.volumeMounts ?? []).find((v) => file.startsWith(v.mountPath + "/"));
        const vol = mount && pod.volumes.find((v) => v.name === mount.name);
        if (!vol?.configMap || mount.subPath) {
          errs.push(`${where}: --workers_file must be in a ConfigMap volume mounted without subPath (updates must reach it)`);
        } else {
          const cm = configMaps.get(vol.configMap.name);
          const key = file.slice(mount.mountPath.length + 1);
          if (!cm || cm.data?.[key] === undefined) {
            errs.push(`${where}: --workers_file ${file}: no key ${key} in ConfigMap ${vol.configMap.name}`);
          } else {
            w._workers = cm.data[key].split("\n").map((l) => l.replace(/#.*/, "").trim()).filter(Boolean);
          }
        }
      }
      // A Service exposing the pod must point at its named ports.
      for (const s of services) {
        if (!labelsMatch(s.spec.selector, w.spec.template.metadata.labels)) continue;
        for (const p of s.spec.ports) {
          if (typeof p.targetPort === "string" && !cport(p.targetPort)) {
            errs.push(`Service/${s.metadata.name}: targetPort ${p.targetPort} is not a port of ${where}`);
          }
        }
      }
      // A disruption budget and a monitor that sets the rules' job name.
      const labels = w.spec.template.metadata.labels;
      if (!byKind("PodDisruptionBudget").some((p) => labelsMatch(p.spec.selector?.matchLabels, labels))) {
        errs.push(`${where}: no PodDisruptionBudget selects it`);
      }
      const monitors = [...byKind("PodMonitor").map((m) => [m, m.spec.podMetricsEndpoints, labels]),
                        ...byKind("ServiceMonitor").flatMap((m) => services
                          .filter((s) => labelsMatch(s.spec.selector, labels) &&
                                         labelsMatch(m.spec.selector?.matchLabels, s.metadata.labels))
                          .map((s) => [m, m.spec.endpoints, s.metadata.labels]))];
      const monitored = monitors.some(([m, eps, l]) => labelsMatch(m.spec.selector?.matchLabels, l) &&
        (eps ?? []).some((e) => e.port === "metrics" &&
          (e.relabelings ?? []).some((r) => r.targetLabel === "job" && r.replacement === binary)));
      if (!monitored) errs.push(`${where}: no PodMonitor/ServiceMonitor scrapes its metrics port as job ${binary}`);
      if (!byKind("NetworkPolicy").some((p) => labelsMatch(p.spec.podSelector?.matchLabels, labels))) {
        errs.push(`${where}: no NetworkPolicy selects it`);
      }
    }
  }
  for (const b of Object.keys(SERVICE_NAMES)) {
    if (!seen.has(b)) errs.push(`no workload runs ${b}`);
  }
  // The router's workers file lists exactly the StatefulSet's pods.
  const router = workloads.find((w) => w._workers);
  const sts = workloads.find((w) => w._grpcPort);
  if (router && sts) {
    const want = Array.from({ length: sts.spec.replicas ?? 1 },
      (_, i) => `${sts.metadata.name}-${i}.${sts.spec.serviceName}:${sts._grpcPort}`);
    if (JSON.stringify(router._workers) !== JSON.stringify(want)) {
      errs.push(`workers file lists [${router._workers.join(", ")}], the StatefulSet has [${want.join(", ")}]`);
    }
  }
  if (!byKind("NetworkPolicy").some((p) => Object.keys(p.spec.podSelector ?? {}).length === 0 ||
                                           Object.keys(p.spec.podSelector?.matchLabels ?? {}).length === 0)) {
    errs.push("no default-deny NetworkPolicy (empty podSelector)");
  }
  return errs;
}

let failed = process.exitCode === 1;
if (expectInvalid && tessera) {
  for (const d of docs) {
    for (const e of d.errors) { console.log(`FAIL: ${d.file}#${d.index} ${d.name}: ${e}`); failed = true; }
  }
  const errs = checkTessera(docs);
  for (const e of errs) console.log(`ok: rejected: ${e}`);
  if (errs.length === 0) { console.log("FAIL: the Tessera checks found nothing wrong"); failed = true; }
  for (const x of expected) {
    if (!errs.some((e) => e.includes(x))) { console.log(`FAIL: no error mentions "${x}"`); failed = true; }
  }
} else if (expectInvalid) {
  for (const d of docs) {
    if (d.errors.length) {
      console.log(`ok: rejected ${d.file}#${d.index} ${d.name}: ${d.errors[0]}`);
    } else {
      console.log(`FAIL: accepted ${d.file}#${d.index} ${d.name}, which is invalid`);
      failed = true;
    }
  }
  if (docs.length === 0) { console.log("FAIL: no documents"); failed = true; }
} else {
  for (const d of docs) {
    for (const e of d.errors) { console.log(`FAIL: ${d.file}#${d.index} ${d.name}: ${e}`); failed = true; }
    if (d.errors.length === 0) console.log(`ok: ${d.name} (${d.obj.apiVersion})`);
  }
  if (docs.length === 0) { console.log("FAIL: no documents"); failed = true; }
  if (tessera && !failed) {
    const errs = checkTessera(docs);
    for (const e of errs) console.log(`FAIL: ${e}`);
    if (errs.length) failed = true; else console.log("ok: Tessera invariants");
  }
}
process.exit(failed ? 1 : 0);
