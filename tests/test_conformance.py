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

#: The batched checks (mixed precision, XLA, the fresh-process round trip, the three exports) build one model of
#: every case and cost more than ten minutes of CPU on 2 cores: over the suite's 15-minute budget. They run with
#: TFBNN_CONFORMANCE=full (python -m pytest tests/test_conformance.py with it set); the default run checks the
#: Keras contract, moments, declared refusals, coverage, the support matrix and every registered method.
FULL = os.environ.get("TFBNN_CONFORMANCE") == "full"
BATCHED = ("mixed_precision", "xla", "keras_roundtrip", "export_savedmodel", "export_tflite", "export_onnx")

CASES = testing.cases()
CELLS = [(name, capability) for name in testing.public_classes() for capability in testing.CAPABILITIES]


def _pending(capability):
    """The cases checked in one batch for ``capability``: those not declared for it."""
    return [case for name, case in CASES.items() if testing.declared(name, capability) is None]


@pytest.fixture(scope="module")
def batched(tmp_path_factory):
    """``{capability: {case name: error or None}}``, computed on first use per capability."""
    results = {}

    def get(capability):
        if capability not in results:
            selected = _pending(capability)
            folder = str(tmp_path_factory.mktemp(capability))
            if capability == "mixed_precision":
                results[capability] = testing._per_case(testing._check_mixed_precision_batch, selected)
            elif capability == "xla":
                results[capability] = testing._per_case(testing._check_xla_batch, selected)
            elif capability == "keras_roundtrip":
                results[capability] = testing.roundtrip(selected, folder)
            else:
                results[capability] = testing._per_case(
                    lambda cases: testing.export_and_serve(cases, capability, folder), selected)
        return results[capability]

    return get


def _check_one(case, capability, tmp_path):
    """The capability's check on one case alone (raises on failure)."""
    if capability == "keras_contract":
        testing.check_keras_contract(case)
    elif capability == "moments":
        testing.check_moments(case)
    elif capability == "mixed_precision":
        testing._check_mixed_precision_batch([case])
    elif capability == "xla":
        testing._check_xla_batch([case])
    elif capability == "keras_roundtrip":
        error = testing.roundtrip([case], str(tmp_path))[case.name]
        if error:
            raise AssertionError(error)
    else:
        testing.export_and_serve([case], capability, str(tmp_path))


@pytest.mark.heavy
@pytest.mark.parametrize("name, capability", [pytest.param(*cell, id=f"{cell[0]}-{cell[1]}") for cell in CELLS])
def test_conformance(name, capability, batched, tmp_path):
    reason = testing.declared(name, capability)
    if reason is not None and not reason.startswith(("known defect", "refused")):
        pytest.skip(reason)  # abstract bases, parts tested through their owners, checks that do not apply
    if capability in BATCHED and not FULL and (reason is None or reason.startswith("known defect")):
        pytest.skip("a batched check: runs with TFBNN_CONFORMANCE=full (over the default suite's time budget)")
    case = CASES[name]
    if reason is None:
        if capability in ("keras_contract", "moments"):
            _check_one(case, capability, tmp_path)
        else:
            error = batched(capability)[name]
            assert error is None, f"{name} fails {capability}: {error}"
    elif reason.startswith("refused") and capability == "moments":
        testing.check_moments_refused(case)
    elif reason.startswith("refused"):
        testing.check_export_refused(case, capability, str(tmp_path))
    else:  # a known defect: it must still fail, or the row is stale
        try:
            _check_one(case, capability, tmp_path)
        except Exception:  # noqa: BLE001 - any failure keeps the declared row true
            return
        pytest.fail(f"{name} now passes {capability}: delete its row ({reason!r}) from tfbnn.testing.DECLARED")


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
