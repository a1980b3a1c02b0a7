#!/usr/bin/python3
"""Flags and environment of every container of a rendered Kubernetes
workload, as plain files a process can be started with elsewhere (the GPU
machine has no kubectl): reads `kubectl kustomize` output on stdin and, for
the pods of KIND/NAME, writes OUT_DIR/<container>.flags (the ConfigMap flag
file it mounts, then its other args, which absl applies after it) and
OUT_DIR/<container>.env (its env values, one NAME=VALUE a line).

usage: kubectl kustomize OVERLAY | pod_flags.py KIND/NAME OUT_DIR
"""
import os
import sys

import yaml


def main():
    kind, name = sys.argv[1].split("/", 1)
    out = sys.argv[2]
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    w = next((d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name), None)
    if w is None:
        sys.exit(f"pod_flags: no {kind}/{name}")
    pod = w["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    os.makedirs(out, exist_ok=True)
    for c in pod["containers"]:
        lines = [f"# {kind}/{name} container {c['name']}, rendered by tests/deploy/pod_flags.py"]
        for arg in c.get("args", []):
            if not arg.startswith("--flagfile="):
                lines.append(arg)
                continue
            path = arg.split("=", 1)[1]
            mount = next(m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
            cm = maps[volumes[mount["name"]]["configMap"]["name"]]
            lines.insert(1, cm["data"][path[len(mount["mountPath"]) + 1:]])
        with open(os.path.join(out, c["name"] + ".flags"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(out, c["name"] + ".env"), "w") as f:
            for e in c.get("env", []):
                f.write(f"{e['name']}={e['value']}\n")
        print(f"pod_flags: {out}/{c['name']}.flags, {c['name']}.env")


if __name__ == "__main__":
    main()
