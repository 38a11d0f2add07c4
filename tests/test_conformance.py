"""The conformance harness (``tfbnn.testing``): every public layer and model class, every capability.

Each public class has a construction case (``tfbnn.testing.CASES``) or a declared row
(``tfbnn.testing.DECLARED``); each (class, capability) either passes its check or is declared,
and a declared row is checked to fail as documented (a refusal naming the layer; a known
defect still failing), so a row that starts passing fails here and is removed. The checks
that cost a compile, a process or a conversion run once over all cases together (one
model holding every case side by side) and are reported per class.
"""

import os

import pytest

from tfbnn import testing

#: The checks that cost a compile, a process or a conversion: one model of every case side by side, checked
#: once per capability (test_batched_capability), failures attributed to the failing cases by halving.
BATCHED = tuple(testing.FULL_RUN_ONLY)  # the columns checked only with TFBNN_CONFORMANCE=full, with its reason
#: All six pass over every case (2026-11-29, one core each, AMD EPYC, 2 cores): mixed precision 314 s, XLA 167 s,
#: the fresh-process round trip 26 s, SavedModel 304 s, TFLite 116 s, ONNX 143 s
#: (`TFBNN_CONFORMANCE=full python -m pytest tests/test_conformance.py -k batched --durations=10`).
FULL = os.environ.get("TFBNN_CONFORMANCE") == "full"

CASES = testing.cases()


def _batched_rows(capability):
    """The cases a batched check runs: undeclared ones (must pass) and known defects (must still fail)."""
    rows = []
    for name, case in CASES.items():
        reason = testing.declared(name, capability)
        if reason is None or reason.startswith("known defect"):
            rows.append(case)
    return rows


#: One test per (class, capability), except the batched checks of the classes that run them (undeclared or a
#: known defect): those are one test per capability (test_batched_capability), which names every failing class.
CELLS = [(name, capability) for name in testing.public_classes() for capability in testing.CAPABILITIES
         if capability not in BATCHED or name not in {case.name for case in _batched_rows(capability)}]


def _check_one(case, capability):
    """The capability's check on one case alone (raises on failure)."""
    if capability == "keras_contract":
        testing.check_keras_contract(case)
    elif capability == "moments":
        testing.check_moments(case)
    else:
        raise AssertionError(f"{capability} is a batched check")


@pytest.mark.heavy
@pytest.mark.parametrize("name, capability", [pytest.param(*cell, id=f"{cell[0]}-{cell[1]}") for cell in CELLS])
def test_conformance(name, capability, tmp_path):
    reason = testing.declared(name, capability)
    if reason is not None and not reason.startswith(("known defect", "refused")):
        pytest.skip(reason)  # abstract bases, parts tested through their owners, checks that do not apply
    case = CASES[name]
    if reason is None:
        _check_one(case, capability)
    elif reason.startswith("refused") and capability == "moments":
        testing.check_moments_refused(case)
    elif reason.startswith("refused"):
        testing.check_export_refused(case, capability, str(tmp_path))
    else:  # a known defect: it must still fail, or the row is stale
        try:
            _check_one(case, capability)
        except Exception:  # noqa: BLE001 - any failure keeps the declared row true
            return
        pytest.fail(f"{name} now passes {capability}: delete its row ({reason!r}) from tfbnn.testing.DECLARED")


@pytest.mark.heavy
@pytest.mark.parametrize("capability", BATCHED)
def test_batched_capability(capability, tmp_path):
    """Every class that runs the check passes it, and every known defect still fails (else its row is stale)."""
    if not FULL:
        pytest.skip(testing.FULL_RUN_ONLY[capability])
    rows = _batched_rows(capability)
    results = testing.check_batch(capability, rows, str(tmp_path))
    failing = {name: error for name, error in results.items()
               if error and testing.declared(name, capability) is None}
    stale = [name for name, error in results.items() if not error and testing.declared(name, capability)]
    assert not failing, f"{capability} fails for {len(failing)} classes:\n" + "\n".join(
        f"  {name}: {error}" for name, error in failing.items())
    assert not stale, f"{stale} now pass {capability}: delete their known-defect rows from tfbnn.testing.DECLARED"


def test_every_public_class_has_a_case_or_a_declared_row():
    missing = testing.uncovered()
    assert not missing, (f"Public classes with neither a construction case nor a declared row: {missing}. "
                         "Add a Case to tfbnn/testing.py's _cases() (or a (name, '*') row with its reason to "
                         "tfbnn.testing.DECLARED).")


def test_every_declared_row_names_a_public_class_and_a_capability():
    public = testing.public_classes()
    for (name, capability), reason in testing.DECLARED.items():
        assert name in public, f"DECLARED row for {name!r}, which is not a public class: remove it"
        assert capability == "*" or capability in testing.CAPABILITIES, (name, capability)
        assert reason, (name, capability)
    assert set(CASES) <= set(public), set(CASES) - set(public)


def test_the_deployment_guide_holds_the_generated_support_matrix():
    assert testing.guide_support_matrix() == testing.support_matrix_markdown(), (
        "docs/guides/deployment.md's support matrix is out of date: run "
        "`python -m tfbnn.testing --write-support-matrix`")


def _methods():
    from tfbnn import methods

    return methods.names()


@pytest.mark.heavy
@pytest.mark.parametrize("name", _methods())
def test_every_registered_method_trains_under_mixed_precision_and_xla_and_predicts(name):
    testing.check_method(name)
