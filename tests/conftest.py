"""Shared test setup: the repository root on sys.path, one harness build cache for the session,
and `gpu` tests skipped without CUDA."""
import os
import shutil
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Set before any test module imports kernel_eval (EvalConfig reads it at import): every harness
# build of the session goes to one fresh cache unless the caller names one, so tests never write
# to the user's ~/.cache and CI starts cold. Tests that submit the same source share its build
# (eval.py's and the rollout's oracle tests do).
SESSION_CACHE = None
if "KERNEL_EVAL_CACHE" not in os.environ:
    SESSION_CACHE = tempfile.mkdtemp(prefix="kernel_eval_test_cache_")
    os.environ["KERNEL_EVAL_CACHE"] = SESSION_CACHE


def pytest_sessionfinish(session, exitstatus):
    if SESSION_CACHE is not None:
        shutil.rmtree(SESSION_CACHE, ignore_errors=True)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
