# mqd — make targets are the interface (see README.md)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python

.PHONY: install check-java test test-fast lint fmt demo bench chaos clean install-systemd screenshots docs

install: check-java $(VENV)/.installed $(VENV)/.compiled $(VENV)/.spark-packages $(VENV)/.kafka-jars $(VENV)/.schema-registry $(VENV)/.protobuf-tools $(VENV)/.host-tools

# mqd itself, plus the dev package (devtools/: chaos harness, demo) that the mqd wheel does not ship
$(VENV)/.installed: pyproject.toml devtools/pyproject.toml setup.py mqd/sources/kafka/_rbv2.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' -e ./devtools
	touch $@

# Bytecode of the editable sources: pip compiles what a wheel installs, but an editable install leaves
# mqd's own sources uncompiled, and where PYTHONDONTWRITEBYTECODE=1 is set every process would compile
# them again (about 0.1 s of CPU before `mqd run`'s first fetch, issue 16). Python reads existing .pyc
# files whatever that variable says. Timestamp mode (also when SOURCE_DATE_EPOCH is set): a .pyc whose
# source has changed since (mtime or size) is not used, and compileall rewrites only those.
PY_SOURCES := $(shell find mqd devtools/mqd_dev -name '*.py')
$(VENV)/.compiled: $(VENV)/.installed $(PY_SOURCES)
	$(PY) -m compileall -q --invalidation-mode timestamp mqd devtools/mqd_dev
	touch $@

# Spark's packages (Delta Lake, hadoop-aws, spark-avro, spark-sql-kafka) from Maven Central into mqd's
# cache (~/.cache/mqd, or MQD_CACHE_DIR): resolved once per machine by Spark itself, so that sessions
# and tests start from the cache, offline (mqd/spark/packages.py)
$(VENV)/.spark-packages: $(VENV)/.installed mqd/spark/packages.py
	@echo "resolving Spark packages into mqd's cache (Maven Central, once per machine)"
	@$(PY) -m mqd.spark.packages > $(VENV)/spark-packages.log 2>&1 || { tail -40 $(VENV)/spark-packages.log; exit 1; }
	@tail -1 $(VENV)/spark-packages.log
	touch $@

# Apache Kafka's broker jars for mqd.testing.KafkaCluster (the Kafka source's tests, chaos, bench),
# resolved by Ivy from Maven Central into mqd's cache once per machine (mqd/testing/maven.py)
# the test schema registry (Apicurio Registry, assembled by Maven from Maven Central; Maven itself
# fetched from there when `mvn` is missing) for the typed-records tests: once per machine into mqd's
# cache, ~75 s cold, so that `make test` does not pay it (mqd/testing/schema_registry.py)
$(VENV)/.schema-registry: $(VENV)/.installed mqd/testing/schema_registry.py mqd/testing/apicurio/pom.xml
	@echo "building the test schema registry into mqd's cache (Maven Central, once per machine)"
	@$(PY) -m mqd.testing.schema_registry --prepare > $(VENV)/schema-registry.log 2>&1 || { tail -40 $(VENV)/schema-registry.log; exit 1; }
	touch $@

# protoc and protobuf-java from Maven Central, and the job's Protobuf decoder (mqd/spark/jvm/) built by
# the JDK's javac, once per machine into mqd's cache; `mqd spark` does it itself at the first Protobuf
# schema it meets (mqd/spark/protobuf_tools.py)
$(VENV)/.protobuf-tools: $(VENV)/.installed mqd/spark/protobuf_tools.py mqd/spark/jvm/ProtobufDecode.java
	@echo "fetching protoc and protobuf-java, building the Protobuf decoder into mqd's cache (once per machine)"
	@$(PY) -m mqd.spark.protobuf_tools > /dev/null
	touch $@

$(VENV)/.kafka-jars: $(VENV)/.installed mqd/testing/kafka_cluster.py mqd/testing/maven.py
	@echo "resolving Apache Kafka's jars into mqd's cache (Maven Central, once per machine)"
	@$(PY) -m mqd.testing.maven $$($(PY) -c 'from mqd.testing.kafka_cluster import kafka_coordinates; print(*kafka_coordinates())') > /dev/null
	touch $@

# the many-hosts rig (mqd/testing/hosts.py, tests/hosts/, make chaos TOPOLOGY=hosts): nftables for its
# network faults and libfaketime for a host's clock, Debian's packages, installed when missing and
# make runs as root (the rig needs root anyway: elsewhere its tests skip and say what is missing)
$(VENV)/.host-tools: $(VENV)/.installed
	@if command -v nft >/dev/null 2>&1 && ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1; then \
		touch $@; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing nftables and libfaketime (the many-hosts rig)"; \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables libfaketime >/dev/null 2>&1 \
		|| { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables libfaketime >/dev/null; }; } \
		&& touch $@; \
	else \
		echo "note: the many-hosts rig needs root, nftables and libfaketime: its tests will skip"; \
	fi

check-java:
	@$(PYTHON) scripts/check_java.py

# two workers, each running whole test files (a module's servers and Spark session stay in one
# worker): the suite mostly waits on brokers, daemons and Spark, so 2 cores run it in about 0.6 of
# the serial time (measured: 38:51 for 1,632 tests at load 10, the serial run beside it); the 30
# slowest are listed at the end, so a CI log says where the suite's time went
test: install
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=30

test-fast: install
	$(BIN)/pytest -q -m "not spark and not slow"

LINT_PATHS := mqd tests bench devtools

lint: install
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy

fmt: install
	$(BIN)/ruff check --fix $(LINT_PATHS)
	$(BIN)/ruff format $(LINT_PATHS)

# API reference from the docstrings into $(DOCS_DIR) (open its index.html); reStructuredText, so
# roles such as :class: become links. Every module and subpackage of mqd is listed: the package's
# own __all__ names only __version__, and pdoc follows it.
# Private modules are left out (mqd/sources/kafka/_rbv2*.so is a ctypes library, not a module).
DOC_MODULES := mqd $(addprefix mqd.,$(filter-out __init__,$(basename $(notdir $(wildcard mqd/*.py)))) \
	$(notdir $(patsubst %/__init__.py,%,$(wildcard mqd/*/__init__.py))))

DOCS_DIR ?= build/docs

docs: install
	rm -rf $(DOCS_DIR)
	$(BIN)/pdoc --docformat restructuredtext -o $(DOCS_DIR) $(DOC_MODULES) '!.*\._[^.]*$$'
	@echo "API reference: $(DOCS_DIR)/index.html"

demo: install
	$(PY) -m mqd_dev.demo

$(VENV)/.bench-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $@

# SHAPES=main,hot (or space-separated): only these shapes of bench/shapes.py; QUICK=1: smoke sizes.
# Without SHAPES the landing's stores are compared too (publish latency by file size, local vs
# SeaweedFS, and the main shape end to end into each): bench/object_store_bench.py, and `mqd spark
# --once` on an up-to-date Delta table against plain PySpark: bench/spark_once.py; Kafka to a Delta
# table, mqd against Spark's own Kafka source: bench/kafka_to_table.py
comma := ,
bench: install $(VENV)/.bench-installed
	$(PY) -m bench $(foreach s,$(subst $(comma), ,$(SHAPES)),--shape $(s)) $(if $(QUICK),--quick)
	$(if $(SHAPES),,$(PY) -m bench.object_store_bench $(if $(QUICK),--runs 1 --records 200000))
	$(if $(SHAPES),,$(PY) -m bench.spark_once $(if $(QUICK),--quick))
	$(if $(SHAPES),,$(PY) -m bench.kafka_to_table $(if $(QUICK),--quick))
	$(if $(SHAPES),,$(PY) -m bench.landing_table_cost $(if $(QUICK),--sizes 200000 --rounds 1))
	$(if $(SHAPES),,$(PY) -m bench.fixed_cost $(if $(QUICK),--sizes 20000,100000 --rounds 1))

# KINDS=...: only these fault kinds (names, categories, classic, safety; see --help). SOURCE=kafka: three
# Apache Kafka brokers (KRaft, a controller node of their own; replication 3, min.insync.replicas 2,
# acks=all) with broker and leader kills, broker freezes and an unclean election; SOURCE=tansu: one
# Tansu broker (the issue 14 run); LANDING=s3: an object-store landing (mqd brokers only)
# GROUP_PROTOCOL=consumer (with SOURCE=kafka): the daemons join with KIP-848's consumer group protocol
# TOPOLOGY=hosts (as root): the many-hosts rig, Kafka, S3, daemons and Spark each on a network host of
# its own, faulted by host (devtools/mqd_dev/chaos/hosts_topology.py)
chaos: install
	$(PY) -m mqd_dev.chaos --rounds 20 $(if $(KINDS),--kinds $(KINDS)) $(if $(LANDING),--landing $(LANDING)) $(if $(LANDING_TABLE),--landing-table $(LANDING_TABLE)) $(if $(SOURCE),--source $(SOURCE)) $(if $(GROUP_PROTOCOL),--group-protocol $(GROUP_PROTOCOL)) $(if $(TOPOLOGY),--topology $(TOPOLOGY))

# the README's pictures of the views (docs/img/): a real daemon under load, its status page in headless
# chromium (apt-get install chromium) and one `mqd top` screen; not part of the tests
screenshots: install
	$(PY) -m mqd_dev.screenshots --out docs/img

install-systemd:
	sh systemd/install.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info devtools/build devtools/*.egg-info
