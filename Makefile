# The two set-up commands from the README. Each creates .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip

.PHONY: demo test test-slow lint docs docs-serve quality bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first and pinned: the CPU wheel; an unpinned torch pulls gigabytes of CUDA packages.
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[serve,export,test,docs]'
	touch $@

demo: $(VENV)/.installed
	bash scripts/demo.sh

# Two pytest workers (pytest-xdist; each takes whole test files) of one thread each: much of
# the suite waits on processes it starts (the CLI, servers, DDP ranks, tutorials), and two
# workers overlap those waits on 2 cores. Two threads each would oversubscribe the cores.
# Left out, and run by `make test-slow` (CI runs both): the tests marked `slow`, each a whole
# run of half a minute or more (a tutorial or the README as written, a real checkpoint, a
# benchmark's race, ranks killed and restarted), most of whose parts faster tests check.
test: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) -m pytest -q --durations=15 -n 2 --dist loadfile -m "not probe and not slow"

# The slow tests, each on whichever worker is free: they are few and long, so balance wins over
# keeping a file's tests together (a module fixture two of them share is built where needed).
test-slow: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) -m pytest -q --durations=15 -n 2 --dist load -m slow

# Long runs, not part of `make test`: the three real-data presets (about 1.5 hours on
# 2 CPU cores) and the speed benchmarks.
quality: $(VENV)/.installed
	$(PY) scripts/quality.py

# Every benchmark in benchmarks/ (hours; what this machine lacks is skipped, with its reason).
# BENCH_ARGS=--quick: each in a shorter form; BENCH_ARGS="--only llm memory": some of them.
bench: $(VENV)/.installed
	$(PY) -m benchmarks $(BENCH_ARGS)

# The documentation site (mkdocs.yml, docs/): built into site/, broken links are errors.
# One build at a time: two at once remove each other's files (flock waits its turn).
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 flock .docs.lock $(VENV)/bin/mkdocs build --strict --site-dir site

docs-serve: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests examples benchmarks experiments scripts docs/tools
	$(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf $(VENV) build site src/*.egg-info .pytest_cache
