# syntax=docker/dockerfile:1
#
# Targets:
#   promaccel (default, last stage)  the proxy: `promaccel serve ...`
#   generator                        + promtool, builds a synthetic Prometheus TSDB with
#                                    `python -m loadtests.load build` (docker-compose.yml)
#
#   docker build -t promaccel .
#   docker build --target generator -t promaccel-generator .

ARG PYTHON_IMAGE=python:3.11-slim
ARG PROMETHEUS_IMAGE=prom/prometheus:v2.42.0

# promtool from the same Prometheus release the compose stack runs: the blocks it writes are
# then exactly what that Prometheus reads. The release binaries are static, so they run on
# Debian unchanged.
FROM ${PROMETHEUS_IMAGE} AS prometheus

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# Only what the package needs: the build context may hold a .venv and generated data.
COPY pyproject.toml README* ./
COPY proxy ./proxy
COPY shardplanner ./shardplanner
COPY loadtests ./loadtests
# Compile the numba hot path into the image so the first query does not pay for it.
RUN pip install . && cd / && python -m proxy.codec.warmup

FROM base AS generator
COPY --from=prometheus /bin/promtool /usr/local/bin/promtool
ENTRYPOINT ["python", "-m", "loadtests.load"]
CMD ["build", "--help"]

FROM base AS promaccel
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin promaccel
USER promaccel
EXPOSE 9091
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:9091/-/healthy', timeout=2).status != 200)"]
ENTRYPOINT ["promaccel"]
CMD ["serve", "--host", "0.0.0.0", "--port", "9091"]
