# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv.
VENV ?= .venv
PY := $(VENV)/bin/python
# The torch build to install; here the CPU wheel on disk. Elsewhere: your own build,
# e.g. `make test TORCH_SPEC='torch==2.13.0 --index-url …'`.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?= -m 'not slow'

.PHONY: demo test test-slow venv clean bench chaos-extra peers-venvs frameworks

venv: $(VENV)/.installed

# Install output goes to $(VENV)/install-*.log: nothing is printed when a step works; a
# required step that fails prints its log's tail; the optional chaos extra (NetfilterQueue
# builds a C extension against Debian's libnetfilter-queue-dev; mfusepy needs fuse3) prints
# one line with the reason and its tests skip.
QUIET := sh scripts/quiet_install.sh
$(VENV)/.installed: pyproject.toml
	@echo "make: creating $(VENV) (torch, titan and its dev extra; log in $(VENV)/install-*.log)"
	@python3 -m venv $(VENV)
	@$(QUIET) $(VENV)/install-torch.log required "$(TORCH_SPEC)" -- $(VENV)/bin/pip install -q $(TORCH_SPEC)
	@$(QUIET) $(VENV)/install-dev.log required "titan-resilience[dev]" -- $(VENV)/bin/pip install -q -e '.[dev]'
	@# this checkout installed under its old distribution name `titan`: remove that copy
	@$(VENV)/bin/pip show titan 2>/dev/null | grep -qx "Editable project location: $(CURDIR)" \
		&& $(VENV)/bin/pip uninstall -q -y titan >/dev/null 2>&1 || true
	@rm -rf src/titan.egg-info
	@$(MAKE) -s --no-print-directory chaos-extra VENV=$(VENV)
	@$(MAKE) -s --no-print-directory frameworks VENV=$(VENV)
	@touch $@

# The optional native extra alone; run it again after `apt-get install libnetfilter-queue-dev fuse3`.
CHAOS_EXTRA ?= -e .[chaos]
chaos-extra:
	@$(QUIET) $(VENV)/install-chaos.log optional "the chaos extra (NetfilterQueue, mfusepy)" -- \
		$(VENV)/bin/pip install -q $(CHAOS_EXTRA)

# The peers of bench/peers (torchft, LM Resiliency, NVRx, ml-goodput-measurement), each in its
# own environment under .venv-peers/ with torch pinned to 2.13.0 (~8 min here). CI does not
# build them: only `make test-slow` and the benchmark use them.
peers-venvs: venv
	@$(PY) bench/peers/venvs.py --build

# The integrations' frameworks (transformers, lightning, accelerate) with torch held at 2.13 by
# the constraint file. Optional for a developer (their tests skip with the reason); CI sets
# FRAMEWORKS=required, and under CI=true a missing framework fails its tests instead.
FRAMEWORKS ?= optional
frameworks:
	@$(QUIET) $(VENV)/install-frameworks.log $(FRAMEWORKS) "the framework extras (transformers, lightning, accelerate)" -- \
		$(VENV)/bin/pip install -q -c scripts/frameworks-constraints.txt -e '.[transformers,lightning,accelerate]'

demo: venv
	$(VENV)/bin/titan drill

test: venv
	$(PY) -m pytest --durations=25 $(PYTEST_ARGS)

# Everything longer than CI's budget (docs/testing.md): the 20-minute soak and the planner
# check against it, ten random kills, three hangs, the 3-rank resume, ten restarts …
test-slow: venv
	$(PY) -m pytest --durations=25 -m slow

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
