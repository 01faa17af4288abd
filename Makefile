# Quick start (as root): sudo make demo | sudo make test | sudo make bench
# Every target installs what is missing first (scripts/setup.sh, idempotent).
PY := .venv/bin/python
TB := $(PY) -m testbed

.PHONY: setup demo test bench lint clean fuzz vm-check

setup:
	@bash scripts/setup.sh

demo: setup
	@mkdir -p results && touch results/.demo-start
	@$(TB) deploy rail_optimized --check; status=$$?; $(TB) destroy; exit $$status
	@echo "== claim 1: static ECMP vs flowlets vs packet spraying (rate: auto) =="
	@$(PY) scripts/ecmp_vs_spray.py --server-count 2 --gpus 4 --iterations 1
	@echo "== claim 2: PFC prevents loss but blocks an unrelated flow =="
	@$(PY) scripts/pfc_hol.py
	@$(PY) scripts/demo_verdicts.py results/.demo-start
	@echo "demo done: the folders above (results/) hold summary.md, plots/ and each run"

test: setup
	$(PY) -m pytest -q

# the users' VM (Debian 12, its own kernel) booted under qemu, its VM-only checks run in it
vm-check:
	@bash scripts/setup.sh --vm
	$(PY) scripts/vm_check.py

bench: setup
	$(PY) scripts/bench_fabric.py
	$(PY) scripts/bench_sender.py
	$(PY) scripts/bench_engine.py
	$(PY) scripts/bench_allreduce.py
	$(PY) scripts/bench_moderation.py
	$(PY) scripts/bench_pfc.py
	$(PY) scripts/bench_voq.py
	$(PY) scripts/bench_scheduled.py
	$(PY) scripts/bench_lossless.py
	$(PY) scripts/bench_dcqcn.py
	$(PY) scripts/bench_permutation.py
	$(PY) scripts/bench_dlb.py
	$(PY) scripts/bench_scale.py
	$(PY) scripts/bench_floor.py
	$(PY) scripts/bench_rail128.py
	$(PY) scripts/bench_vxlan.py
	$(PY) scripts/bench_cluster.py
	$(PY) scripts/bench_train.py
	$(PY) scripts/bench_html.py
	$(PY) scripts/bench_flows.py
	$(PY) scripts/bench_mice.py
	$(PY) scripts/bench_report.py
	@echo "all benchmark figures: results/bench.json, tabled in docs/benchmarks.md"

# many more random inputs than the test suite's deterministic few hundred (no root)
fuzz: setup
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q tests/test_fuzz_inputs.py

lint: setup
	$(PY) -m ruff check .

clean: setup
	$(TB) clean
