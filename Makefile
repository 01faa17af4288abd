# Quick start (as root): sudo make demo | sudo make test | sudo make bench
# Every target installs what is missing first (scripts/setup.sh, idempotent).
PY := .venv/bin/python
TB := $(PY) -m testbed

.PHONY: setup demo test bench lint clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(TB) deploy rail_optimized --check; status=$$?; $(TB) destroy; exit $$status

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) scripts/bench_fabric.py
	$(PY) scripts/bench_sender.py
	@echo "all benchmark figures: results/bench.json"

lint: setup
	$(PY) -m ruff check .

clean: setup
	$(TB) clean
