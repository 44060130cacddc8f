"""Test configuration: offline, deterministic, few threads (CI has 2 cores). ``make test`` runs the suite in
pytest-xdist workers, one per core, each with one torch thread; ``DIFFATTN_TEST_THREADS=N`` gives every worker (or
the one process without xdist) N torch threads instead, to check that no test depends on the thread count:

    DIFFATTN_TEST_THREADS=2 make test
"""

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

_threads = os.environ.get("DIFFATTN_TEST_THREADS", "").strip()
if _threads:
    if not _threads.isdigit() or int(_threads) < 1:
        raise pytest.UsageError(f"DIFFATTN_TEST_THREADS must be an integer >= 1 (torch threads per test process), "
                                f"got {_threads!r}")
    torch.set_num_threads(int(_threads))
elif os.environ.get("PYTEST_XDIST_WORKER"):  # one process per core already: a second torch thread only competes
    torch.set_num_threads(1)


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


#: the fuzz outcome counts of the pytest-xdist workers, summed in the controlling process
_WORKER_OUTCOMES: dict[str, int] = {}


def _fuzz_outcomes() -> dict[str, int]:
    import sys

    mod = sys.modules.get("tests.test_fuzz") or sys.modules.get("test_fuzz")
    return dict(mod.OUTCOMES) if mod is not None else {}


def pytest_sessionfinish(session):
    """In a pytest-xdist worker: hand its fuzz outcome counts to the controlling process."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["fuzz_outcomes"] = _fuzz_outcomes()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """In the controlling process: add a finished worker's fuzz outcome counts."""
    for k, v in getattr(node, "workeroutput", {}).get("fuzz_outcomes", {}).items():
        _WORKER_OUTCOMES[k] = _WORKER_OUTCOMES.get(k, 0) + v


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print the fuzz outcome counts (clean / clear error / crash / NaN / silent wrong) when fuzz tests ran, in
    this process or in pytest-xdist workers."""
    counts = _fuzz_outcomes()
    for k, v in _WORKER_OUTCOMES.items():
        counts[k] = counts.get(k, 0) + v
    if not counts:
        return
    total = sum(counts.values())
    parts = ", ".join(f"{k} {counts.get(k, 0)}" for k in ("clean", "clear error", "crash", "nan", "wrong"))
    terminalreporter.write_line(f"fuzz outcomes: {total} calls: {parts}")
