import gc
import os
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # Each xdist worker gets its share of the cores for TensorFlow's intra-op pool (one each for the
    # README's -n 2 on 2 cores): two pools of 2 threads on 2 cores spin against each other (the fast
    # lane: 2 min 0 s with TensorFlow's default, 1 min 42 s with this). Inter-op threads keep the
    # default (MirroredStrategy's replicas need concurrent ops). Thread counts do not change the
    # pinned numbers (tests/fixtures/pin_spread.py).
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(_share))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


#: The names of a test module's shared NumPy generator (``RNG = np.random.default_rng(0)``).
MODULE_RNG_NAMES = ("RNG", "_RNG")


@pytest.fixture(autouse=True)
def _seeded(request):
    keras.utils.set_random_seed(1234)
    # A module's shared generator restarts at every test: a test's data must not depend on
    # which tests of its module ran before it in its worker (xdist and -k change that order;
    # a float32 NLL checked at rtol 1e-5 failed on the data of one order only).
    for name in MODULE_RNG_NAMES:
        if isinstance(getattr(request.module, name, None), np.random.Generator):
            setattr(request.module, name, np.random.default_rng(0))
    start = _resident_bytes()
    yield
    # clear_session's full garbage collection costs 0.3-3 s as a worker's heap grows, more
    # than most tests take: half the suite's time when it ran after every test. It runs
    # after the heavy tests only, which hold the big models (their memory peaks 2 GB lower),
    # once the worker holds more than FREE_MEMORY_ABOVE, and only when the test itself grew the
    # worker by more than FREE_GROWTH_ABOVE (or the worker holds more than FREE_MEMORY_ALWAYS):
    # a notebook's kernel, a subprocess or a small model trained long leaves little to free, and
    # collecting after them was a tenth of the suite's time. (The tests heavy by measurement,
    # tests/heavy_tests.txt, are short enough to skip it.)
    #
    # What survives such a collection outlives the test (traced graphs held by caches, a module's
    # fixtures): about ten thousand objects per test, so unfrozen the worker's heap grew to millions of
    # objects and each later collection scanned them all again (0.7 s at one million; 284 s of the two
    # workers' CPU in the whole run, py-spy, 2026-12-03). Frozen with what collection left, each
    # collection scans only what the tests since have made.
    #
    # The heavy tests' memory rule alone left the heap unfrozen for hundreds of tests at a time (2 to 5
    # million objects), and every collection in between, Python's own, KerasTuner's before each trial and
    # the studies' clear_session, scanned all of it (158 s of the two workers' time, a gc callback timing
    # each, 2026-12-03). So every FREEZE_EVERY tests the teardown also collects and freezes: each
    # collection then scans at most the few hundred thousand objects the last tests made.
    heavy = request.node.get_closest_marker("heavy") is not None and request.node.nodeid not in _MEASURED
    free = heavy and _should_free(start, _resident_bytes())
    keras.backend.clear_session(free_memory=False)
    _TESTS_SINCE_FREEZE[0] += 1
    if free or _TESTS_SINCE_FREEZE[0] >= FREEZE_EVERY:
        _collect_and_freeze()


def _should_free(start, end):
    """Whether a heavy test that took the worker from ``start`` to ``end`` resident bytes should collect."""
    return end > FREE_MEMORY_ALWAYS or (end > FREE_MEMORY_ABOVE and end - start > FREE_GROWTH_ABOVE)


#: The resident memory of a worker above which a heavy test's teardown collects its garbage
#: (if the test grew the worker by FREE_GROWTH_ABOVE)...
FREE_MEMORY_ABOVE = 2 * 2**30
#: ... the growth during the test that makes it collect ...
FREE_GROWTH_ABOVE = 256 * 2**20
#: ... and the resident memory above which it collects whatever the test grew.
FREE_MEMORY_ALWAYS = 4 * 2**30
#: Whatever the tests, a teardown collects and freezes once this many tests have ended since the last freeze.
FREEZE_EVERY = 20
#: The tests ended since the last collect-and-freeze, in this worker (a list: the fixture updates it in place).
_TESTS_SINCE_FREEZE = [0]


def _resident_bytes():
    """This process's resident memory (Linux: /proc/self/statm); where it cannot be read, more
    than FREE_MEMORY_ABOVE, so that the garbage is collected as before."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return FREE_MEMORY_ABOVE + 1


@pytest.fixture
def eager():
    """Functions run eagerly while the test runs: a big model's few steps cost seconds instead of the
    minute that tracing its train, test and predict steps takes on 2 cores (the compiled path is
    the same code, traced in the tests of the smaller models)."""
    import tensorflow as tf

    tf.config.run_functions_eagerly(True)
    try:
        yield
    finally:
        tf.config.run_functions_eagerly(False)


@pytest.fixture
def train_step_traces():
    """The names of the models whose ``train_step`` was traced, one entry per trace
    (Python runs the step's body once per trace). The patch of ``keras.Model`` is a
    context manager, undone when the test ends whatever else its teardown does."""
    traces = []
    step = keras.Model.train_step

    def counting(self, data):
        traces.append(self.name)
        return step(self, data)

    with mock.patch.object(keras.Model, "train_step", counting):
        yield traces


#: The node ids conftest marked heavy by measurement (tests/heavy_tests.txt), as collected.
_MEASURED = set()


def measured_heavy_tests():
    """The test functions listed in ``tests/heavy_tests.txt`` (``path::name``), measured at 1.5 s or more."""
    with open(os.path.join(os.path.dirname(__file__), "heavy_tests.txt"), encoding="utf-8") as f:
        return {line.strip() for line in f if line.strip() and not line.startswith("#")}


def pytest_collection_finish(session):
    """Everything alive once the tests are collected (TensorFlow, Keras, the test modules: about
    half a million objects) lives as long as the worker: frozen out of the collector's reach, so
    each full collection (a heavy test's teardown, a study's ``clear_session``, the automatic
    ones) scans only what the tests made since."""
    _collect_and_freeze()


def _collect_and_freeze():
    """A full collection, then what survived it frozen out of the collector's later scans."""
    gc.collect()
    gc.freeze()
    _TESTS_SINCE_FREEZE[0] = 0


def pytest_collection_modifyitems(config, items):
    """Marks the tests listed in ``tests/heavy_tests.txt`` ``heavy``: the fast lane
    (``-m "not heavy"``) leaves them out with the end-to-end tests marked ``heavy`` in code."""
    listed = measured_heavy_tests()
    for item in items:
        if item.nodeid.split("[", 1)[0] in listed:
            item.add_marker(pytest.mark.heavy)
            _MEASURED.add(item.nodeid)
