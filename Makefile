# infergate: two commands on a fresh machine, `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
RUNTIME := .venv-triton
PY := $(VENV)/bin/python
PIP_FLAGS := --disable-pip-version-check --quiet --progress-bar off

.PHONY: run test test-fast lint bench bench-rollout loadtest venv runtime sample clean

# The services' environment (numpy 2, torch CPU, test tools), pinned by
# pyproject.toml + constraints.txt.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) -c constraints.txt -e '.[dev,torch]'
	touch $@

# The environment Triton's Python-backend stub imports (numpy<2, onnxruntime, tritonserver).
$(RUNTIME)/.installed: infergate/triton/runtime-requirements.txt
	test -x $(RUNTIME)/bin/python || $(PYTHON) -m venv $(RUNTIME)
	$(RUNTIME)/bin/python -m pip install $(PIP_FLAGS) -r infergate/triton/runtime-requirements.txt
	touch $@

# KServe's Python SDK for the client-compatibility test (its pins conflict with the services')
KSERVE_ENV := .venv-kserve
$(KSERVE_ENV)/.installed: tests/kserve-requirements.txt
	test -x $(KSERVE_ENV)/bin/python || $(PYTHON) -m venv $(KSERVE_ENV)
	$(KSERVE_ENV)/bin/python -m pip install $(PIP_FLAGS) -r tests/kserve-requirements.txt
	touch $@

venv: $(VENV)/.installed
runtime: $(RUNTIME)/.installed

sample: venv
	$(VENV)/bin/infergate sample build --repo model_repo

## run: set up, build the sample model if absent, start Triton + gateway + scheduler
## (HAProxy carries the hot path; installed from Debian when missing, else the Python
## data plane takes over and says so)
run: venv runtime haproxy-optional
	$(VENV)/bin/infergate up --repo model_repo --runtime-env $(RUNTIME)

## test: set up the same environments and run the whole suite, on TEST_WORKERS pytest
## processes (pytest-xdist), each taking whole files: a module's Triton and gateway stay
## in one process. The integration tests wait on processes as much as they compute: on
## 2 cores, 2 workers ran the suite in 728 s where one took 1,071 s (2026-12-06)
TEST_WORKERS ?= 2
test: venv runtime system-deps $(KSERVE_ENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=15

test-fast: venv runtime
	$(PY) -m pytest -q -m "not slow and not integration"

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy gateway scheduler converters infergate loadtests

## bench: every benchmark once into results/BENCHMARKS.md (loadtests/bench.py runs its
## list, then every other loadtests/bench_*.py: bench_rollout among them)
bench: venv runtime system-deps
	$(PY) -m loadtests.bench --out results

## bench-rollout: progressive delivery alone (four candidates rolled out, the gRPC
## detour's cost), table + PNG in results/rollout
bench-rollout: venv runtime system-deps
	$(PY) -m loadtests.bench_rollout --out results/rollout

## system-deps: Debian packages the tests need (haproxy: the native data plane;
## prometheus: the HPA adapter-rule test; nghttp2-client: h2load, make bench;
## chromium: the console's browser tests, driven by Playwright; postgresql: the records'
## store and leadership tests start their own throwaway server from its binaries)
HAVE_HAPROXY := { command -v haproxy || test -x /usr/sbin/haproxy; } >/dev/null 2>&1
HAVE_POSTGRES := ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
.PHONY: system-deps haproxy-optional
system-deps:
	@$(HAVE_HAPROXY) && command -v prometheus >/dev/null 2>&1 && command -v h2load >/dev/null 2>&1 \
	  && command -v chromium >/dev/null 2>&1 && $(HAVE_POSTGRES) || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy prometheus nghttp2-client chromium fonts-dejavu-core postgresql; }

# make run: HAProxy when it can be had; without it (no root, no apt) the gateway falls back
haproxy-optional:
	@$(HAVE_HAPROXY) || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo -n); \
	  ($$SUDO apt-get update -qq && \
	   $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy) \
	  || echo "[infergate] could not install HAProxy: the Python data plane will carry inference"; }

## loadtest: locust against a running `make run` stack (127.0.0.1:8000/8001), SLO verdict
LOADTEST_ARGS ?= --protocol all --scenario steady --users 4 --duration 30 --slo-p99-ms 2000
loadtest: venv
	$(PY) -m loadtests.run --http 127.0.0.1:8000 --grpc 127.0.0.1:8001 --out results/loadtest $(LOADTEST_ARGS)

clean:
	rm -rf .run results .model_repo.staging
