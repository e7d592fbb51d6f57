"""Entry point of the in-sandbox agent.

    python -m sandbox_service.agent (--unix PATH | --tcp HOST:PORT [--tls-cert F --tls-key F])
                                    --secret-file F [--workspace /workspace] [--workdir DIR]
                                    [--boot CONFIG.json] [--ready-fd N] [--env K=V ...] [--inherit-env]
    python -m sandbox_service.agent --zygote [SOCKET]    (fork server, see zygote.py; SOCKET defaults to
                                                          $ORCHARD_ZYGOTE_SOCKET)

`--boot` is used by the local backend: the agent is then PID 1 of fresh namespaces and builds the
sandbox root itself (see boot.py) before serving. The listening Unix socket is bound *before* the
pivot, at a host path the sandbox cannot see. In a Kubernetes pod the agent runs without `--boot`
on TCP with TLS and `--inherit-env`: the container's environment (the image's ENV, set by the runtime
for the container's first process) becomes the base environment of every command. `--ready-fd` gets one JSON line
({"ok": true, "host_pid": N} or an error) once the
agent accepts connections, so the backend knows at once whether the boot worked.

Stdlib only. Launch it with `-I -S` and this package's parent directory on sys.path.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import types


# option -> attribute; every option takes a value. Hand-parsed: argparse alone costs ~7 ms of start-up.
_OPTIONS = {
    f"--{name.replace('_', '-')}": name
    for name in (
        "unix",
        "tcp",
        "tls_cert",
        "tls_key",
        "secret_file",
        "workspace",
        "workdir",
        "boot",
        "ready_fd",
        "env",
        "workspace_alias",
        "isolation",
    )
}
_FLAGS = {"--inherit-env": "inherit_env"}  # options without a value


class UsageError(Exception):
    pass


def _parse(argv: list[str] | None) -> types.SimpleNamespace:
    args = types.SimpleNamespace(
        unix=None,
        tcp=None,
        tls_cert=None,
        tls_key=None,
        secret_file=None,
        workspace="/workspace",
        workdir=None,
        boot=None,
        ready_fd=None,
        env=[],
        workspace_alias=None,
        isolation=None,
        inherit_env=False,
    )
    items = list(sys.argv[1:] if argv is None else argv)
    while items:
        item = items.pop(0)
        if item in ("-h", "--help"):
            print(__doc__)
            raise SystemExit(0)
        if item in _FLAGS:
            setattr(args, _FLAGS[item], True)
            continue
        name, eq, value = item.partition("=")
        if name not in _OPTIONS:
            raise UsageError(f"unknown option {item!r}\n{__doc__}")
        attr = _OPTIONS[name]
        if not eq:
            if not items:
                raise UsageError(f"{name} needs a value")
            value = items.pop(0)
        if attr == "env":
            args.env.append(value)
        else:
            setattr(args, attr, int(value) if attr == "ready_fd" else value)
    if bool(args.unix) == bool(args.tcp):
        raise UsageError("exactly one of --unix PATH or --tcp HOST:PORT is required")
    if not args.secret_file:
        raise UsageError("--secret-file is required")
    return args


def _listen(args: types.SimpleNamespace) -> socket.socket:
    if args.unix:
        try:
            os.unlink(args.unix)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(args.unix)
        finally:
            os.umask(old)
    else:
        host, _, port = args.tcp.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            if host != "::":
                raise
            # "[::]" asks for every family; a node booted without IPv6 has IPv4 only.
            host, sock = "0.0.0.0", socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if sock.family == socket.AF_INET6 and host == "::":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # dual stack: IPv4 and IPv6 pods alike
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
    sock.listen(256)
    return sock


def _container_oom_counter(root: str = "/sys/fs/cgroup") -> int | None:
    """The container's own OOM-kill counter, which tells a command killed for memory from one that
    crashed: memory.events on cgroup v2 (a private cgroup namespace, as kubelet gives containers), the
    memory controller's memory.oom_control on v1 (runc mounts the container's own group there; on the
    test cluster's v1 nodes a command's OOM was a plain SIGKILL without it). None where neither can be
    read: commands are then not flagged as OOM."""
    for name in ("memory.events", "memory/memory.oom_control"):
        try:
            return os.open(os.path.join(root, name), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
    return None


def _tls_context(args: types.SimpleNamespace):
    if not args.tls_cert:
        return None
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(args.tls_cert, args.tls_key)
    return ctx


def _preload() -> None:
    """Import, before the pivot, everything used lazily later, extension modules above all: one imported
    after it would make the dynamic loader resolve its libraries (libbz2, liblzma, ...) through the
    sandbox's own /etc/ld.so.cache and /usr/lib, i.e. load what the sandbox wrote into the agent."""
    import bz2  # noqa: F401  (tarfile's "r:*" tries every compression)
    import encodings.idna  # noqa: F401  (unicodedata, stringprep)
    import gzip  # noqa: F401
    import http.client  # noqa: F401
    import lzma  # noqa: F401
    import tarfile  # noqa: F401
    import tempfile  # noqa: F401
    import zlib  # noqa: F401


def shield_from_signals() -> None:
    """Make the agent, as PID 1 of its pid namespace, deaf to every signal a sandbox process can send.

    The kernel delivers a signal sent from inside a pid namespace to its init only if init *handles*
    it: default-action signals (SIGKILL and SIGSTOP included) are dropped. Python installs a handler
    for SIGINT (KeyboardInterrupt), so `kill -INT 1` used to end the agent and pass for a sandbox crash;
    every handled signal is reset to its default here. Ignored ones (SIGPIPE) stay ignored. The host
    (an ancestor namespace) can still kill the agent. Handlers are per process, so commands spawned
    later get the usual defaults."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    if argv is None and "ORCHARD_AGENT_ARGV" in os.environ:  # the local backend's unshare path: no paths in argv
        argv = json.loads(os.environ.pop("ORCHARD_AGENT_ARGV"))
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--zygote"] and len(argv) <= 2:
        from sandbox_service.agent import zygote

        return zygote.serve(argv[1] if len(argv) == 2 else os.environ.pop("ORCHARD_ZYGOTE_SOCKET"), main, _preload)
    try:
        args = _parse(argv)
    except UsageError as exc:
        print(f"usage error: {exc}", file=sys.stderr)
        return 2
    from sandbox_service.agent import proctree, server

    ready = os.fdopen(args.ready_fd, "w") if args.ready_fd is not None else None
    try:
        with open(args.secret_file) as f:
            secret = f.read().strip()
        if not secret:
            raise ValueError(f"secret file {args.secret_file} is empty")
        # Pod mode: the agent is the container's first process, so os.environ is the image's ENV plus the
        # pod's env; without it commands would get a default PATH only (no HOME, JAVA_HOME, conda, ...).
        base_env = dict(os.environ) if args.inherit_env else {}
        base_env.update(kv.split("=", 1) for kv in args.env)
        pids_fd = oom_fd = None
        host_pid = os.getpid()
        tls = _tls_context(args)
        if args.boot:
            from sandbox_service.agent import boot

            config = boot.load_config(args.boot)
            base_env.update(config.get("env", {}))
            pids_fd, oom_fd = boot.join_cgroups(config)
            oom_protected = boot.protect_from_oom()
            host_pid = boot.host_pid()
            _preload()  # (already done in a zygote's sandboxes)
            if config.get("seccomp"):
                from sandbox_service.agent import seccomp

                seccomp.prepare()  # loads libseccomp while the host's libraries are still in view
            listener = _listen(args)
            if config.get("userns"):
                boot.prepare_userns(config["userns"]["base"], config["userns"]["size"])
            else:
                boot.release_userns_peer()
            boot.build_root(config)
            boot.set_hostname(config.get("hostname", "sandbox"))
            if config.get("lo_up"):
                boot.loopback_up()
            if config.get("userns"):
                boot.enter_userns()
            boot.harden()
            if config.get("seccomp"):
                seccomp.install()
            os.environ.clear()
            os.environ.update(base_env)
            isolation = args.isolation or "namespaces"
        else:
            listener = _listen(args)
            isolation = args.isolation or "none"
            if isolation == "kubernetes-pod":
                oom_fd = _container_oom_counter()
        os.makedirs(args.workspace, exist_ok=True)
        workdir = args.workdir or args.workspace
        if args.workspace_alias and (workdir + "/").startswith(args.workspace_alias.rstrip("/") + "/"):
            workdir = args.workspace + workdir[len(args.workspace_alias.rstrip("/")) :]
        os.makedirs(workdir, exist_ok=True)
        os.chdir(workdir)
        tracker = proctree.CgroupTracker(pids_fd, oom_fd)
        if args.boot:
            tracker.raise_oom_score = not oom_protected
        agent = server.AgentServer(
            secret=secret,
            workspace=args.workspace,
            workdir=workdir,
            base_env=base_env,
            tracker=tracker,
            isolation=isolation,
            tls_context=tls,
            workspace_alias=args.workspace_alias,
        )
    except Exception as exc:
        import traceback

        traceback.print_exc()
        print(f"agent: boot failed: {exc!r}", file=sys.stderr, flush=True)
        if ready is not None:
            ready.write(json.dumps({"ok": False, "message": f"{type(exc).__name__}: {exc}"}) + "\n")
            ready.close()
        return 1
    if os.getpid() == 1:  # a namespace's init: local sandboxes and Kubernetes pods
        shield_from_signals()
    if ready is not None:
        ready.write(
            json.dumps(
                {"ok": True, "host_pid": host_pid, "pid": os.getpid(), "boot_ms": (time.monotonic() - started) * 1000}
            )
            + "\n"
        )
        ready.close()
    agent.serve(listener)
    return 0


if __name__ == "__main__":
    sys.exit(main())
