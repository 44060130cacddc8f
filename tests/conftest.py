"""Test configuration: offline, deterministic, few threads (CI has 2 cores)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

# Without a GPU the Triton kernels run in Triton's interpreter. Triton reads this when a kernel is defined, so it
# is set here, before any test module (or a library it imports) can import Triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def one_thread():
    """Restore torch's thread count after a test whose training run sets its own (``run.threads``)."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# Hypothesis profiles for tests/test_fuzz.py: "ci" (default, bounded so the fuzz tests take well under a minute on
# 2 cores) and "long" (by hand: pytest -m fuzz --hypothesis-profile=long tests/test_fuzz.py).
try:
    from hypothesis import HealthCheck, settings

    _quiet = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True, suppress_health_check=_quiet,
                              print_blob=True)
    settings.register_profile("long", max_examples=3000, deadline=None, suppress_health_check=_quiet,
                              print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print the fuzz outcome counts (clean / clear error / crash / NaN / silent wrong) when fuzz tests ran."""
    import sys

    mod = sys.modules.get("tests.test_fuzz")
    if mod is None or not mod.OUTCOMES:
        return
    counts = mod.OUTCOMES
    total = sum(counts.values())
    parts = ", ".join(f"{k} {counts.get(k, 0)}" for k in ("clean", "clear error", "crash", "nan", "wrong"))
    terminalreporter.write_line(f"fuzz outcomes: {total} calls: {parts}")
