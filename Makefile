# agentrt: `make run` starts the product on the embedded default (SQLite) with
# demo agents; `make test` runs the suite on PostgreSQL (fails if unreachable).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/agentrt
# pytest-xdist workers for `make test` (each its own test database, <name>_gw<N>);
# TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2

.PHONY: run cluster test venv dev browser nginx prometheus mcp-servers docs smoke bench mutants clean

# requirements.txt / requirements-dev.txt are hashed locks compiled from the
# .in files (README, "Dependencies"); pip refuses anything whose hash differs.
$(VENV)/.installed: requirements.txt
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH (or: make PYTHON=python3)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q --require-hashes -r requirements.txt
	touch $@

# Test tools (pytest, schemathesis, playwright, pip-tools) on top of the runtime lock.
$(VENV)/.dev-installed: requirements-dev.txt $(VENV)/.installed
	$(PIP) install -q --require-hashes -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

dev: $(VENV)/.dev-installed

# The demo's own secret key: created once, owner-only, kept across restarts
# (sessions survive); passed to `manage.py demo` only — every other process
# still refuses to start without DJANGO_SECRET_KEY (DEBUG off).
var/secret_key:
	@mkdir -p $(@D)
	@umask 077 && $(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(50))' > $@.tmp && mv $@.tmp $@

# PORT=8001 make run serves on another port (a port in use stops it at once, saying so).
# The recipe `exec`s the supervisor (no shell left between make and it): a SIGTERM to make reaches it,
# a SIGHUP or SIGINT to make alone it sees in make's handlers, and make's death outright stops it (the
# kernel's PR_SET_PDEATHSIG; ops/supervise.py). Ctrl-C reaches the whole group. Each stops everything.
run: venv var/secret_key
	DJANGO_SECRET_KEY="$$(cat var/secret_key)" AGENTRT_DEMO=1 exec $(PY) manage.py demo

# Several nodes on one PostgreSQL and one Redis (deploy/README.md): WORKERS
# worker nodes, two web nodes on WEB_PORT and WEB_PORT+1, maintenance;
# migrates first; Ctrl-C / SIGTERM / SIGHUP (to make or to the supervisor) stop it all (worker nodes
# drain); the recipe `exec`s the supervisor, as `run` does.
# The secret key is DJANGO_SECRET_KEY if set, else the demo's var/secret_key
# (every node must share one key: sessions and CSRF cross web nodes).
WORKERS ?= 2
WEB_PORT ?= 8000
CLUSTER_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/agentrt
CLUSTER_REDIS_URL ?= redis://127.0.0.1:6379/0
cluster: venv var/secret_key
	DATABASE_URL=$${DATABASE_URL:-$(CLUSTER_DATABASE_URL)} REDIS_URL=$${REDIS_URL-$(CLUSTER_REDIS_URL)} \
	DJANGO_SECRET_KEY="$${DJANGO_SECRET_KEY:-$$(cat var/secret_key)}" \
	exec $(PY) manage.py cluster --workers $(WORKERS) --port $(WEB_PORT) --log-dir var/cluster --state-file var/cluster/state.json $(CLUSTER_ARGS)

# The browser test drives Debian's chromium (Playwright's own download is not
# reachable everywhere): install it when it is missing and we may.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium for the browser test"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; \
	  else \
	    echo "the browser test needs chromium at /usr/bin/chromium: sudo apt-get install -y chromium"; exit 1; \
	  fi; }

# The login-throttling test (tests/security/test_login_proxy.py) runs the documented
# nginx config with Debian's nginx: install it when it is missing and we may.
nginx:
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's nginx for the login-throttling test"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx >/dev/null; \
	  else \
	    echo "the login-throttling test needs nginx: sudo apt-get install -y nginx"; exit 1; \
	  fi; }

# The alert rules' test (tests/ops/test_alert_rules.py) runs promtool, from Debian's prometheus package.
prometheus:
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's prometheus (promtool) for the alert rules' test"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null; \
	  else \
	    echo "the alert rules' test needs promtool: sudo apt-get install -y prometheus"; exit 1; \
	  fi; }

# Format, lint and type check (settings in pyproject.toml); .ci/run runs it before the tests and fails on findings.
lint: dev
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The documentation (docs/, mkdocs.yml) built into site/ with MkDocs in strict mode: a broken link, a missing
# anchor or a page left out of the navigation fails the build. Its tools come from a hashed lock of their own.
$(VENV)/.docs-installed: requirements-docs.txt $(VENV)/.dev-installed
	$(PIP) install -q --require-hashes -r requirements-docs.txt
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# Real MCP servers from PyPI (mcp-server-time, mcp-server-git) for the MCP tests, in a venv of their own
# (var/mcp-servers), installed from a hashed lock once: tests/mcptools/servers.py.
mcp-servers: dev
	$(PY) -m tests.mcptools.servers

test: dev browser nginx prometheus mcp-servers
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# Curated mutants (tests/mutants/*.toml), each applied to a scratch copy and
# run against the tests that guard it; fails unless every one is killed.
mutants: dev
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m tests.mutants.run $(MUTANTS_ARGS)

smoke: dev
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m pytest tests/smoke -p no:cacheprovider

bench: venv
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) bench/steps.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) db.sqlite3* var site
