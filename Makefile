# promaccel — `make demo` runs promaccel over a generated GPU fleet; `make test` runs the suite;
# `make lint` runs ruff and mypy.
# They set everything up on a fresh Debian/Ubuntu machine (venv, PyPI packages, and Debian's
# packages when missing: prometheus and redis-server for everything; kubernetes-client (kubectl)
# and chromium for the tests only). Services always run on their own loopback ports.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=
# `make test` runs the suite on this many pytest-xdist workers (0: in this process), each test
# file whole on one worker, longest first (tests/conftest.py). PROMACCEL_TEST_PORTS=LOW-HIGH
# keeps every port the suite binds in that range (tests/servers.py).
TEST_WORKERS ?= 2
# Debian packages installed when a command is missing, as command:package. The demo, the
# benchmarks and the soak need DEMO_DEPS; the tests also render the deploy overlays (kubectl:
# tests/deploy/), drive the operator page in a browser (chromium: tests/api/test_ui_browser.py)
# and make TLS certificates for the rediss:// deploy variant (openssl: tests/deploy/test_redis_auth.py).
DEMO_DEPS := prometheus:prometheus promtool:prometheus redis-server:redis-server
TEST_DEPS := $(DEMO_DEPS) kubectl:kubernetes-client chromium:chromium openssl:openssl

.PHONY: setup system-deps test-deps test test-fast demo bench bench-quick soak clean lint

setup: system-deps $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $@

# $(call install_missing,PAIRS): apt-get install the packages of PAIRS whose command is missing.
define install_missing
	@missing=""; \
	for pair in $(1); do \
	  command -v "$${pair%%:*}" >/dev/null && continue; \
	  case " $$missing " in *" $${pair#*:} "*) ;; *) missing="$$missing $${pair#*:}" ;; esac; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian's$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
endef

system-deps:
	$(call install_missing,$(DEMO_DEPS))

test-deps: system-deps
	$(call install_missing,$(TEST_DEPS))

test: setup test-deps
	$(BIN)/python -m proxy.codec.warmup
	$(BIN)/python -m proxy.engine.warmup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-fast: setup test-deps
	$(BIN)/python -m pytest -q -m "not prom and not redis and not slow" $(PYTEST_ARGS)

# promaccel on 127.0.0.1:9091, the reference Prometheus on :9090 (DEMO_ARGS="--port N ...");
# Ctrl-C, SIGTERM or SIGHUP stops it and everything it started.
demo: setup
	$(BIN)/python -m loadtests.demo $(DEMO_ARGS)

# The full benchmark: the first run builds two datasets (~30 min on 2 cores, cached under
# .cache/bench/), then every scenario replays for ~10-15 min. bench-quick: the same scenarios on
# the small CI fleet (one dataset, no 7 d window), about 3 minutes with its dataset build.
bench: setup
	$(BIN)/python -m loadtests.bench $(BENCH_ARGS)

bench-quick: setup
	$(BIN)/python -m loadtests.bench --small $(BENCH_ARGS)

# The dashboard replayed by SOAK_USERS users for SOAK_MINUTES against promaccel (Redis, the small
# fleet): RSS, latency and failures sampled every 5 s into loadtests/results/soak-<time>/
# (soak.csv, soak.png, summary.md). Not part of `make test`.
SOAK_MINUTES ?= 30
SOAK_USERS   ?= 50
soak: setup
	$(BIN)/python -m loadtests.soak --minutes $(SOAK_MINUTES) --users $(SOAK_USERS) $(SOAK_ARGS)

# ruff over the repository, mypy over shardplanner/ (strict) and proxy/; both configured in
# pyproject.toml.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .cache .pytest_cache .hypothesis *.egg-info
