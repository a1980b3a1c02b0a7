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
  const hpas = byKind("HorizontalPodAutoscaler");
  const labelsMatch = (sel, labels) =>
    sel && Object.entries(sel).every(([k, v]) => labels?.[k] === v);
  const workloads = [...byKind("Deployment"), ...byKind("StatefulSet")];
  const seen = new Set();
  const port = (addr) => Number(String(addr ?? "").split(":").pop());
  const hostOf = (addr) => String(addr ?? "").replace(/:[0-9]+$/, "");
  // Every Tessera container: {w, where, pod, c, binary, flags, grpcPort}.
  const found = [];

  for (const w of workloads) {
    const where = `${w.kind}/${w.metadata.name}`;
    const pod = w.spec.template.spec;
    const podPorts = pod.containers.flatMap((c) => c.ports ?? []);
    // A pod that mounts a host directory runs only where that directory
    // is: it must select the node.
    const hostPaths = (pod.volumes ?? []).filter((v) => v.hostPath).map((v) => v.name);
    const pinned = Object.keys(pod.nodeSelector ?? {}).length > 0 ||
      (pod.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.nodeSelectorTerms ?? []).length > 0;
    if (hostPaths.length && !pinned) {
      errs.push(`${where}: hostPath volume ${hostPaths.join(", ")} without a nodeSelector (the pod sticks in ContainerCreating on nodes without the directory)`);
    }
    // An autoscaled Deployment must leave its replicas to the autoscaler.
    const hpa = hpas.find((h) => h.spec.scaleTargetRef.kind === w.kind && h.spec.scaleTargetRef.name === w.metadata.name);
    if (hpa && w.spec.replicas !== undefined) {
      errs.push(`${where}: sets replicas ${w.spec.replicas}, which every apply would reset under HorizontalPodAutoscaler/${hpa.metadata.name}`);
    }
    for (const c of pod.containers) {
      const binary = (c.command ?? [])[0]?.split("/").pop();
      if (!SERVICE_NAMES[binary]) continue;
      seen.add(binary);
      const cwhere = pod.containers.length > 1 ? `${where} container ${c.name}` : where;
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
          errs.push(`${cwhere}: --flagfile=${m[1]} is not a key of a mounted ConfigMap`);
          continue;
        }
        Object.assign(flags, parseFlags(cm.data[key]));
      }
      Object.assign(flags, parseFlags((c.args ?? []).join("\n")));
      delete flags.flagfile;
      const grpcPort = port(flags.listen);
      const metricsPort = port(flags.metrics_listen);
      if (!grpcPort || !/^(0\.0\.0\.0|\[::\]):/.test(flags.listen ?? "")) {
        errs.push(`${cwhere}: --listen must bind all interfaces on a fixed port (is ${flags.listen})`);
      }
      if (!metricsPort || !/^(0\.0\.0\.0|\[::\]):/.test(flags.metrics_listen ?? "")) {
        errs.push(`${cwhere}: --metrics_listen must bind all interfaces on a fixed port (is ${flags.metrics_listen})`);
      }
      // The container's ports are named grpc and metrics, or <x>-grpc and
      // <x>-metrics for a second container of the pod.
      const named = (kind) => (c.ports ?? []).filter((p) => p.name === kind || p.name?.endsWith(`-${kind}`));
      const [gp, mp] = [named("grpc"), named("metrics")];
      if (gp.length !== 1 || gp[0].containerPort !== grpcPort) {
        errs.push(`${cwhere}: containerPort grpc ${gp.map((p) => p.containerPort)} != --listen port ${grpcPort}`);
      }
      if (mp.length !== 1 || mp[0].containerPort !== metricsPort) {
        errs.push(`${cwhere}: containerPort metrics ${mp.map((p) => p.containerPort)} != --metrics_listen port ${metricsPort}`);
      }
      // Native gRPC probes: liveness "", readiness and startup the service.
      // The kubelet's gRPC probes speak plaintext only: a container serving
      // TLS (--tls_cert) must use TCP probes on its gRPC port instead.
      const ready = SERVICE_NAMES[binary];
      const tls = Boolean(flags.tls_cert);
      for (const [probe, want] of [["livenessProbe", ""], ["readinessProbe", ready], ["startupProbe", ready]]) {
        if (tls) {
          const t = c[probe]?.tcpSocket;
          if (!t) { errs.push(`${cwhere}: ${probe} must be a tcpSocket probe (gRPC probes cannot speak TLS)`); continue; }
          if (t.port !== grpcPort) errs.push(`${cwhere}: ${probe} port ${t.port} != --listen port ${grpcPort}`);
          continue;
        }
        const g = c[probe]?.grpc;
        if (!g) { errs.push(`${cwhere}: ${probe} is not a grpc probe`); continue; }
        if (g.port !== grpcPort) errs.push(`${cwhere}: ${probe} port ${g.port} != --listen port ${grpcPort}`);
        if ((g.service ?? "") !== want) errs.push(`${cwhere}: ${probe} service "${g.service ?? ""}" != "${want}"`);
      }
      // Certificate and key flags name files of a mounted Secret, which the
      // process (a non-root uid) can read.
      for (const f of ["tls_cert", "tls_key", "tls_client_ca", "upstream_tls_ca", "upstream_tls_cert", "upstream_tls_key"]) {
        if (!flags[f]) continue;
        const mount = (c.volumeMounts ?? []).find((v) => flags[f].startsWith(v.mountPath + "/"));
        const vol = mount && pod.volumes.find((v) => v.name === mount.name);
        if (!vol?.secret) { errs.push(`${cwhere}: --${f}=${flags[f]} is not in a mounted Secret`); continue; }
        const mode = vol.secret.defaultMode ?? 0o644;
        if ((mode & 0o004) === 0 && pod.securityContext?.fsGroup === undefined) {
          errs.push(`${cwhere}: Secret ${vol.secret.secretName} (mode ${mode.toString(8)}) is unreadable without fsGroup`);
        }
      }
      // The drain must finish before the kubelet's SIGKILL.
      const pause = c.lifecycle?.preStop?.sleep?.seconds ?? 0;
      const grace = durationSeconds(flags.drain_grace ?? "1s");
      const deadline = durationSeconds(flags.drain_deadline ?? "30s");
      const tgps = pod.terminationGracePeriodSeconds ?? 30;
      if (!(tgps >= pause + grace + deadline + 10)) {
        errs.push(`${cwhere}: terminationGracePeriodSeconds ${tgps} < preStop ${pause} s + --drain_grace ${grace} s + --drain_deadline ${deadline} s + 10 s`);
      }
      if (binary === "tessera-worker") {
        // The worker runs on the GPUs it holds: --device=cuda, one
        // tensor-parallel rank per GPU of its limit, /dev/shm in memory for
        // the ranks' NCCL buffers, and nodes chosen by their GPUs.
        const gpu = Number(c.resources?.limits?.["nvidia.com/gpu"]);
        const tp = Number(flags.tensor_parallel_size ?? "1");
        if (!(gpu >= 1)) errs.push(`${cwhere}: no nvidia.com/gpu limit`);
        if (!/^cuda(:|$)/.test(flags.device ?? "cpu")) {
          errs.push(`${cwhere}: lacks --device=cuda (is --device=${flags.device ?? "cpu (the default)"}): the worker would leave its GPUs idle`);
        }
        if (tp !== gpu) {
          errs.push(`${cwhere}: --tensor_parallel_size ${tp} != nvidia.com/gpu limit ${gpu} (one rank per GPU)`);
        }
        if (Number(c.resources?.requests?.["nvidia.com/gpu"] ?? gpu) !== gpu) {
          errs.push(`${cwhere}: nvidia.com/gpu request != limit`);
        }
        if (tp > 1) {
          const shm = (c.volumeMounts ?? []).find((v) => v.mountPath === "/dev/shm");
          const vol = shm && pod.volumes.find((v) => v.name === shm.name);
          if (vol?.emptyDir?.medium !== "Memory") {
            errs.push(`${cwhere}: tensor-parallel worker (${tp} ranks) lacks /dev/shm from an emptyDir with medium: Memory`);
          }
        }
        const sel = pod.nodeSelector ?? {};
        if (!Object.keys(sel).some((k) => k.startsWith("nvidia.com/gpu."))) {
          errs.push(`${cwhere}: no nodeSelector on an nvidia.com/gpu.* label (count or product)`);
        }
        if (sel["nvidia.com/gpu.count"] !== undefined && Number(sel["nvidia.com/gpu.count"]) !== gpu) {
          errs.push(`${cwhere}: nodeSelector nvidia.com/gpu.count ${sel["nvidia.com/gpu.count"]} != nvidia.com/gpu limit ${gpu} (one worker takes the node's GPUs)`);
        }
        if (!c.resources?.requests?.memory || !c.resources?.requests?.cpu) {
          errs.push(`${cwhere}: no cpu and memory requests (weights are staged through host memory)`);
        }
        if (w.kind !== "StatefulSet") errs.push(`${cwhere}: workers must be a StatefulSet`);
        const anti = pod.affinity?.podAntiAffinity?.requiredDuringSchedulingIgnoredDuringExecution ?? [];
        if (!anti.some((t) => t.topologyKey === "kubernetes.io/hostname")) {
          errs.push(`${cwhere}: no required anti-affinity on kubernetes.io/hostname (one worker per GPU host)`);
        }
        const headless = services.find((s) => s.metadata.name === w.spec.serviceName);
        if (!headless || headless.spec.clusterIP !== "None") {
          errs.push(`${cwhere}: serviceName ${w.spec.serviceName} is not a headless Service`);
        }
      }
      if (binary === "tessera-router") {
        if (!hpa) errs.push(`${cwhere}: no HorizontalPodAutoscaler scales it`);
      }
      // A Service exposing the pod must point at its named ports.
      for (const s of services) {
        if (!labelsMatch(s.spec.selector, w.spec.template.metadata.labels)) continue;
        for (const p of s.spec.ports) {
          if (typeof p.targetPort === "string" && !podPorts.some((q) => q.name === p.targetPort)) {
            errs.push(`Service/${s.metadata.name}: targetPort ${p.targetPort} is not a port of ${where}`);
          }
        }
      }
      // A disruption budget and a monitor that sets the rules' job name.
      const labels = w.spec.template.metadata.labels;
      if (!byKind("PodDisruptionBudget").some((p) => labelsMatch(p.spec.selector?.matchLabels, labels))) {
        errs.push(`${cwhere}: no PodDisruptionBudget selects it`);
      }
      const metricsName = mp[0]?.name;
      const monitors = [...byKind("PodMonitor").map((m) => [m, m.spec.podMetricsEndpoints, labels]),
                        ...byKind("ServiceMonitor").flatMap((m) => services
                          .filter((s) => labelsMatch(s.spec.selector, labels) &&
                                         labelsMatch(m.spec.selector?.matchLabels, s.metadata.labels))
                          .map((s) => [m, m.spec.endpoints, s.metadata.labels]))];
      const monitored = monitors.some(([m, eps, l]) => labelsMatch(m.spec.selector?.matchLabels, l) &&
        (eps ?? []).some((e) => e.port === metricsName &&
          (e.relabelings ?? []).some((r) => r.targetLabel === "job" && r.replacement === binary)));
      if (!monitored) errs.push(`${cwhere}: no PodMonitor/ServiceMonitor scrapes its ${metricsName} port as job ${binary}`);
      // A policy of its own that admits its traffic (the DNS policy selects
      // every pod but admits nothing).
      if (!byKind("NetworkPolicy").some((p) => labelsMatch(p.spec.podSelector?.matchLabels, labels) &&
                                               (p.spec.ingress ?? []).length > 0)) {
        errs.push(`${cwhere}: no NetworkPolicy with ingress rules selects it`);
      }
      found.push({ w, where: cwhere, binary, flags, grpcPort });
    }
  }
  for (const b of Object.keys(SERVICE_NAMES)) {
    if (!seen.has(b)) errs.push(`no workload runs ${b}`);
  }
  // The address a --drafter / --workers_dns flag names: a container of the
  // same pod (localhost), or the pods behind a Service of that name.
  const reaches = (from, addr, to) => {
    const host = hostOf(addr).split(".")[0];
    if (["127.0.0.1", "localhost", "[::1]"].includes(hostOf(addr))) {
      return from.w === to.w && port(addr) === to.grpcPort;
    }
    const s = services.find((x) => x.metadata.name === host);
    return Boolean(s && labelsMatch(s.spec.selector, to.w.spec.template.metadata.labels) &&
      s.spec.ports.some((p) => p.port === port(addr) &&
        (p.targetPort === to.grpcPort || (to.w.spec.template.spec.containers.flatMap((c) => c.ports ?? [])
          .some((q) => q.name === p.targetPort && q.containerPort === to.grpcPort)))));
  };
  const workers = found.filter((f) => f.binary === "tessera-worker");
  const drafters = found.filter((f) => f.binary === "tessera-drafter");
  for (const d of drafters) {
    if (!workers.some((wk) => wk.flags.drafter && reaches(wk, wk.flags.drafter, d))) {
      errs.push(`${d.where}: a drafter runs with no worker pointed at it (no worker's --drafter reaches port ${d.grpcPort})`);
    }
  }
  for (const wk of workers) {
    if (wk.flags.drafter && !drafters.some((d) => reaches(wk, wk.flags.drafter, d))) {
      errs.push(`${wk.where}: --drafter=${wk.flags.drafter} reaches no drafter`);
    }
  }
  // Routers find every worker pod through the workers' headless Service
  // (ready or not: the router watches readiness itself); workers addressed
  // by IP need --upstream_tls_target_name for TLS.
  for (const r of found.filter((f) => f.binary === "tessera-router")) {
    const dns = r.flags.workers_dns;
    if (!dns) { errs.push(`${r.where}: no --workers_dns (the workers' headless Service)`); continue; }
    const s = services.find((x) => x.metadata.name === hostOf(dns).split(".")[0]);
    if (!s || s.spec.clusterIP !== "None" || s.spec.publishNotReadyAddresses !== true) {
      errs.push(`${r.where}: --workers_dns=${dns} names no headless Service publishing not-ready addresses`);
    } else if (!workers.some((wk) => wk.w.spec.serviceName === s.metadata.name && reaches(r, dns, wk))) {
      errs.push(`${r.where}: --workers_dns=${dns} reaches no worker's gRPC port`);
    }
    if (r.flags.upstream_tls_ca && !r.flags.upstream_tls_target_name) {
      errs.push(`${r.where}: TLS to workers found by DNS (IP addresses) needs --upstream_tls_target_name`);
    }
  }
  for (const h of hpas) {
    const t = h.spec.scaleTargetRef;
    if (!workloads.some((w) => w.kind === t.kind && w.metadata.name === t.name)) {
      errs.push(`HorizontalPodAutoscaler/${h.metadata.name}: scales ${t.kind}/${t.name}, which does not exist`);
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
