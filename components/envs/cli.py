"""`orchard env serve --recipe swe`: serve a recipe as an OpenEnv environment (needs `orchard[openenv]`).

orchard env serve --recipe swe --port 8000                       # sandbox service from ORCHARD_SANDBOX_URL/TOKEN
                                                                 # clients' token: --token / ORCHARD_ENV_TOKEN,
                                                                 # else generated and printed once
orchard env serve --recipe claw --embedded-service --port 8001   # start a local sandbox service too (root)
orchard-env serve ...                                            # the same, as its own entry point
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import secrets
import sys

from sandbox_service.connection import SandboxConnection
from components.envs.session import EnvConfig
from components.recipes import recipe_names


def _config(args: argparse.Namespace, service: SandboxConnection) -> EnvConfig:
    return EnvConfig(
        recipe=args.recipe,
        recipe_options=json.loads(args.recipe_options),
        split=args.split,
        num_tasks=args.num_tasks,
        task_seed=args.task_seed,
        max_steps=args.max_steps,
        fork_setup=not args.no_fork,
        service=service,
    )


def server_token(given: str | None) -> str:
    """The clients' bearer token: --token, else $ORCHARD_ENV_TOKEN, else a fresh one printed once to stderr."""
    from components.envs.openenv_env import TOKEN_ENV

    token = given or os.environ.get(TOKEN_ENV)
    if not token:
        token = secrets.token_urlsafe(32)
        print(
            f"OpenEnv token (printed once; clients send it as 'Authorization: Bearer <token>', "
            f"RecipeEnvClient reads {TOKEN_ENV}): {token}",
            file=sys.stderr,
            flush=True,
        )
    return token


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from components.envs.openenv_env import create_env_app
    from sandbox_service.server.auth import redact_secrets_in_logs

    with contextlib.ExitStack() as stack:
        if args.embedded_service:
            from sandbox_service.embedded import EmbeddedService

            service = stack.enter_context(EmbeddedService()).connection()
            print(f"sandbox service: {service.url}", file=sys.stderr)
        else:
            service = SandboxConnection()
        app, shared = create_env_app(
            _config(args, service), token=server_token(args.token), max_concurrent_envs=args.max_concurrent
        )
        stack.callback(shared.close)
        print(
            f"OpenEnv {args.recipe} environment: http://{args.host}:{args.port} (ws /ws, POST /reset /step, "
            "GET /state /health)",
            file=sys.stderr,
        )
        server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level))
        redact_secrets_in_logs()
        server.run()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="orchard env", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="serve a recipe as an OpenEnv environment (HTTP + WebSocket)")
    p.add_argument("--recipe", required=True, choices=recipe_names())
    p.add_argument("--host", default="127.0.0.1", help="listen address (loopback by default)")
    p.add_argument(
        "--token", help="bearer token clients must send (default: $ORCHARD_ENV_TOKEN, else generated and printed once)"
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--split", default="train", choices=["train", "validation", "heldout"])
    p.add_argument("--num-tasks", type=int, default=64)
    p.add_argument("--task-seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=16, help="tool calls per episode before it is verified")
    p.add_argument("--max-concurrent", type=int, default=64, help="concurrent WebSocket sessions")
    p.add_argument(
        "--recipe-options", default="{}", help="JSON keyword arguments of the recipe, e.g. '{\"difficulty\": 2}'"
    )
    p.add_argument("--no-fork", action="store_true", help="set every episode up afresh (no setup snapshots)")
    p.add_argument(
        "--embedded-service",
        action="store_true",
        help="start a local sandbox service for this server (needs root for namespaces)",
    )
    p.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per sandbox call drowns the server log
    if args.command == "serve":
        return serve(args)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
