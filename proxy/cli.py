"""`promaccel` command line: `promaccel serve`.

`serve --workers N` (N > 1) runs N uvicorn worker processes behind one listening socket (the
kernel spreads connections over them). Each worker builds the same configuration from the
same command line (passed in $PROMACCEL_WORKER_ARGV), so they share the Redis cache; each
has its own in-process state: the in-process LRU (without Redis every worker caches alone,
`cache.max_bytes` each), request coalescing (single-flight and the landing zone: identical
requests that land on different workers are not merged), `backends[].max_parallel` (per
worker: N workers may send N times as many concurrent calls) and /metrics (a scrape sees the
worker that answered it).
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any

import uvicorn
from uvicorn.supervisors.multiprocess import Process as UvicornWorker

from .config import Config, ConfigError, load_config

WORKER_ARGV_ENV = "PROMACCEL_WORKER_ARGV"
# Exit codes of `serve`: 2 a bad command line or configuration; 3 it could not start (the
# address cannot be bound, e.g. the port is in use, or the app failed to start).
EXIT_USAGE = 2
EXIT_STARTUP = 3
log = logging.getLogger("promaccel")
# The app this process serves (each worker's own), for the shutdown line's cache counts.
_APP: Any = None
# Libraries that log requests, answers or credentials at DEBUG/INFO (botocore logs the STS
# answer with the temporary secret key and session token, and the web identity token it
# sends): kept at WARNING unless PROMACCEL_DEBUG_LIBRARIES=1 (or --debug-libraries).
DEBUG_LIBRARIES_ENV = "PROMACCEL_DEBUG_LIBRARIES"
QUIET_LIBRARIES = ("botocore", "boto3", "s3transfer", "urllib3", "requests", "requests_aws4auth",
                   "aiohttp", "httpx", "httpx_aiohttp", "httpcore", "hpack", "h2", "h11")


def _config(args: argparse.Namespace) -> Config:
    """The configuration of `serve`'s arguments; raises ConfigError or ValueError."""
    overrides: dict[str, dict[str, object]] = {"planner": {}}
    if args.split_interval is not None:
        overrides["planner"]["split_interval"] = None if args.split_interval in ("0", "none") else args.split_interval
    if args.shards is not None:
        overrides["planner"]["shards"] = args.shards if args.shards == "auto" else int(args.shards)
    if args.shard_label:
        labels = {}
        for item in args.shard_label:
            regex, sep, label = item.rpartition("=")
            if not sep or not regex or not label:
                raise ValueError(f"--shard-label expects METRIC_REGEX=LABEL, got {item!r}")
            labels[regex] = label
        overrides["planner"]["shard_labels"] = labels
    return load_config(
        args.config, backends=args.backend, redis_url=args.redis, host=args.host, port=args.port,
        overrides=overrides,
    )


def _setup(args: argparse.Namespace, cfg: Config) -> None:
    """Logging and the compiled codec, in the serving process (each worker)."""
    from .backends.redaction import install_log_redaction

    # Before any record is made: every record is redacted as it is created (backends/redaction.py).
    install_log_redaction()
    logging.basicConfig(
        level=getattr(logging, (args.log_level or cfg.log_level).upper()),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    install_log_redaction()  # and the filter on basicConfig's handler
    if cfg.log_format == "json":
        from .api.access_log import JsonFormatter

        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    if not (getattr(args, "debug_libraries", False) or _env_flag(DEBUG_LIBRARIES_ENV)):
        # Their DEBUG output carries request and answer bodies (botocore: STS credentials);
        # one line per backend call at INFO (httpx) would drown the access log.
        for name in QUIET_LIBRARIES:
            logging.getLogger(name).setLevel(logging.WARNING)
    # numba's compiler logs every pass at DEBUG: megabytes per kernel.
    logging.getLogger("numba").setLevel(logging.WARNING)
    from .codec.warmup import warm_up

    # Compile the codec before the first query needs it (cached on disk after the first run),
    # and for a hybrid fleet the kernels promaccel evaluates above the stores.
    took = warm_up()
    if len(cfg.backends) > 1 or any(b.holds is not None for b in cfg.backends):
        from .engine.warmup import warm_up as warm_up_cross_store

        took += warm_up_cross_store()
    if took > 2:
        print(f"compiled the query hot path in {took:.0f}s (first start only)", flush=True)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def worker_app() -> Any:
    """uvicorn's app factory in each worker of `serve --workers N`: the app of the command
    line the parent passed in $PROMACCEL_WORKER_ARGV."""
    from .api.app import create_app
    from .api.server_limits import configure

    global _APP
    args = _parser().parse_args(json.loads(os.environ[WORKER_ARGV_ENV]))
    cfg = _config(args)
    configure(cfg.listen)  # this worker's server limits (its protocol class is its own)
    _setup(args, cfg)
    _APP = create_app(cfg)
    return _APP


def version() -> str:
    """The installed distribution's version (pyproject.toml's), else the source tree's."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("promaccel")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from . import __version__

        return __version__


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound and listening before anything is announced (as uvicorn
    binds: SO_REUSEADDR, IPv6 when the host has a colon); raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)  # connections wait in the backlog until the app is up
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)  # the workers of --workers N share it
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, announcing once it serves and logging what its shutdown drained."""

    announce: Callable[[], None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit and self.announce is not None:
            self.announce()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn: stop accepting, let the requests in flight finish (cancelled after
        # listen.shutdown_timeout), then the app's shutdown (QueryService.aclose).
        running = list(self.server_state.tasks)
        log.info("promaccel stopping [pid %d]: no new connections; %d requests in flight, given up "
                 "to listen.shutdown_timeout (%gs) to finish", os.getpid(), len(running),
                 self.config.timeout_graceful_shutdown or 0)
        await super().shutdown(sockets)
        finished = sum(1 for t in running if t.done() and not t.cancelled())
        drained = getattr(getattr(getattr(_APP, "state", None), "executor", None), "drained", None)
        cache = "" if drained is None else (
            f"; {drained.cache_writes_flushed} background cache writes flushed, "
            f"{drained.cache_writes_dropped} dropped at the 2 s bound; "
            f"{drained.leases_released} fetch leases released")
        log.info("promaccel stopped [pid %d]: %d requests in flight finished, %d cancelled at "
                 "listen.shutdown_timeout%s; backend connections closed",
                 os.getpid(), finished, len(running) - finished, cache)


class _WorkerProcess(UvicornWorker):
    """A worker of `serve --workers N`: runs `_Server` (its shutdown line) instead of uvicorn's."""

    @property
    def server(self) -> uvicorn.Server:
        if self._server is None:
            self._server = _Server(config=self.config)
        return self._server


# The placeholders of config/examples/ and deploy/overlays/ (AWS's documentation account, an
# all-zero AMP workspace): a deploy that still carries one would run without its AMP data.
_PLACEHOLDER_WORKSPACE = "ws-00000000-0000-0000-0000-000000000000"
_PLACEHOLDER_ACCOUNT = ":111122223333:"


def placeholders(cfg: Config, environ: Mapping[str, str]) -> str:
    """Why this configuration still holds an example's placeholder ("" when it does not)."""
    for b in cfg.backends:
        if b.kind == "amp" and _PLACEHOLDER_WORKSPACE in b.url:
            return (f"backend {b.name!r}: {_PLACEHOLDER_WORKSPACE} is the examples' placeholder workspace: set "
                    "your AMP workspace's URL (deploy/overlays/*/promaccel.yaml, config/examples/)")
    role = environ.get("AWS_ROLE_ARN", "")
    if any(b.kind == "amp" for b in cfg.backends) and _PLACEHOLDER_ACCOUNT in role:
        return (f"AWS_ROLE_ARN {role} is in AWS's documentation account (111122223333), the deploy overlays' "
                "placeholder: set the IAM role in the service account's eks.amazonaws.com/role-arn annotation")
    return ""


def _serve(args: argparse.Namespace, argv: list[str]) -> int:
    global _APP
    try:
        cfg = _config(args)
    except (ConfigError, ValueError) as exc:
        print(f"promaccel: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.workers < 1:
        print("promaccel: --workers must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    placeholder = placeholders(cfg, os.environ)
    if placeholder:
        print(f"promaccel: {placeholder}", file=sys.stderr)
        return EXIT_USAGE
    host, port = cfg.listen.host, cfg.listen.port
    # Bound first: a busy port fails in a moment, before compiling or announcing anything.
    try:
        sock = _bind(host, port)
    except OSError as exc:
        why = ("the port is in use by another process: stop it, or choose another port with --port N"
               if exc.errno == errno.EADDRINUSE else "choose another address with --host or port with --port N")
        print(f"promaccel: cannot listen on {host}:{port} ({exc.strerror or exc}): {why} "
              "(listen.host, listen.port in a config file)", file=sys.stderr)
        return EXIT_STARTUP
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    # Never a credential: URLs cannot hold any (config), and basic_auth shows as a marker.
    backends = ", ".join(f"{b.name}={b.display_url}{' (basic auth)' if b.basic_auth else ''}"
                         for b in cfg.backends)
    cache = cfg.cache.redis_url and "redis" or "in-process"
    if cfg.auth.enabled:  # tenant names only, never a credential
        cache += f"; auth: {len(cfg.auth.tenants)} tenants ({', '.join(t.name for t in cfg.auth.tenants)})"

    def announce() -> None:
        print(f"promaccel serving on http://{shown}:{port}  (backends: {backends}; cache: {cache}"
              f"{f'; {args.workers} workers' if args.workers > 1 else ''})", flush=True)
        print(f"Grafana: add a Prometheus data source with URL http://{shown}:{port}", flush=True)

    from .api.server_limits import configure

    # http: uvicorn's httptools protocol with header size and read deadlines (proxy/api/server_limits.py);
    # timeout_keep_alive from listen.keep_alive_timeout.
    common: dict[str, Any] = dict(
        host=host, port=port, log_level="warning", access_log=False, loop="auto", **configure(cfg.listen),
    )
    try:
        if args.workers == 1:
            from .api.app import create_app

            _setup(args, cfg)
            _APP = create_app(cfg)
            server = _Server(uvicorn.Config(_APP, workers=1, **common))
            server.announce = announce  # once the app has started and the socket accepts
            server.run(sockets=[sock])
            return 0 if server.started else EXIT_STARTUP
        # Compile the codec once (numba's on-disk cache) in a short-lived process, so that
        # the workers load it instead of compiling it N times at once, and this supervising
        # process stays small (it only forwards signals and restarts workers).
        import subprocess

        from uvicorn.supervisors import multiprocess

        subprocess.run([sys.executable, "-c", "from proxy.codec.warmup import warm_up; warm_up(); "
                        "from proxy.engine.warmup import warm_up as w; w()"], check=False)
        os.environ[WORKER_ARGV_ENV] = json.dumps(argv)
        if cfg.cache.enabled and not cfg.cache.redis_url:
            print(f"promaccel: {args.workers} workers without Redis: each worker has its own "
                  "in-process cache (cache.max_bytes each) and they share nothing", flush=True)
        config = uvicorn.Config("proxy.cli:worker_app", factory=True, workers=args.workers, **common)
        # The supervisor starts (and restarts) its workers as this class: each logs its drain.
        multiprocess.Process = _WorkerProcess  # type: ignore[misc]
        announce()  # the socket is bound and listening; the workers accept as they come up
        multiprocess.Multiprocess(config, sockets=[sock]).run()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        sock.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="promaccel", description="PromQL query acceleration proxy")
    parser.add_argument("--version", action="version", version=f"promaccel {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the Prometheus HTTP API in front of the backends")
    s.add_argument("--config", help="YAML config file (default: $PROMACCEL_CONFIG)")
    s.add_argument("--backend", action="append", help="backend URL (repeatable); overrides the file")
    s.add_argument("--redis", help="Redis URL for the results cache (default: in-process cache)")
    s.add_argument("--host", help="listen address (default 127.0.0.1)")
    s.add_argument("--port", type=int, help="listen port (default 9091); a port in use exits 3 at once")
    s.add_argument("--split-interval", help="time-split interval, e.g. 1h (0 or none: off)")
    s.add_argument("--shards", help="node shards per query: a number or 'auto'")
    s.add_argument("--shard-label", action="append", help="METRIC_REGEX=LABEL (repeatable)")
    s.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    s.add_argument("--debug-libraries", action="store_true",
                   help="let botocore, urllib3, aiohttp, httpx and httpcore log below WARNING too "
                   f"(default: pinned to WARNING; also ${DEBUG_LIBRARIES_ENV}=1). Their lines are "
                   "redacted like promaccel's own, but they log request and answer bodies")
    s.add_argument("--workers", type=int, default=int(os.environ.get("PROMACCEL_WORKERS", "1") or 1),
                   help="worker processes sharing the listening socket (default 1, or "
                   "$PROMACCEL_WORKERS); give them a Redis cache to share (--redis)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    if argv is None:
        argv = sys.argv[1:]
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args, list(argv))
    return 2


if __name__ == "__main__":
    # `python -m proxy.cli`: run as the module proxy.cli, whose classes and state the workers of
    # --workers N (which import proxy.cli) share, not as a second copy named __main__.
    from proxy import cli

    sys.exit(cli.main())
