# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv.
VENV ?= .venv
PY := $(VENV)/bin/python
# The torch build to install; here the CPU wheel on disk. Elsewhere: your own build,
# e.g. `make test TORCH_SPEC='torch==2.13.0 --index-url …'`.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?= -m 'not slow'

.PHONY: demo test venv clean bench

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q $(TORCH_SPEC)
	$(VENV)/bin/pip install -q -e '.[dev]'
	$(VENV)/bin/pip install -q -e '.[chaos]' || echo "make: the chaos extra (NetfilterQueue, mfusepy) did not install: needs Debian libnetfilter-queue-dev and fuse3; their tests will skip"
	touch $@

demo: venv
	$(VENV)/bin/titan drill

test: venv
	$(PY) -m pytest --durations=25 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
