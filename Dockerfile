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
# The numba kernels compiled into the image, so that a pod does not compile them at start
# (tens of seconds; docs/SCALE.md "Pod start"). numba loads compiled code only from a cache
# directory it can write to, and keys each entry on the source file's path and content and
# on the CPU it was compiled for:
# - NUMBA_CACHE_DIR: the seeded cache, owned by the user promaccel runs as, so that it is
#   usable as is with a writable root (docker run, docker-compose.yml). With a read-only root
#   (deploy/base/deployment.yaml) an init container copies it into an emptyDir mounted at the
#   same path.
# - NUMBA_CPU_NAME/NUMBA_CPU_FEATURES: code for a named CPU instead of the build machine's, so
#   that the cache matches on every node (numba's default, the host CPU, would miss on any
#   node whose CPU differs from the builder's, and every pod would compile again). "generic"
#   runs on every x86-64 (or arm64) node; e.g. --build-arg NUMBA_CPU_NAME=x86-64-v3 for a
#   fleet of AVX2 nodes.
# The compile runs as that user, from / so that the installed package is what is compiled
# (the cache's entries name the installed files).
ARG NUMBA_CPU_NAME=generic
ARG NUMBA_CPU_FEATURES=""
ENV NUMBA_CACHE_DIR=/var/cache/promaccel/numba \
    NUMBA_CPU_NAME=${NUMBA_CPU_NAME} \
    NUMBA_CPU_FEATURES=${NUMBA_CPU_FEATURES}
RUN pip install . \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin promaccel \
    && install -d -o promaccel -g promaccel -m 0755 /var/cache/promaccel /var/cache/promaccel/numba
USER promaccel
RUN cd / && python -m proxy.codec.warmup && python -m proxy.engine.warmup
USER root

FROM base AS generator
COPY --from=prometheus /bin/promtool /usr/local/bin/promtool
ENTRYPOINT ["python", "-m", "loadtests.load"]
CMD ["build", "--help"]

FROM base AS promaccel
USER promaccel
EXPOSE 9091
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:9091/-/healthy', timeout=2).status != 200)"]
ENTRYPOINT ["promaccel"]
CMD ["serve", "--host", "0.0.0.0", "--port", "9091"]
