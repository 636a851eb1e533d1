"""What promaccel tells about itself, used by every layer above the primitives:

    metrics.py   the Prometheus metrics of /metrics (METRICS)
    tracing.py   OpenTelemetry spans, when tracing is configured
    activity.py  the query records the operator page (/ui) and the access log show
"""
