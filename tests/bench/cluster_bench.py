#!/usr/bin/env python3
"""The cluster benchmark (issue 37): what a user gets from a real
tessera-worker behind tessera-router, against the runner's own speed and a
strong PyTorch peer, all in one run on one GPU. Steps, each under a time
limit, in this order (each GPU process exits before the next starts):

  1. model   tests/bench/write_random_hf_model.py: a Llama-3-8B-shaped model,
             random bf16, in the Hugging Face layout (kept for reruns)
  2. runner  gpu_decode_bench --batch_sizes=1,8,64 --prompt_len=128
             --decode_steps=256: the runner's step, the ceiling
  3. peer    tests/gpu/torch_decode_peer.py: gpt-fast-style decode, batch 1/8/64
  4. cluster tessera-worker --model=<1> --device=<dev> and tessera-router;
             `tessera bench --prompt_len=128 --output_len=256` (greedy,
             ignore_eos) closed loop at concurrency 1, 8, 64, then open loop
             (Poisson) at --open_fraction (0.8) of the closed-loop peak's
             request rate; a fresh seed per run, so no run hits another's
             prefix cache; the worker's /metrics at the end
  5. report  OUT/cluster_bench.json: every figure, and the issue's checks
             (inter-token p50 within 3% of the runner's step at 1/8/64;
             at least 1.15x the peer's tok/s; open-loop inter-token p99 <=
             1.5x its p50; TTFT p50 stated) with their values

The processes it starts are its own (new sessions): on exit, failure or
Ctrl-C they get SIGINT, then SIGKILL after --grace_s, by pid. Exit status:
0 when every step ran (the checks are reported, not enforced), 1 otherwise.

Usage (GPU machine, from the repository root):
  python3 tests/bench/cluster_bench.py --bin_dir=BIN --out=OUT_DIR
      [--device=cuda:<pci bus id>] [--model_dir=/tmp/tessera-llama3-8b-random]
      [--max_num_batched_tokens=N] [--skip=model,runner,peer,cluster]
  without a GPU, to try the harness: --skip=model,runner,peer
      --simulate=vocab=128256,decode_step_us=4000
scripts/cluster_bench.sh wraps it with the GPU bundle (scripts/gpu-bundle.sh).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BATCHES = (1, 8, 64)
PROMPT_LEN, OUTPUT_LEN, VOCAB = 128, 256, 128256


class Step:
    """One timed step's record (name, status, seconds, log)."""

    def __init__(self, report, name):
        self.report, self.name, self.t0 = report, name, time.time()
        self.log = os.path.join(report.out, f"{name}.log")

    def done(self, ok, detail=""):
        rec = {"step": self.name, "ok": ok, "seconds": round(time.time() - self.t0, 1),
               "log": os.path.basename(self.log)}
        if detail:
            rec["detail"] = detail
        self.report.steps.append(rec)
        print(f"[cluster_bench] {self.name}: {'ok' if ok else 'FAILED'} "
              f"({rec['seconds']} s){' - ' + detail if detail else ''}", flush=True)
        return ok


class Report:
    def __init__(self, out):
        self.out, self.steps, self.procs = out, [], []


def run(report, name, cmd, limit_s):
    """Runs cmd to completion under a time limit; its output goes to OUT/<name>.log."""
    step = Step(report, name)
    with open(step.log, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=limit_s,
                                start_new_session=True).returncode
        except subprocess.TimeoutExpired:
            return step.done(False, f"timed out after {limit_s} s")
        except OSError as e:
            return step.done(False, f"cannot run {cmd[0]}: {e}")
    return step.done(rc == 0, "" if rc == 0 else f"exit status {rc}; see {step.log}")


def start(report, name, cmd, port_file):
    """Starts a service in its own session; stop_all() ends it."""
    if os.path.exists(port_file):
        os.remove(port_file)  # a rerun's stale ports would be read as this one's
    log = open(os.path.join(report.out, f"{name}.log"), "w")
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    report.procs.append((name, proc))
    return proc


def stop_all(report, grace_s):
    """SIGINT (the services drain and exit), then SIGKILL, newest first, by pid."""
    for name, proc in reversed(report.procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                print(f"[cluster_bench] {name} (pid {proc.pid}) ignored SIGINT; killing it",
                      flush=True)
                proc.kill()
                proc.wait()
    report.procs.clear()


def wait_ports(path, proc, limit_s):
    """The grpc/metrics ports a service writes to --port_file once listening."""
    until = time.time() + limit_s
    while time.time() < until:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode} before listening")
        if os.path.exists(path):
            ports = dict(l.strip().split("=", 1) for l in open(path) if "=" in l)
            if "grpc_port" in ports:
                return ports
        time.sleep(0.2)
    raise RuntimeError(f"no port file after {limit_s} s")


def wait_ready(tessera, target, service, proc, limit_s):
    """Polls grpc.health.v1 until the service is SERVING (the worker: loaded, preflighted)."""
    until = time.time() + limit_s
    while time.time() < until:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode} while starting")
        r = subprocess.run([tessera, "health", f"--target={target}", f"--service={service}"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode == 0:
            return
        time.sleep(1)
    raise RuntimeError(f"{service} not SERVING after {limit_s} s")


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def bench(report, a, name, target, seed, load_args, limit_s):
    path = os.path.join(a.out, f"{name}.json")
    cmd = [os.path.join(a.bin_dir, "tessera"), "bench", f"--target={target}",
           f"--prompt_len={PROMPT_LEN}", f"--output_len={OUTPUT_LEN}", f"--vocab={VOCAB}",
           f"--seed={seed}", f"--out={path}"] + load_args
    run(report, name, cmd, limit_s)
    return load_json(path)


def cluster(report, a, model_dir):
    """Worker + router up, the loads, the worker's metrics; returns the bench reports."""
    tessera = os.path.join(a.bin_dir, "tessera")
    run_dir = os.path.join(a.out, "run")
    os.makedirs(run_dir, exist_ok=True)
    results = {}
    step = Step(report, "cluster_start")
    try:
        model = ([f"--simulate={a.simulate}"] if a.simulate else
                 [f"--model={model_dir}", f"--device={a.device}"])
        worker_args = model + ["--listen=127.0.0.1:0",
                       "--metrics_listen=127.0.0.1:0", f"--port_file={run_dir}/worker.ports",
                       "--max_num_seqs=64", f"--kv_cache_memory_mb={a.kv_cache_memory_mb}",
                       "--max_model_len=2048"]
        if a.max_num_batched_tokens > 0:
            worker_args.append(f"--max_num_batched_tokens={a.max_num_batched_tokens}")
        worker = start(report, "worker", [os.path.join(a.bin_dir, "tessera-worker")] + worker_args,
                       f"{run_dir}/worker.ports")
        wports = wait_ports(f"{run_dir}/worker.ports", worker, 120)
        wtarget = f"127.0.0.1:{wports['grpc_port']}"
        wait_ready(tessera, wtarget, "tessera.v1.Worker", worker, a.worker_ready_s)
        router = start(report, "router", [
            os.path.join(a.bin_dir, "tessera-router"), f"--workers={wtarget}",
            "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
            f"--port_file={run_dir}/router.ports"], f"{run_dir}/router.ports")
        rports = wait_ports(f"{run_dir}/router.ports", router, 60)
        target = f"127.0.0.1:{rports['grpc_port']}"
        wait_ready(tessera, target, "tessera.v1.Inference", router, 60)
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
        step.done(False, f"{e}; see worker.log and router.log")
        return results
    step.done(True, f"worker {wtarget}, router {target}")
    # Warm-up: CUDA graphs of the batch and context buckets the loads use.
    for c in BATCHES:
        bench(report, a, f"warmup_c{c}", target, 100 + c,
              [f"--concurrency={c}", f"--requests={c}"], 120)
    seed = 1
    for c, n in zip(BATCHES, (a.requests_c1, a.requests_c8, a.requests_c64)):
        results[f"closed_c{c}"] = bench(report, a, f"closed_c{c}", target, seed,
                                        [f"--concurrency={c}", f"--requests={n}"], 180)
        seed += 1
    peak = results.get("closed_c64")
    if peak and peak.get("request_throughput"):
        rate = a.open_fraction * peak["request_throughput"]
        results["open_rate_per_second"] = rate
        results["open"] = bench(report, a, "open", target, seed,
                                [f"--rate={rate:.3f}", f"--duration={a.open_seconds}s"],
                                a.open_seconds + 120)
    try:
        url = f"http://127.0.0.1:{wports['metrics_port']}/metrics"
        with open(os.path.join(a.out, "worker_metrics.txt"), "w") as f:
            f.write(urllib.request.urlopen(url, timeout=10).read().decode())
    except (OSError, KeyError) as e:
        print(f"[cluster_bench] worker /metrics: {e}", flush=True)
    return results


def stat(report_json, key, field):
    try:
        return report_json[key][field]
    except (TypeError, KeyError):
        return None


def ratio(x, y):
    return None if x is None or not y else x / y


def summarize(a, runner, peer, res):
    """The figures side by side, and the issue's checks."""
    by_batch = lambda doc: {r["batch"]: r for r in (doc or {}).get("results", [])}
    rb, pb = by_batch(runner), by_batch(peer)
    rows, checks = [], []
    for b in BATCHES:
        closed = res.get(f"closed_c{b}")
        itl = stat(closed, "itl_ms", "p50")
        step_ms = rb.get(b, {}).get("decode_ms_per_step")
        out_tps = (closed or {}).get("output_token_throughput")
        decode_tps = None if not itl else b * 1e3 / itl
        peer_tps = pb.get(b, {}).get("decode_tokens_per_second")
        rows.append({
            "batch": b,
            "cluster_itl_ms": {k: stat(closed, "itl_ms", k) for k in ("p50", "p90", "p99")},
            "cluster_ttft_ms_p50": stat(closed, "ttft_ms", "p50"),
            "cluster_output_tokens_per_second": out_tps,
            "cluster_decode_tokens_per_second": decode_tps,  # batch / ITL p50
            "runner_decode_ms_per_step": step_ms,
            "runner_decode_tokens_per_second": rb.get(b, {}).get("decode_tokens_per_second"),
            "runner_roofline_fraction": rb.get(b, {}).get("roofline_fraction"),
            "peer_decode_tokens_per_second": peer_tps,
            "itl_p50_over_runner_step": ratio(itl, step_ms),
            "cluster_output_over_peer": ratio(out_tps, peer_tps),
            "cluster_decode_over_peer": ratio(decode_tps, peer_tps),
        })
        gap = ratio(itl, step_ms)
        checks.append({"check": f"ITL p50 within 3% of the runner's step, batch {b}",
                       "value": gap, "limit": 1.03, "pass": gap is not None and gap <= 1.03})
        speed = ratio(out_tps, peer_tps)
        checks.append({"check": f"cluster output tok/s >= 1.15x the peer, batch {b}",
                       "value": speed, "limit": 1.15, "pass": speed is not None and speed >= 1.15})
    open_ = res.get("open")
    p50, p99 = stat(open_, "itl_ms", "p50"), stat(open_, "itl_ms", "p99")
    tail = ratio(p99, p50)
    checks.append({"check": "open loop: ITL p99 <= 1.5x p50", "value": tail, "limit": 1.5,
                   "pass": tail is not None and tail <= 1.5})
    open_summary = {
        "rate_per_second": res.get("open_rate_per_second"),
        "fraction_of_closed_c64_request_rate": a.open_fraction,
        "itl_ms": {k: stat(open_, "itl_ms", k) for k in ("p50", "p90", "p99")},
        "ttft_ms": {k: stat(open_, "ttft_ms", k) for k in ("p50", "p90", "p99")},
        "output_tokens_per_second": (open_ or {}).get("output_token_throughput"),
        "itl_p99_over_p50": tail,
    }
    return rows, open_summary, checks


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin_dir", required=True, help="tessera, tessera-worker, tessera-router, "
                   "gpu_decode_bench")
    p.add_argument("--out", required=True, help="output folder (cluster_bench.json and logs)")
    p.add_argument("--device", default="cuda", help="cuda or cuda:<pci bus id>")
    p.add_argument("--model_dir", default="/tmp/tessera-llama3-8b-random")
    p.add_argument("--max_num_batched_tokens", type=int, default=0,
                   help="worker's per-step token budget; 0 = its default")
    p.add_argument("--kv_cache_memory_mb", type=int, default=8192)
    p.add_argument("--requests_c1", type=int, default=6)
    p.add_argument("--requests_c8", type=int, default=24)
    p.add_argument("--requests_c64", type=int, default=192)
    p.add_argument("--open_fraction", type=float, default=0.8)
    p.add_argument("--open_seconds", type=int, default=30)
    p.add_argument("--worker_ready_s", type=int, default=300)
    p.add_argument("--grace_s", type=int, default=30)
    p.add_argument("--skip", default="", help="comma-separated: model, runner, peer, cluster")
    p.add_argument("--simulate", default="", help="a simulated worker (tessera-worker "
                   "--simulate=SPEC) instead of the model: to try the harness without a GPU")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    skip = set(filter(None, a.skip.split(",")))
    needed = ["tessera", "tessera-worker", "tessera-router"]
    if "runner" not in skip:
        needed.append("gpu_decode_bench")
    for b in needed:
        if not os.access(os.path.join(a.bin_dir, b), os.X_OK):
            sys.exit(f"cluster_bench: {a.bin_dir}/{b} is missing or not executable")
    report = Report(a.out)
    # Ctrl-C or a kill of this script still stops the services.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    t0 = time.time()
    res, runner, peer = {}, None, None
    try:
        model_ok = "model" in skip or run(report, "model", [
            sys.executable, os.path.join(HERE, "write_random_hf_model.py"), a.model_dir], 420)
        if "runner" not in skip:
            path = os.path.join(a.out, "gpu_decode.json")
            run(report, "runner", [os.path.join(a.bin_dir, "gpu_decode_bench"),
                                   f"--device={a.device}", "--batch_sizes=1,8,64",
                                   f"--prompt_len={PROMPT_LEN}", f"--decode_steps={OUTPUT_LEN}",
                                   "--long_prefill=0", f"--out={path}"], 240)
            runner = load_json(path)
        if "peer" not in skip:
            path = os.path.join(a.out, "torch_peer.json")
            run(report, "peer", [sys.executable, os.path.join(ROOT, "tests/gpu/torch_decode_peer.py"),
                                 f"--prompt_len={PROMPT_LEN}", "--steps=128", f"--out={path}"], 420)
            peer = load_json(path)
        if "cluster" not in skip and model_ok:
            res = cluster(report, a, a.model_dir)
    finally:
        stop_all(report, a.grace_s)
    rows, open_summary, checks = summarize(a, runner, peer, res)
    doc = {
        "benchmark": "cluster_bench (issue 37): Llama-3-8B shapes, random bf16, saved with "
                     "transformers; tessera-worker behind tessera-router under `tessera bench` "
                     f"--prompt_len={PROMPT_LEN} --output_len={OUTPUT_LEN} greedy; "
                     "gpu_decode_bench and the PyTorch peer in the same run",
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "device": a.device,
        "worker_max_num_batched_tokens": a.max_num_batched_tokens or "worker default",
        "seconds": round(time.time() - t0, 1),
        "by_batch": rows,
        "open_loop": open_summary,
        "checks": checks,
        "steps": report.steps,
        "runner": runner,
        "peer": peer,
        "loads": res,
    }
    path = os.path.join(a.out, "cluster_bench.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    for c in checks:
        v = "n/a" if c["value"] is None else f"{c['value']:.3f}"
        print(f"[cluster_bench] {'PASS' if c['pass'] else 'FAIL'} {c['check']}: {v} "
              f"(limit {c['limit']})", flush=True)
    print(f"[cluster_bench] wrote {path} in {doc['seconds']} s", flush=True)
    return 0 if all(s["ok"] for s in report.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
