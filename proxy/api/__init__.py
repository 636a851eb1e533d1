"""The HTTP surface: Prometheus's API routes over the executor.

    app.py            `create_app`: the FastAPI app, its lifespan, middleware and handlers
    routing.py        the route wrapper (auth, request's tenant, PromError -> Prometheus's error)
    tenants.py        what a request sees: its tenant's query service and backends
    queries.py        /api/v1/query, /api/v1/query_range, /api/v1/explain
    relays.py         endpoints relayed to the backends (status pages, label values, ...)
    metadata.py       series, labels, label values and metadata fanned out over a hybrid fleet
    admin.py          cache administration (bearer token)
    health.py         /-/healthy, /-/ready, /metrics
    ui.py, ui.html    the operator page /ui and its data, /ui/data.json (proxy/observe/activity.py)
    access_log.py     per-request metrics and access log
    responses.py      results and backend replies -> Starlette responses
    params.py, forms.py   parameters read and validated as Prometheus does
    compress.py       the gzip middleware with ISA-L's compressor (codec/deflate.py)
    server_limits.py  uvicorn's protocol with header size and read deadlines

Nothing is re-exported here: `proxy.config` imports `api.params`, and the app imports the
executor, which imports the config.
"""
