# adaptune: every command a user needs. The venv is created on first use (and refreshed when the
# lock or pyproject changes), so `make demo` and `make test` work on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIPELINE ?= smoke
OUT ?= outputs
export PYTHONHASHSEED := 0

.PHONY: venv venv-xla test test-xla test-adapterhub test-heavy demo run plan status tensorboard notebooks report compile submit stage-models stage-data bench bench-fused bench-bf16 bench-data bench-shard-data bench-xla bench-attention bench-states bench-lengths bench-gpu gpu-carry bench-status bench-tensorboard bench-soak bench-peer images lint lock clean

$(VENV)/.installed: pyproject.toml requirements.lock requirements-kernel-tests.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -r requirements-kernel-tests.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

venv: $(VENV)/.installed

# The TPU image's environment on this machine, for running the project on XLA's CPU device (PJRT_DEVICE=CPU:
# the TPU's lazy tensors, tracing, compilation and mark_step, with the CPU as the device). Its pins are the TPU
# image's own: torch at containers/tpu/Dockerfile's TORCH_VERSION (PyPI's build: it carries CUDA libraries, several
# GB, and runs on a CPU), containers/tpu/requirements-tpu.txt, and every other line of requirements.lock.
VENV_XLA := .venv-xla
PY_XLA := $(VENV_XLA)/bin/python
XLA_TORCH_VERSION := $(shell sed -n 's/^ARG TORCH_VERSION=//p' containers/tpu/Dockerfile)

$(VENV_XLA)/.installed: requirements.lock containers/tpu/requirements-tpu.txt containers/tpu/Dockerfile pyproject.toml
	test -x $(PY_XLA) || $(PYTHON) -m venv $(VENV_XLA)
	$(PY_XLA) -m pip install --quiet --upgrade pip
	$(PY_XLA) -m pip install --quiet "torch==$(XLA_TORCH_VERSION)"
	grep -v '^torch==' requirements.lock > $(VENV_XLA)/requirements-without-torch.txt
	$(PY_XLA) -m pip install --quiet -r $(VENV_XLA)/requirements-without-torch.txt -r containers/tpu/requirements-tpu.txt
	@# pip check reads the dependencies alone, as the TPU image checks them, before the project (whose metadata pins
	@# the torch of the lock); on a re-run the project is installed already, so it leaves first.
	$(PY_XLA) -m pip uninstall --quiet --yes adaptune 2>/dev/null
	$(PY_XLA) -m pip check
	$(PY_XLA) -m pip install --quiet --no-deps -e .
	touch $@

venv-xla: venv $(VENV_XLA)/.installed

# AdapterHub's own adapters 1.3 loads the AdapterHub export folders and must give adaptune's logits (tests/adapterhub).
# It needs transformers 4.57, so it runs in its own environment, .venv-adapters, made on first use (tests/adapterhub/make_env.sh).
test-adapterhub: venv
	$(PY) -m pytest -n 0 -q -m adapterhub tests/adapterhub

# The project on XLA's CPU device (tests marked xla), in the TPU image's environment; make test leaves them out.
test-xla: venv-xla
	PJRT_DEVICE=CPU $(PY_XLA) -m pytest -q -p no:cacheprovider -m xla tests/xla

test: venv
	$(PY) -m pytest -n 2 --dist loadgroup -q --durations=30 -m "not heavy and not xla and not adapterhub"

# The heavy rehearsals make test leaves out (minutes each): the CPU image built and run in a container
# engine, the paper_full-shaped DAG. Run them before changing what they cover.
test-heavy: venv
	$(PY) -m pytest -n 2 --dist loadgroup -q --durations=30 -m heavy

demo: venv
	$(PY) -m pipelines run smoke --out $(OUT)/smoke

# RUNNER=docker: the components run in the project's images (kfp.local's DockerRunner); the CPU image
# is built first (Docker's layer cache: seconds when its inputs are unchanged). See containers/README.md.
run: venv
	$(if $(filter docker,$(RUNNER)),$(MAKE) -C containers build-cpu)
	$(PY) -m pipelines run $(PIPELINE) --out $(OUT)/$(basename $(notdir $(PIPELINE))) \
		$(if $(RUNS_ROOT),--runs-root $(RUNS_ROOT)) $(if $(RETRY_FAILED),--retry-failed) $(if $(RETRAIN_STALE),--retrain-stale) $(if $(RETRY_UNREADABLE),--retry-unreadable) \
		$(if $(RUNNER),--runner $(RUNNER))

plan: venv
	$(PY) -m pipelines plan $(PIPELINE) $(if $(RUNS_ROOT),--runs-root $(RUNS_ROOT))

# One sweep in TensorBoard: each run's curves, the whole grid in the HParams dashboard (only this sweep's runs).
# Served to this machine only; BIND_ALL=1 serves it on every network interface.
tensorboard: venv
	$(PY) -m pipelines tensorboard $(PIPELINE) $(if $(RUNS_ROOT),--runs-root $(RUNS_ROOT)) $(if $(PORT),--port $(PORT)) \
		$(if $(BIND_ALL),--bind-all)

# Where a sweep stands (finished, failed, in progress, cost, ETA), read from its run store; runs nothing.
status: venv
	$(PY) -m pipelines status $(PIPELINE) $(if $(RUNS_ROOT),--runs-root $(RUNS_ROOT))

# The report of whatever the run store holds now (partial while the sweep runs) into $(OUT)/<name>/.
report: venv
	$(PY) -m pipelines report $(PIPELINE) --out $(OUT)/$(basename $(notdir $(PIPELINE))) $(if $(RUNS_ROOT),--runs-root $(RUNS_ROOT))

compile: venv
	$(PY) -m pipelines compile

submit: venv
	$(PY) -m pipelines submit $(PIPELINE) $(if $(RETRY_FAILED),--retry-failed) $(if $(RETRAIN_STALE),--retrain-stale)

# Copy the experiment's hub backbones into the run store once (FROM="bert-large-uncased=DIR ..." stages local copies).
stage-models: venv
	$(PY) -m pipelines stage-models $(PIPELINE) $(if $(RUNS_ROOT),--runs-root $(RUNS_ROOT)) $(foreach f,$(FROM),--from $(f))

# Copy the data files the experiment's tasks read into the run store's data/ mirror, each checked (md5, read as its
# task reads it), from FROM=DIR (the publishers' files in the mirror's layout). FORCE=1 copies again what is staged.
stage-data: venv
	$(PY) -m pipelines stage-data $(PIPELINE) $(if $(RUNS_ROOT),--runs-root $(RUNS_ROOT)) $(if $(FROM),--from $(FROM)) $(if $(FORCE),--force)

# The analysis notebooks in JupyterLab with the project's kernel (this venv's Python). JupyterLab is installed into
# the venv on first use, outside requirements.lock (the images and the tests do not need it); the packages it brought
# are listed in $(NOTEBOOK_PACKAGES), which `make lock` leaves out.
JUPYTERLAB := jupyterlab==4.6.6
NOTEBOOK_PACKAGES := $(VENV)/.notebook-packages
notebooks: venv
	test -f $(NOTEBOOK_PACKAGES) || { $(PY) -m pip freeze --exclude-editable | sort > $(VENV)/.freeze-before \
	  && $(PY) -m pip install --quiet $(JUPYTERLAB) \
	  && $(PY) -m pip freeze --exclude-editable | sort | comm -13 $(VENV)/.freeze-before - | cut -d= -f1 > $(NOTEBOOK_PACKAGES); }
	cd analysis && ../$(PY) -m jupyter lab --ServerApp.ip=localhost $(if $(PORT),--ServerApp.port=$(PORT)) \
	  $(if $(filter 0,$(shell id -u)),--allow-root)

bench: venv
	$(PY) -m bench.cpu --out bench/results.json

# Fused run groups only: operators per example and examples/s at k = 1, 4, 16, the group's optimizer step
# together against one run after another (bench/fused_groups.json).
bench-fused: venv
	$(PY) -m bench.cpu --only-fused --out bench/fused_groups.json

# The frozen backbone in bf16 against float32 on this CPU (native bf16 or emulated: the entry says which).
bench-bf16: venv
	$(PY) -m bench.cpu --only-bf16 --out bench/cpu_bf16.json

# The host time a run spends preparing its data (rows from the tokenized cache), per task (bench/data_prep.json).
bench-data: venv
	$(PY) -m bench.cpu --only-data --out bench/data_prep.json

# The data work of an accelerator task per shard, from the publishers' files against the prepared data (local and on
# a GCS emulator), and the preparation step's seconds per task (bench/shard_data.json).
bench-shard-data: venv
	$(PY) -m bench.shard_data --out bench/shard_data.json

# The project on XLA's CPU device, in the TPU image's environment: graphs compiled per run, epoch and phase, scores beside
# the CPU's, a fused group against its runs alone, a step's time (bench/xla.json).
bench-xla: venv-xla
	PJRT_DEVICE=CPU $(PY_XLA) -m bench.xla --out bench/xla.json

# What the attention kernel takes off a fused step's memory traffic, counted on this CPU (operators and bytes
# written per layer, eager attention against the kernel under Triton's interpreter; bench/attention_kernel.json).
bench-attention: venv
	$(PY) -m bench.attention --out bench/attention_kernel.json

# What saving a run's resume state costs (BERT-base and -large shapes, on this disk), and the states and hours
# paper_full's runs save at every epoch's end against adaptune.train.state_saves' rule (bench/state_saves.json).
bench-states: venv
	$(PY) -m bench.state_saves --out bench/state_saves.json

# The tokens a training row of each task is padded to, as a run batches it (bench/task_lengths.json): how far each task's
# steps are from the mix bench-gpu's fused figures were measured on.
bench-lengths: venv
	$(PY) -m bench.task_lengths --out bench/task_lengths.json

# On a CUDA machine: BERT-base/-large training speed and MFU, and runs side by side on one GPU (bench/gpu.json).
bench-gpu: venv
	$(PY) -m bench.gpu --out bench/gpu.json

# What a GPU machine without network lacks, for bench/gpu_session.sh (git-ignored; copy them beside its checkout):
# the four GLUE tasks' files, the embedded tokenizer, SQuAD's padded batch lengths (bench/squad_lengths.py), and wheels of datasets and this lock's transformers for
# the image's Python 3.12 (it has torch and most of the rest).
GPU_WHEELS := datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0 transformers==5.23.0
gpu-carry: venv
	rm -rf .devcarry .whl && mkdir -p .devcarry/data/glue .devcarry/tokenizer .whl
	grep -qxF /.devcarry/ .git/info/exclude 2>/dev/null || printf '/.devcarry/\n/.whl/\n' >> .git/info/exclude
	data=$$($(PY) -c 'from adaptune.data.sources import resolve_data_dir; print(resolve_data_dir() or "")'); \
	  test -n "$$data" || { echo "gpu-carry: no local data mirror (set ADAPTUNE_DATA_DIR)"; exit 2; }; \
	  for task in CoLA SST-2 MRPC RTE; do cp -r "$$data/glue/$$task" .devcarry/data/glue/; done
	tokenizer=$$($(PY) -c 'from bench.gpu_shard import embedded_tokenizer_dir; print(embedded_tokenizer_dir())'); \
	  cp "$$tokenizer"/{vocab.txt,tokenizer.json,tokenizer_config.json,special_tokens_map.json} .devcarry/tokenizer/
	rm -f .devcarry/batches.pt && $(PY) -m bench.gpu --write-batches .devcarry/batches.pt --data-dir .devcarry/data --tokenizer .devcarry/tokenizer
	$(PY) -m bench.gpu --write-squad-lengths .devcarry/squad_lengths.json --tokenizer .devcarry/tokenizer
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl $(GPU_WHEELS)
	du -sh .devcarry .whl

# `make status` against paper_full's 8,556 stub records in the emulated GCS bucket (JSON out; a few minutes).
bench-status: venv
	$(PY) -m bench.status_timing --out bench/status.json

# A 4-run SST-2 sweep through `pipelines run` against AdapterHub + Trainer and peft + Trainer (each at its defaults and
# with group_by_length), alternating, on the same rows; wall, training, evaluation and fixed seconds, peak RSS, scores,
# the steps' share of a bf16 matmul (bench/peer.json; about half an hour here). AdapterHub runs in .venv-adapters.
bench-peer: venv
	$(PY) -m bench.peer --out bench/peer.json $(if $(BASELINE_ROOT),--baseline-root $(BASELINE_ROOT))

# The run store's soak at 10,000 stub runs in the emulated GCS bucket behind a flaky proxy (5% of requests 503/429,
# half after the write): overlapping submissions, SIGKILLed workers, transient and diverging runs (JSON out: runs,
# kills, calls per run, lost, hung, trained twice, waited on self, reported reused, wall).
bench-soak: venv
	$(PY) -m bench.soak --runs 10000 --out bench/soak.json

# TensorBoard's HParams view of paper_full's 8,800 stub runs: seconds until every session is listed (JSON out).
bench-tensorboard: venv
	$(PY) -m bench.tensorboard_timing --out bench/tensorboard.json

images:
	$(MAKE) -C containers images

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(MAKE) -C containers lint HADOLINT=$(CURDIR)/$(VENV)/bin/hadolint

lock: venv
	{ grep '^#' requirements.lock; $(PY) -m pip freeze --exclude-editable --exclude triton \
	  $(foreach package,$(shell cat $(NOTEBOOK_PACKAGES) 2>/dev/null),--exclude $(package)) | sed 's/+cpu//'; } > requirements.lock.new
	mv requirements.lock.new requirements.lock

clean:
	rm -rf $(OUT) .pytest_cache
