# Two commands for a fresh machine (see README):
#   make demo   installs traceread and reports on a sample run
#   make test   installs traceread with its test tools and runs the whole suite, in random order
#               (the seed is the summary's last lines: --randomly-seed=N repeats an order)
# and for contributors:
#   make lint   ruff (lint + import order) and mypy, configured in pyproject.toml
#   make reports  regenerates the report gallery in reports/
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check
DEMO   ?= sample_traces/ddp_straggler_h100

.PHONY: demo test lint bench reports clean

$(VENV)/.core: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) -e .
	touch $@

# torch is pinned to the CPU wheel first so the [collect] range never pulls CUDA packages; it is named
# again beside the extras so the framework pins of [test] (deepspeed, accelerate...) cannot move it.
# ray and remote are installed too, so CI runs the Ray and s3:// (local moto server) tests.
$(VENV)/.dev: $(VENV)/.core
	$(PIP) torch==2.13.0
	$(PIP) -e '.[collect,test,ray,remote]' torch==2.13.0
	touch $@

demo: $(VENV)/.core
	$(VENV)/bin/traceread report $(DEMO) -o demo-report.html

test: $(VENV)/.dev
	bash scripts/ensure-chromium.sh
	$(PY) -m pytest -n 2 -q -p randomly

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check traceread tests bench scripts collectors
	$(VENV)/bin/mypy

# the report gallery in reports/ (JSON + page screenshots; tests/test_reports_gallery.py checks it is current)
reports: $(VENV)/.dev
	bash scripts/ensure-chromium.sh
	$(PY) scripts/make_reports.py

bench: $(VENV)/.dev
	PYTHON=$(PY) bash bench/run_all.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache demo-report.html
