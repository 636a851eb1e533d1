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
import json
import logging
import os
import sys
from typing import Any

from .config import Config, ConfigError, load_config

WORKER_ARGV_ENV = "PROMACCEL_WORKER_ARGV"
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
        from .result.warmup import warm_up as warm_up_cross_store

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

    args = _parser().parse_args(json.loads(os.environ[WORKER_ARGV_ENV]))
    cfg = _config(args)
    configure(cfg.listen)  # this worker's server limits (its protocol class is its own)
    _setup(args, cfg)
    return create_app(cfg)


def _serve(args: argparse.Namespace, argv: list[str]) -> int:
    try:
        cfg = _config(args)
    except (ConfigError, ValueError) as exc:
        print(f"promaccel: {exc}", file=sys.stderr)
        return 2
    if args.workers < 1:
        print("promaccel: --workers must be at least 1", file=sys.stderr)
        return 2
    import uvicorn

    host, port = cfg.listen.host, cfg.listen.port
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    # Never a credential: URLs cannot hold any (config), and basic_auth shows as a marker.
    backends = ", ".join(f"{b.name}={b.display_url}{' (basic auth)' if b.basic_auth else ''}"
                         for b in cfg.backends)
    cache = cfg.cache.redis_url and "redis" or "in-process"
    if cfg.auth.enabled:  # tenant names only, never a credential
        cache += f"; auth: {len(cfg.auth.tenants)} tenants ({', '.join(t.name for t in cfg.auth.tenants)})"
    from .api.server_limits import configure

    # http: uvicorn's httptools protocol with header size and read deadlines (proxy/api/server_limits.py);
    # timeout_keep_alive from listen.keep_alive_timeout.
    common: dict[str, Any] = dict(
        host=host, port=port, log_level="warning", access_log=False, loop="auto", **configure(cfg.listen),
    )
    if args.workers == 1:
        from .api.app import create_app

        _setup(args, cfg)
        app = create_app(cfg)
    else:
        # Compile the codec once (numba's on-disk cache) in a short-lived process, so that
        # the workers load it instead of compiling it N times at once, and this supervising
        # process stays small (it only forwards signals and restarts workers).
        import subprocess

        subprocess.run([sys.executable, "-c", "from proxy.codec.warmup import warm_up; warm_up(); "
                        "from proxy.result.warmup import warm_up as w; w()"], check=False)
        os.environ[WORKER_ARGV_ENV] = json.dumps(argv)
        if cfg.cache.enabled and not cfg.cache.redis_url:
            print(f"promaccel: {args.workers} workers without Redis: each worker has its own "
                  "in-process cache (cache.max_bytes each) and they share nothing", flush=True)
    print(f"promaccel serving on http://{shown}:{port}  (backends: {backends}; cache: {cache}"
          f"{f'; {args.workers} workers' if args.workers > 1 else ''})", flush=True)
    print(f"Grafana: add a Prometheus data source with URL http://{shown}:{port}", flush=True)
    if args.workers == 1:
        uvicorn.run(app, workers=1, **common)
    else:
        uvicorn.run("proxy.cli:worker_app", factory=True, workers=args.workers, **common)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="promaccel", description="PromQL query acceleration proxy")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the Prometheus HTTP API in front of the backends")
    s.add_argument("--config", help="YAML config file (default: $PROMACCEL_CONFIG)")
    s.add_argument("--backend", action="append", help="backend URL (repeatable); overrides the file")
    s.add_argument("--redis", help="Redis URL for the results cache (default: in-process cache)")
    s.add_argument("--host", help="listen address (default 127.0.0.1)")
    s.add_argument("--port", type=int, help="listen port (default 9091)")
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
    sys.exit(main())
