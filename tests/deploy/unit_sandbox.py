#!/usr/bin/python3
"""Runs a command under the sandbox settings of a systemd unit, without
systemd: for CI machines where systemd is not PID 1, so `systemd-run -p`
cannot start a transient service.

The settings are applied with the kernel mechanisms systemd itself uses:

  SystemCallFilter=, SystemCallArchitectures=native
      seccomp, from the groups as `systemd-analyze syscall-filter` lists
      them (systemd's own tables); a call outside them kills the process
      with SIGSYS, as under systemd.
  RestrictAddressFamilies=       seccomp: socket() of another family fails
                                 with EAFNOSUPPORT, as under systemd.
  RestrictNamespaces=yes         seccomp: clone/unshare with a namespace
                                 flag and setns fail with EPERM; clone3
                                 with ENOSYS (glibc falls back to clone).
  RestrictRealtime=yes           seccomp: sched_setscheduler to FIFO, RR or
                                 DEADLINE fails with EPERM.
  NoNewPrivileges=yes            prctl(PR_SET_NO_NEW_PRIVS).
  CapabilityBoundingSet=         every capability dropped from the bounding
                                 set; User= then drops the rest.
  User=                          uid/gid 65534 (nobody): CI has no such
                                 service user; what matters is not root.
  LimitNOFILE=, LimitMEMLOCK=    setrlimit.
  UMask=                         umask.
  ProtectSystem=strict, ProtectHome=yes, PrivateTmp=yes,
  ProtectKernelTunables=yes, ProtectControlGroups=yes
      bubblewrap: / read-only, /home and /root empty, private /tmp and
      /var/tmp, /proc/sys and /sys read-only; the unit's writable
      directory (CacheDirectory=) is a given folder.
  DevicePolicy=closed            a minimal /dev (null, zero, full, random,
                                 urandom, tty, pts, shm), which is what
                                 closed allows besides the DeviceAllow=
                                 entries (no GPU here).

Not emulated (each noted in deploy/README.md): LockPersonality,
ProtectKernelLogs, ProtectKernelModules, ProtectClock and ProtectHostname
beyond what the system-call filter already denies, MemoryDenyWriteExecute
(not set on the worker), the cgroup device filter itself.

ExecStart= is rendered as systemd does for these units: Environment=
defaults, then the EnvironmentFile= given here, then ${VAR} as one argument
and $VAR split on whitespace; %i is the instance.

usage:
  unit_sandbox.py run --unit UNIT --instance I --env-file F --writable DIR
                      [--drop-family AF_X] [--print] [-- COMMAND...]
      Without COMMAND: the unit's ExecStart. Writes the command's pid to
      DIR/sandbox.pid before it starts; exits with its status.
  unit_sandbox.py inner SETTINGS_JSON -- COMMAND...   (used by run)
"""
import argparse
import ctypes
import errno
import json
import os
import re
import resource
import shlex
import socket
import subprocess
import sys

BWRAP = "/usr/bin/bwrap"
SYSTEMD_ANALYZE = "/usr/bin/systemd-analyze"
NOBODY = 65534


def service_section(path):
    """(key, value) pairs of [Service], continuation lines joined."""
    items, section, pending = [], None, ""
    for raw in open(path, encoding="utf-8"):
        line = raw.rstrip("\n")
        if pending:
            line = pending + " " + line.strip()
            pending = ""
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        if stripped.startswith("["):
            section = stripped
            continue
        if section == "[Service]" and "=" in stripped:
            key, value = stripped.split("=", 1)
            items.append((key.strip(), value.strip()))
    return items


def read_env_file(path):
    env = {}
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, value = line.split("=", 1)
        env[key.strip()] = value.strip()
    return env


def render(items, instance, env_file):
    env = {}
    for key, value in items:
        if key == "Environment":
            k, v = value.replace("%i", instance).split("=", 1)
            env[k] = v
    env.update(read_env_file(env_file))
    exec_start = [v for k, v in items if k == "ExecStart"]
    if len(exec_start) != 1:
        sys.exit("unit_sandbox: the unit needs exactly one ExecStart=")
    argv = []
    for word in exec_start[0].replace("%i", instance).split():
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:
            argv.extend(env.get(m.group(1), "").split())
            continue
        argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda g: env.get(g.group(1), ""), word))
    return argv, env


def expand_groups(names):
    """Syscall names of systemd's groups, by `systemd-analyze syscall-filter`."""
    out, seen = set(), set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if not name.startswith("@"):
            out.add(name)
            continue
        if name in seen:
            continue
        seen.add(name)
        text = subprocess.run([SYSTEMD_ANALYZE, "syscall-filter", name], check=True,
                              capture_output=True, text=True).stdout
        for line in text.splitlines()[1:]:
            word = line.strip()
            if word and not word.startswith("#"):
                todo.append(word)
    return out


def settings_of(items):
    s = {}
    for key, value in items:
        s.setdefault(key, []).append(value)
    one = lambda k, d=None: s[k][-1] if k in s else d
    families = one("RestrictAddressFamilies", "")
    return {
        "syscall_filter": " ".join(s.get("SystemCallFilter", [])).split(),
        "architectures": one("SystemCallArchitectures", ""),
        "families": families.split() if families else None,
        "restrict_namespaces": one("RestrictNamespaces") == "yes",
        "restrict_realtime": one("RestrictRealtime") == "yes",
        "no_new_privileges": one("NoNewPrivileges") == "yes",
        "drop_bounding_set": "CapabilityBoundingSet" in s and one("CapabilityBoundingSet") == "",
        "user": one("User"),
        "limit_nofile": one("LimitNOFILE"),
        "limit_memlock": one("LimitMEMLOCK"),
        "umask": one("UMask"),
        "protect_system": one("ProtectSystem"),
        "protect_home": one("ProtectHome") == "yes",
        "private_tmp": one("PrivateTmp") == "yes",
        "device_policy": one("DevicePolicy"),
        "memory_deny_write_execute": one("MemoryDenyWriteExecute") == "yes",
    }


def cmd_run(args, command):
    args.writable = os.path.abspath(args.writable)
    items = service_section(args.unit)
    settings = settings_of(items)
    argv, env = render(items, args.instance, args.env_file)
    if command:
        argv = command
    if settings["memory_deny_write_execute"]:
        sys.exit("unit_sandbox: MemoryDenyWriteExecute is not emulated")
    if args.drop_family and settings["families"]:
        settings["families"] = [f for f in settings["families"] if f != args.drop_family]
    settings["syscalls"] = sorted(expand_groups(settings["syscall_filter"]))
    settings["pid_file"] = os.path.join(args.writable, "sandbox.pid")
    # The unit's clean environment: its variables and a PATH.
    env = {k: v for k, v in env.items()}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    env["CUDA_CACHE_PATH"] = os.path.join(args.writable, "cuda-cache")
    if args.print:
        print(shlex.join(argv))
        return 0
    bwrap = [BWRAP, "--die-with-parent", "--ro-bind", "/", "/"]
    if os.getuid() == 0:
        # bwrap drops a root caller's capabilities; keep them for the inner
        # step, which sets the limits and then drops them itself.
        bwrap += ["--cap-add", "ALL"]
    if settings["device_policy"] == "closed":
        bwrap += ["--dev", "/dev"]
    else:
        bwrap += ["--dev-bind", "/dev", "/dev"]
    bwrap += ["--bind", "/proc", "/proc"]
    bwrap += ["--ro-bind", "/proc/sys", "/proc/sys", "--ro-bind", "/sys", "/sys"]
    if settings["private_tmp"]:
        bwrap += ["--tmpfs", "/tmp", "--tmpfs", "/var/tmp"]
    if settings["protect_home"]:
        for d in ("/home", "/root", "/run/user"):
            if os.path.isdir(d):
                bwrap += ["--tmpfs", d, "--remount-ro", d]
    # The checkout this script is in (with the build tree and the fixtures)
    # stays visible, read-only, when it lies under the private /tmp: a clean
    # CI clone may be there, where the real unit's binaries are installed
    # elsewhere (/opt/tessera).
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tmp_roots = ("/tmp/", "/var/tmp/")
    exposed = [repo] if settings["private_tmp"] and repo.startswith(tmp_roots) else []
    exposed += [os.path.abspath(e) for e in args.expose]  # --expose: read-only too
    # Folders bwrap makes on the way to a mount point are 0700; make those
    # under the private /tmp traversable for the service user.
    writable = os.path.abspath(args.writable)
    if settings["private_tmp"]:
        for path in exposed + [writable]:
            parts = path.split("/")
            for i in range(2, len(parts)):
                parent = "/".join(parts[:i + 1])
                if parent.startswith(tmp_roots) and parent != path:
                    bwrap += ["--perms", "0755", "--dir", parent]
    for path in exposed:
        bwrap += ["--ro-bind", path, path]
    bwrap += ["--bind", writable, writable, "--chdir", "/"]
    inner = [sys.executable, os.path.abspath(__file__), "inner", json.dumps(settings), "--"] + argv
    proc = subprocess.Popen(bwrap + ["--"] + inner, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        return proc.wait()


def build_filter(settings):
    import seccomp  # python3-seccomp (Debian), installed by scripts/install-deps.sh

    f = seccomp.SyscallFilter(defaction=seccomp.KILL_PROCESS)
    special = {"socket", "clone", "clone3", "unshare", "setns", "sched_setscheduler"}
    for name in settings["syscalls"]:
        if name in special:
            continue
        try:
            f.add_rule(seccomp.ALLOW, name)
        except (RuntimeError, ValueError, OSError):
            pass  # listed by systemd, but not a call of this architecture
    allowed = set(settings["syscalls"])
    Arg = seccomp.Arg
    if "socket" in allowed:
        if settings["families"] is None:
            f.add_rule(seccomp.ALLOW, "socket")
        else:
            keep = {getattr(socket, name) for name in settings["families"]}
            for af in range(0, 64):
                action = seccomp.ALLOW if af in keep else seccomp.ERRNO(errno.EAFNOSUPPORT)
                f.add_rule(action, "socket", Arg(0, seccomp.EQ, af))
            f.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", Arg(0, seccomp.GE, 64))
    ns_flags = [0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                0x40000000, 0x00000080]  # NEWNS UTS IPC USER PID NET CGROUP TIME
    ns_mask = 0
    for flag in ns_flags:
        ns_mask |= flag
    for name in ("clone", "unshare"):
        if name not in allowed:
            continue
        if not settings["restrict_namespaces"]:
            f.add_rule(seccomp.ALLOW, name)
            continue
        f.add_rule(seccomp.ALLOW, name, Arg(0, seccomp.MASKED_EQ, ns_mask, 0))
        for flag in ns_flags:
            f.add_rule(seccomp.ERRNO(errno.EPERM), name, Arg(0, seccomp.MASKED_EQ, flag, flag))
    if "clone3" in allowed:
        if settings["restrict_namespaces"]:
            f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
        else:
            f.add_rule(seccomp.ALLOW, "clone3")
    if "setns" in allowed:
        f.add_rule(seccomp.ERRNO(errno.EPERM) if settings["restrict_namespaces"] else seccomp.ALLOW,
                   "setns")
    if "sched_setscheduler" in allowed:
        if not settings["restrict_realtime"]:
            f.add_rule(seccomp.ALLOW, "sched_setscheduler")
        else:
            policy_mask = 0xFFFFFFFF & ~0x40000000  # without SCHED_RESET_ON_FORK
            for policy in (0, 3, 5):  # OTHER, BATCH, IDLE
                f.add_rule(seccomp.ALLOW, "sched_setscheduler",
                           Arg(1, seccomp.MASKED_EQ, policy_mask, policy))
            for policy in (1, 2, 6):  # FIFO, RR, DEADLINE
                f.add_rule(seccomp.ERRNO(errno.EPERM), "sched_setscheduler",
                           Arg(1, seccomp.MASKED_EQ, policy_mask, policy))
    return f


def limit(value):
    if value in ("infinity", "unlimited"):
        return resource.RLIM_INFINITY
    return int(value)


def cmd_inner(settings_json, argv):
    settings = json.loads(settings_json)
    libc = ctypes.CDLL(None, use_errno=True)
    for key, which in (("limit_nofile", resource.RLIMIT_NOFILE),
                       ("limit_memlock", resource.RLIMIT_MEMLOCK)):
        if not settings[key]:
            continue
        n = limit(settings[key])
        try:
            resource.setrlimit(which, (n, n))
        except (ValueError, OSError):
            # systemd (PID 1) may raise a hard limit; a container's root
            # often may not. Keep the host's, and say so.
            hard = resource.getrlimit(which)[1]
            resource.setrlimit(which, (hard, hard))
            print(f"unit_sandbox: note: {key} {settings[key]} is above this host's hard limit "
                  f"{hard}, which is used instead", file=sys.stderr)
    if settings["umask"]:
        os.umask(int(settings["umask"], 8))
    if settings["drop_bounding_set"]:
        last = int(open("/proc/sys/kernel/cap_last_cap").read())
        for cap in range(last + 1):
            if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                sys.exit(f"unit_sandbox: PR_CAPBSET_DROP {cap}: {os.strerror(ctypes.get_errno())}")
    if settings["user"] and os.getuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    if settings["no_new_privileges"]:
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            sys.exit("unit_sandbox: PR_SET_NO_NEW_PRIVS failed")
    with open(settings["pid_file"] + ".tmp", "w") as out:
        out.write(f"{os.getpid()}\n")
    os.rename(settings["pid_file"] + ".tmp", settings["pid_file"])
    build_filter(settings).load()
    os.execvp(argv[0], argv)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "inner":
        sep = sys.argv.index("--")
        cmd_inner(sys.argv[2], sys.argv[sep + 1:])
        return 0
    argv = sys.argv[1:]
    command = []
    if "--" in argv:
        sep = argv.index("--")
        argv, command = argv[:sep], argv[sep + 1:]
    p = argparse.ArgumentParser(description="Run a command under a systemd unit's sandbox settings")
    p.add_argument("cmd", choices=["run"])
    p.add_argument("--unit", required=True)
    p.add_argument("--instance", default="test")
    p.add_argument("--env-file", required=True)
    p.add_argument("--writable", required=True)
    p.add_argument("--expose", action="append", default=[],
                   help="a folder under /tmp to keep visible, read-only (repeatable)")
    p.add_argument("--drop-family", default="")
    p.add_argument("--print", action="store_true", help="print the rendered command only")
    return cmd_run(p.parse_args(argv), command)


if __name__ == "__main__":
    sys.exit(main())
