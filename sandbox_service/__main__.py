"""`python -m sandbox_service serve [--host --port --backend ...]` (also the `orchard-sandbox` command).

Settings come from `ORCHARD_*` variables, then a `--config` JSON file, then flags (later wins). The
token is never a flag: see `ServiceConfig.resolve_token`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from pathlib import Path

from sandbox_service.server.auth import redact_secrets_in_logs
from sandbox_service.config import ServiceConfig
from sandbox_service.errors import IsolationUnavailableError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchard-sandbox", description="The orchard sandbox service.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the REST service")
    serve.add_argument("--config", type=Path, help="JSON file with ServiceConfig fields")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (0 = any free port; see --port-file)")
    serve.add_argument("--backend", choices=["local", "kubernetes"])
    serve.add_argument("--state-dir", type=Path, help="service-private state directory")
    serve.add_argument(
        "--unisolated",
        action="store_true",
        default=None,
        help="local backend without namespaces/cgroups (sandboxes see the host!)",
    )
    serve.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    serve.add_argument("--log-level", default="info")
    return parser


def _config(args: argparse.Namespace) -> ServiceConfig:
    fields = json.loads(args.config.read_text()) if args.config else {}
    flags = {
        "host": args.host,
        "port": args.port,
        "backend": args.backend,
        "state_dir": args.state_dir,
        "unisolated": args.unisolated,
    }
    fields.update({k: v for k, v in flags.items() if v is not None})
    return ServiceConfig(**fields)


def serve(config: ServiceConfig, *, port_file: Path | None = None, log_level: str = "info") -> None:
    import uvicorn

    from sandbox_service.server.app import create_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token, source = config.resolve_token()
    try:
        app = create_app(config)
    except IsolationUnavailableError as err:
        print(
            f"orchard-sandbox: {err}\n  Run as root on a kernel with user/mount/pid/net namespaces and cgroup v2, "
            "or pass --unisolated (ORCHARD_UNISOLATED=true) to run sandboxes WITHOUT isolation.",
            file=sys.stderr,
        )
        raise SystemExit(2) from err
    # Bind ourselves so that port 0 works and the chosen port can be reported before serving.
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on accepted sockets whose proto says TCP;
    # with proto 0 every response waits out the peer's delayed ACK (~40 ms per request).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    port = sock.getsockname()[1]
    print(
        f"orchard sandbox service ({config.backend} backend) on http://{config.host}:{port}; API token from {source}",
        flush=True,
    )
    del token
    if config.unisolated:
        print(
            "WARNING: unisolated mode: sandbox commands run on this host without namespaces or cgroups; "
            "they can see and change everything the service can.",
            file=sys.stderr,
            flush=True,
        )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level=log_level,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=10,
            ws_ping_interval=None,
        )
    )
    redact_secrets_in_logs()
    if port_file is not None:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(port))
        os.replace(tmp, port_file)  # atomic: a reader never sees a half-written port
    server.run(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        serve(_config(args), port_file=args.port_file, log_level=args.log_level)


if __name__ == "__main__":
    main()
