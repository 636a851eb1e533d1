"""`promaccel` command line: serve (and, from loadtests, bench)."""

from __future__ import annotations

import argparse
import logging
import sys

from .config import ConfigError, load_config


def _serve(args: argparse.Namespace) -> int:
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
                print(f"promaccel: --shard-label expects METRIC_REGEX=LABEL, got {item!r}", file=sys.stderr)
                return 2
            labels[regex] = label
        overrides["planner"]["shard_labels"] = labels
    try:
        cfg = load_config(
            args.config, backends=args.backend, redis_url=args.redis, host=args.host, port=args.port,
            overrides=overrides,
        )
    except ConfigError as exc:
        print(f"promaccel: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, (args.log_level or cfg.log_level).upper()),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    # One line per backend call at INFO would drown the access log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # numba's compiler logs every pass at DEBUG: megabytes per kernel.
    logging.getLogger("numba").setLevel(logging.WARNING)
    import uvicorn

    from .app import create_app

    from .warmup import warm_up

    # Compile the codec before the first query needs it (cached on disk after the first run).
    took = warm_up()
    if took > 2:
        print(f"compiled the query hot path in {took:.0f}s (first start only)", flush=True)
    app = create_app(cfg)
    host, port = cfg.listen.host, cfg.listen.port
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    backends = ", ".join(f"{b.name}={b.url}" for b in cfg.backends)
    cache = cfg.cache.redis_url and "redis" or "in-process"
    print(f"promaccel serving on http://{shown}:{port}  (backends: {backends}; cache: {cache})", flush=True)
    print(f"Grafana: add a Prometheus data source with URL http://{shown}:{port}", flush=True)
    uvicorn.run(
        app, host=host, port=port, log_level="warning", access_log=False,
        loop="auto", http="auto", workers=1,
        # Longer than clients' idle keep-alive (Grafana's Go client: 90 s), so promaccel never
        # closes a connection a client is about to reuse.
        timeout_keep_alive=120,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
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
    sub.add_parser("bench", help="replay the GPU fleet dashboard direct vs through promaccel "
                   "(options: promaccel bench -- --help)", add_help=False)
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "bench":
        from loadtests.bench import main as bench_main

        rest = argv[1:]
        return int(bench_main(rest[1:] if rest[:1] == ["--"] else rest) or 0)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
