"""Studies as data (issue 28, item 3): one registry, settings declared once, options generated, one set of checks."""

import importlib
import warnings

import pytest

from tfbnn import cli, experiments, training
from tfbnn.cli import run as run_command
from tfbnn.experiments import Setting, Study, _study


def _study_modules():
    return [(name, importlib.import_module(module)) for name, (module, _) in experiments.STUDIES.items()]


def _parser(study):
    from tfbnn._internal import argtypes

    parser = argtypes.ArgumentParser(prog="test")
    study.add_arguments(parser)
    return parser


def test_every_study_is_declared_once_and_listed_where_it_runs(capsys):
    for name, module in _study_modules():
        assert isinstance(module.STUDY, Study) and module.STUDY.name == name
        assert module.STUDY.module == module.__name__
        assert module.run_experiment == module.STUDY.run_experiment and module.DEFAULTS == module.STUDY.defaults
        assert cli.COMMANDS[name][0] == module.__name__
    assert set(run_command.STUDIES) == set(experiments.STUDIES)
    assert cli.main(["recipes"]) == 0
    listed = capsys.readouterr().out.split()
    # Every name `tfbnn run` accepts: the built-in recipes and the studies.
    for name in [*training.recipe_names(), *run_command.STUDIES]:
        assert name in listed, name
    assert "posterior-comparison" in listed


@pytest.mark.parametrize("name", list(experiments.STUDIES))
def test_the_command_options_are_the_settings(name):
    study = importlib.import_module(experiments.STUDIES[name][0]).STUDY
    parser = _parser(study)
    flags = {o for action in parser._actions for o in action.option_strings} - {"-h", "--help", "--output-dir"}
    wanted = set()
    for setting in study.settings:
        if setting.kind == "bool" and setting.default:
            wanted.add("--no-" + setting.name.replace("_", "-"))
        else:
            wanted.add(setting.flag)
        wanted |= {"--" + alias.replace("_", "-") for alias in setting.aliases}
    assert flags == wanted
    # No option given: the study's own defaults, checked the same way as from Python.
    args = vars(parser.parse_args([]))
    given = {s.name: args[s.name] for s in study.settings}
    assert study.resolve(given) == study.resolve({})


def _recipe_accepts(field, value):
    base = {"method": "ibnn"} if field == "variational_learning_rate" else {}
    if field == "noise_std":
        base = {"likelihood": "gaussian"}
    try:
        training.Recipe(**base, **{field: value})
    except ValueError:
        return False
    return True


def _setting_accepts(field, value):
    try:
        Setting(field, None).check(value)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("field", [f for f in _study.RECIPE_FIELDS if f != "dataset"])
def test_a_recipe_field_setting_accepts_what_the_recipe_accepts(field):
    values = [-1, 0, 1, 3, 0.5, 2.0, 1e-3, True, "1", float("nan"), float("inf")]
    if Setting(field, None).allow_none:
        values.append(None)
    for value in values:
        assert _setting_accepts(field, value) == _recipe_accepts(field, value), (field, value)


@pytest.mark.parametrize("name", list(experiments.STUDIES))
def test_a_study_is_a_list_of_recipes_the_command_shows(name, capsys):
    import json

    study = importlib.import_module(experiments.STUDIES[name][0]).STUDY
    wanted = study.recipes(study.resolve({}))
    assert all(isinstance(r, training.Recipe) for r in wanted)
    assert cli.main(["recipes", "--show", name]) == 0
    shown = [training.Recipe.from_dict(d) for d in json.loads(capsys.readouterr().out)]  # each a valid recipe
    assert [(r.name, r.method) for r in shown] == [(r.name, r.method) for r in wanted]
    # The same recipes, priors serialized (a prior object is written as its config).
    as_json = lambda recipes: json.loads(json.dumps([r.to_dict() for r in recipes]))  # noqa: E731
    assert as_json(shown) == as_json(wanted)
    if name not in ("vcl-split-digits", "kerashub-finetune"):  # own training loops (their docstrings say why)
        assert shown


def test_bad_settings_are_named_the_same_way_in_every_study():
    from tfbnn.experiments import ibnn_regression, ibnn_shift, vd_regression

    with pytest.raises(ValueError, match=r"Expected `depths` to be positive integers. Received: depths=\(1, 0\)"):
        ibnn_regression.STUDY.resolve({"depths": [1, 0]})
    with pytest.raises(ValueError, match=r"Expected `methods` to be names from \['ibnn', 'bbb'\]"):
        ibnn_regression.STUDY.resolve({"methods": ()})
    with pytest.raises(ValueError, match="Expected `warmup_fraction` to be a number in \\[0, 1\\]. "
                                         "Received: warmup_fraction=1.5"):
        vd_regression.STUDY.resolve({"warmup_fraction": 1.5})
    with pytest.raises(ValueError, match="Expected `epochs` to be a positive integer. Received: epochs=2.5"):
        ibnn_shift.STUDY.resolve({"epochs": 2.5})
    with pytest.raises(ValueError, match=r"Unknown settings \['epoch'\]"):
        ibnn_shift.STUDY.resolve({"epoch": 2})
    # Repeats of a unique list are dropped, in order; the values come back as Python numbers, tuples.
    s = ibnn_shift.STUDY.resolve({"corruptions": ["salt_and_pepper", "gaussian", "salt_and_pepper"],
                                  "learning_rate": 1})
    assert s["corruptions"] == ("salt_and_pepper", "gaussian") and s["learning_rate"] == 1.0


def test_the_second_name_of_the_kl_weight_is_a_deprecated_alias(capsys):
    from tfbnn.experiments import vd_sparsity

    with pytest.warns(DeprecationWarning, match="`kl_beta` is deprecated; use `beta`"):
        s = vd_sparsity.STUDY.resolve({"kl_beta": 0.25})
    assert s["beta"] == 0.25 and "kl_beta" not in s
    assert vd_sparsity.make_recipe(beta=0.5).beta == 0.5
    parser = _parser(vd_sparsity.STUDY)
    assert parser.parse_args(["--kl-beta", "0.5"]).beta == 0.5
    assert "--kl-beta is deprecated; use --beta" in capsys.readouterr().err
    assert parser.parse_args(["--beta", "0.5"]).beta == 0.5
    assert "--kl-beta" not in parser.format_help()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert vd_sparsity.STUDY.resolve({"beta": 0.25})["beta"] == 0.25


def test_a_study_rejects_a_setting_named_twice():
    with pytest.raises(ValueError, match=r"\['seed'\] repeated"):
        Study(name="x", module="tests.x", description="", settings=(Setting("seed", 0), Setting("seed", 1)),
              recipes=list, train=None, analyse=None)
    with pytest.raises(ValueError, match="kind='colour'"):
        Setting("tint", "red", kind="colour")


def test_tfbnn_run_runs_every_study_with_the_options_that_apply(monkeypatch, tmp_path, capsys):
    from tfbnn.experiments import uncertainty_comparison, vd_regression

    calls = []

    def fake(output_dir=None, **settings):
        calls.append((output_dir, settings))
        return {"files": []}

    monkeypatch.setattr(vd_regression, "run_experiment", fake)
    monkeypatch.setattr(uncertainty_comparison, "run_experiment", fake)
    assert cli.main(["run", "vd-regression", "--seed", "3", "--output-dir", str(tmp_path)]) == 0
    assert calls == [(str(tmp_path), {"seed": 3})]
    assert cli.main(["run", "uncertainty-comparison", "--quick"]) == 0
    assert calls[-1] == (None, {"quick": True})
    capsys.readouterr()
    assert cli.main(["run", "vd-regression", "--quick"]) == 2  # vd-regression has no quick setting
    err = capsys.readouterr().err.strip()
    assert "--quick does not apply to the study vd-regression" in err and len(err.splitlines()) == 1
    assert len(calls) == 2


def test_quick_is_a_setting_of_the_study():
    from tfbnn.experiments import vcl_split_digits

    s = vcl_split_digits.STUDY.resolve({"quick": True, "seeds": (4, 5)})
    assert s["seeds"] == (4,) and s["steps"] == vcl_split_digits.QUICK["steps"]
    assert vcl_split_digits.STUDY.resolve({})["steps"] == 1000
