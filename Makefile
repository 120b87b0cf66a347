# monsoon — the two commands a new user runs: `make demo` and `make test`.
# Every target does its own set-up on first use (idempotent; fast the second time).
SHELL   := /bin/bash
VENV    := .venv
PY      := $(VENV)/bin/python
PYTEST  := $(VENV)/bin/pytest
CACHE   ?= .cache
export MONSOON_CACHE := $(abspath $(CACHE))
# `monsoon setup PIECE ...` (monsoon/hostsetup.py, without the CLI's imports): the one way each piece is set up
SETUP   := $(PY) -m monsoon.hostsetup
PYTEST_ARGS ?=

.PHONY: test-rust test-java lint help setup dtls prereqs venv kafka debs postgres platform toxiproxy ferretdb infinispan cassandra loadgen docker images k8s demo test test-unit defects bench-load bench-analyze bench-day clean reap story-budgets wheel
.DEFAULT_GOAL := help

help:
	@echo "make demo       run the x10 burst flood on the in-memory and Kafka stacks (quick profile) and print the sign-off checklist"
	@echo "make test       run monsoon's own tests (unit + integration on real Kafka, Postgres and the reference platform)"
	@echo "make test-unit  only the fast unit tests (test-rust: the load core's cargo tests; test-java: the platform's JUnit tests)"
	@echo "make lint       ruff, mypy and the import contracts (layers, no cycles)"
	@echo "make defects    run the seeded-defect experiments and 3 clean controls; print the catch matrix (~30-40 min)"
	@echo "make story-budgets  the demo's story with the services under CPU quotas of 0.5, 1 and 2 cores and beside a busy neighbour (BUDGETS_ARGS=--budgets 0.5,neighbour)"
	@echo "make bench-load the load engine's benchmark: CPU per message (monsoon vs paho), max connections, pacing; one JSON line"
	@echo "make bench-analyze  monsoon analyze on a synthetic 24 h-style run (planted loss, duplicates, ...): seconds, peak RSS, bytes/message; one JSON line"
	@echo "make bench-day  a day's volume (432 M QoS 1 messages at 100,000 msg/s, 72 min) through the live path: RSS per process, bytes/message, exact accounting, analyze time; one JSON line (BENCH_DAY_ARGS='--messages 30e6')"
	@echo "make setup      install everything the above need (venv, then monsoon setup: Kafka jars, Postgres, Toxiproxy, FerretDB, Infinispan, Cassandra, the reference platform, the load engine, Docker and its images, Kubernetes)"
	@echo "make images     build the container images (monsoon/platform, kafka, postgres, toxiproxy) from a debootstrapped Debian"
	@echo "make reap       kill what runs killed with -9 left behind (live runs are left alone)"
	@echo "make wheel      monsoon's wheel with the native load engine inside, tagged manylinux by auditwheel, into dist/ (WHEEL_DIR=...)"

prereqs:
	@tools/check-prereqs

venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt pyproject.toml
	@tools/check-prereqs
	test -x $(PY) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements.txt
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

# each one is `monsoon setup <piece>`: idempotent (fast when done), a refusal is one line naming what to install.
# kafka: the Kafka 4.2 jars (Maven Central); postgres: PostgreSQL (Debian); debs: + Mosquitto, Chromium (the
# tests); platform: the reference platform's jar (Maven); toxiproxy, ferretdb: built with Go; infinispan,
# cassandra: Maven Central; docker: docker.io + debootstrap (Debian; monsoon runs its own private daemon);
# images: monsoon/{base,jre,platform,kafka,postgres,toxiproxy} from a debootstrapped Debian base (no registry)
kafka postgres debs platform toxiproxy ferretdb infinispan cassandra docker images: venv
	@$(SETUP) $@

# a single-node Kubernetes v1.33.13 + Chaos Mesh's controller and chaos-daemon + Helm v3.22.0, built from Go modules (monsoon
# cluster up|down); tools/build-k8s builds the daemon (cgo) last: ~13 s with a warm Go build cache, 3-7 min cold
k8s:
	@tools/build-k8s

# the native load core (Rust): monsoon-loadgen
LOADGEN_DIR := monsoon/load/loadgen
LOADGEN := $(LOADGEN_DIR)/target/release/monsoon-loadgen
# OpenSSL (the engine's DTLS) linked statically where libssl-dev's archives are: see static-openssl.mk
include $(LOADGEN_DIR)/static-openssl.mk
OPENSSL_A := $(X86_64_UNKNOWN_LINUX_GNU_OPENSSL_LIB_DIR)
ifneq ($(and $(wildcard $(OPENSSL_A)/libssl.a),$(wildcard $(OPENSSL_A)/libcrypto.a)),)
export X86_64_UNKNOWN_LINUX_GNU_OPENSSL_STATIC X86_64_UNKNOWN_LINUX_GNU_OPENSSL_LIB_DIR X86_64_UNKNOWN_LINUX_GNU_OPENSSL_INCLUDE_DIR
endif
loadgen: $(LOADGEN)
$(LOADGEN): $(shell find $(LOADGEN_DIR)/src -type f 2>/dev/null) $(LOADGEN_DIR)/Cargo.toml $(LOADGEN_DIR)/Cargo.lock
	@command -v cargo >/dev/null || { echo "monsoon: cargo not found: install Rust (https://rustup.rs) to build the native load core" >&2; exit 127; }
	@test -f /usr/include/openssl/ssl.h || pkg-config --exists openssl 2>/dev/null || { echo "monsoon: OpenSSL's headers not found: the native load core's CoAP over DTLS links OpenSSL (apt-get install -y libssl-dev)" >&2; exit 1; }
	cargo build -q --release --locked --manifest-path $(LOADGEN_DIR)/Cargo.toml
	touch $@

setup: venv
	@$(SETUP) kafka debs platform toxiproxy ferretdb infinispan cassandra loadgen docker images k8s
	@$(MAKE) -s dtls

# CoAP over DTLS (Hono's CoAP devices, transport hono-coap): DTLSSocket has no wheel, so it is built once from its
# source package (autoconf, automake; ~45 s) into the wheelhouse and installed from there. Best effort: a machine
# that cannot build it still sets up, and the DTLS story skips, saying how to get it.
WHEELHOUSE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/monsoon/wheelhouse
DTLS_PIN := DTLSSocket==0.2.3
dtls: venv
	@$(PY) -c 'import DTLSSocket' 2>/dev/null || { mkdir -p "$(WHEELHOUSE)" && \
	  { $(VENV)/bin/pip install -q --no-index --find-links "$(WHEELHOUSE)" '$(DTLS_PIN)' 2>/dev/null || \
	    { $(VENV)/bin/pip wheel -q --no-deps -w "$(WHEELHOUSE)" '$(DTLS_PIN)' && \
	      $(VENV)/bin/pip install -q --no-index --find-links "$(WHEELHOUSE)" '$(DTLS_PIN)'; }; } || \
	  echo "monsoon: DTLSSocket did not build (it needs autoconf and automake: apt-get install -y autoconf automake); CoAP over DTLS will skip"; }

# only what the demo uses: Kafka, PostgreSQL, the reference platform (the python load engine, no faults)
demo: venv
	@$(SETUP) kafka postgres platform
	@$(PY) -m monsoon.cli demo $(PYTEST_ARGS)

test: setup lint test-rust test-java
	$(PYTEST) tests --durations=30 $(PYTEST_ARGS)

# the native load core's own tests (cargo test: unit tests and its event loop against local sinks). Their debug
# builds go to a target dir in the user's caches, not the checkout's, so that a fresh clone (CI) compiles only the
# crate itself, not its dependencies again: 24 s cold, 3 s from a second clone. CARGO_TEST_TARGET=DIR to change it.
CARGO_TEST_TARGET ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/monsoon/cargo-test
test-rust:
	@command -v cargo >/dev/null || { echo "monsoon: cargo not found: install Rust (https://rustup.rs) to test the native load core" >&2; exit 127; }
	cargo test -q --locked --manifest-path $(LOADGEN_DIR)/Cargo.toml --target-dir $(CARGO_TEST_TARGET)

# the reference platform's unit tests (JUnit 5 through its Maven build: compiles only what changed since `make platform`)
test-java: platform
	mvn -q -B -f stacks/reference-platform/pom.xml test

# ruff and mypy on monsoon/ (configured in pyproject.toml), then the import contracts: the layers, checks/report
# only on the timeline and specs, no cycles
# mypy's incremental cache is kept with the user's caches, not the checkout's, so that a fresh clone (CI) checks
# only what changed: ~90 s cold, ~3 s warm. MYPY_CACHE=.cache/mypy keeps it per checkout.
MYPY_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/monsoon/mypy
lint: venv
	$(VENV)/bin/ruff check monsoon
	$(VENV)/bin/mypy --cache-dir $(MYPY_CACHE)
	$(VENV)/bin/lint-imports --no-cache

test-unit: venv
	$(PYTEST) tests/unit $(PYTEST_ARGS)

# DEFECTS_ARGS: e.g. --only a,d  --repeats 1  --neighbour (see python -m monsoon.selftest.defects --help);
# MONSOON_SERVICE_CPUS=0.5 confines the services to half a core
DEFECTS_ARGS ?=
defects: setup
	@$(PY) -m monsoon.selftest.defects $(DEFECTS_ARGS)

# BUDGETS_ARGS: e.g. --budgets 0.5,neighbour  --only-check (see python -m monsoon.selftest.budgets --help)
BUDGETS_ARGS ?=
story-budgets: setup
	@$(PY) -m monsoon.selftest.budgets $(BUDGETS_ARGS)

# BENCH_ARGS: e.g. --quick (see python -m monsoon.selftest.bench --help)
BENCH_ARGS ?=
bench-load: venv loadgen debs
	@$(PY) -m monsoon.selftest.bench $(BENCH_ARGS)

# ANALYZE_ARGS: e.g. --messages 34.6e6 --baseline-src DIR (see python -m monsoon.selftest.analyze_bench --help)
ANALYZE_ARGS ?= --messages 5e6
bench-analyze: venv
	@$(PY) -m monsoon.selftest.analyze_bench $(ANALYZE_ARGS)

# BENCH_DAY_ARGS: e.g. --messages 30e6 --rate 100000 --every 60 --keep (see python -m monsoon.selftest.day --help)
BENCH_DAY_ARGS ?=
bench-day: venv loadgen
	@$(PY) -m monsoon.selftest.day $(BENCH_DAY_ARGS)

# the wheel users install: pip wheel (setup.py compiles monsoon-loadgen), then auditwheel repair (manylinux tag)
WHEEL_DIR ?= dist
wheel:
	@tools/build-wheel $(WHEEL_DIR)

reap: venv
	$(PY) -m monsoon.cli reap

clean:
	rm -rf $(VENV) $(CACHE) stacks/reference-platform/target runs
