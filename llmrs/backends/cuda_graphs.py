"""Transitional alias of llmrs.backends.cuda.graphs for the one caller not yet moved to the package path
(tests/test_async_scheduling.py); delete with that import."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("llmrs.backends.cuda.graphs")
