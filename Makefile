# Everything a fresh machine needs: `make demo` runs the main job on the embedded MNIST-5k data,
# `make test` runs the whole test suite. Both create the virtual environment when it is missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# `make EXTRAS=gpu,dev test` on a CUDA node (faiss-gpu instead of faiss-cpu).
EXTRAS ?= cpu,dev

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) jobs/upgrade.py

test: $(STAMP)
	$(PY) -m pytest --durations=15

lint: $(STAMP)
	$(VENV)/bin/ruff check raycompat jobs tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/simplex_head.py
	$(PY) benchmarks/search_bench.py

clean:
	rm -rf $(VENV) outputs .pytest_cache
