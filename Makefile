# Quick start (as root): sudo make demo | sudo make test | sudo make bench
# Every target installs what is missing first (scripts/setup.sh, idempotent).
PY := .venv/bin/python
TB := $(PY) -m testbed

.PHONY: setup demo test bench lint clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(TB) deploy rail_optimized --check; status=$$?; $(TB) destroy; exit $$status
	@echo "== elephant flows, static ECMP with RoCE go-back-N =="
	@$(TB) run experiments/elephants_spray.toml --name demo_ecmp --entropy ecmp --transport roce
	@echo "== the same flows, per-packet spraying with the UET-style transport =="
	@$(TB) run experiments/elephants_spray.toml --name demo_spray

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) scripts/bench_fabric.py
	$(PY) scripts/bench_sender.py
	$(PY) scripts/bench_allreduce.py
	$(PY) scripts/bench_pfc.py
	@echo "all benchmark figures: results/bench.json"

lint: setup
	$(PY) -m ruff check .

clean: setup
	$(TB) clean
