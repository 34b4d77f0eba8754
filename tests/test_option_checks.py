"""Every value a user gives is checked against one declaration of its type and range before any work: probe
variant parameters, command-line options, and every key of the study and zoo files. Each bad value is one line
(exit 2) that names it and what it must be, and nothing is written."""

from __future__ import annotations

import json
import math

import duckdb
import pytest
from synthetic import class_clusters, write_feature_store

from featstore.errors import FeatstoreError
from featstore.probing.base import VARIANTS, get_variant
from featstore.schema import Number, Text
from featstore.store.location import StoreLocationValue
from featstore.threads import cores

from conftest import fails, run_cli


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    feats, labels = class_clusters(120, 3, [4, 8], seed=1)
    return write_feature_store(tmp_path_factory.mktemp("options") / "s.zarr", feats, labels, 3, chunk_rows=32)


def probe_args(store, db, *more):
    return ["probe", "--store", store, "--model", "synthetic", "--db", db, "--no-progress", *more]


@pytest.mark.parametrize("spec, message", [
    ("linear:lr_low=0", "lr_low=0 must be a number > 0"),  # looped in candidate_rates until out of memory
    ("linear:tol=nan", "tol=nan must be a number > 0 and < 1"),  # recorded converged after 5 epochs
    ("linear:tol=0", "tol=0 must be a number > 0 and < 1"),
    ("linear:max_epochs=0", "max_epochs=0 must be a whole number >= 1"),
    ("linear:max_epochs=-1", "max_epochs=-1 must be a whole number >= 1"),
    ("linear:max_epochs=2.5", "max_epochs=2.5 must be a whole number >= 1"),
    ("linear:momentum=1", "momentum=1 must be a number >= 0 and < 1"),
    ("linear:decay=1", "decay=1 must be a number > 1"),
    ("linear:lr_low=64", "lr_low=64 exceeds lr_high=32"),
    ("linear:lr_low=1e-30", "lr_low=1e-30 to lr_high=32 spans 53 candidate rates (one head each); at most 16"),
    ("linear:full_batch=2", "full_batch=2 must be 0 or 1"),
    ("linear:gtol=inf", "gtol=inf must be a number > 0"),
    ("linear:bogus=1", "no parameter 'bogus' (the parameters of linear: max_epochs, batch_size"),
    ("linear:tol", "'tol' is no key=value pair"),
    ("linear:tol=0.1,tol=0.2", "tol is given twice"),
    ("projected:dim=0", "dim=0 must be a whole number >= 1"),  # a traceback in the fit
    ("projected:dim=abc", "dim=abc must be a whole number >= 1"),
    ("paper:epochs=0", "epochs=0 must be a whole number >= 1"),
    ("paper:cosine=2", "cosine=2 must be 0 or 1"),
    ("paper:lr=-0.1", "lr=-0.1 must be a number > 0"),
    ("knn:k=0", "k=0 must be a whole number >= 1"),
    ("knn:metric=manhattan", "metric=manhattan must be one of 'cosine', 'euclidean'"),
    ("knn:metric=1", "metric=1 must be one of 'cosine', 'euclidean'"),
    ("head-probe:max_iterations=0", "max_iterations=0 must be a whole number >= 1"),
    ("tuned-lens:momentum=1", "momentum=1 must be a number >= 0 and < 1"),
    ("tuned-lens:steps=-1", "steps=-1 must be a whole number >= 0 and <= 100000"),
])
def test_variant_parameters_are_checked_as_declared(spec, message):
    with pytest.raises(FeatstoreError) as e:
        get_variant(spec)
    assert str(e.value).startswith(f"variant={spec!r}: {message}"), e.value


def test_good_variant_parameters_keep_their_meaning():
    v = get_variant("linear:max_epochs=3.0,tol=0.01")
    assert v.params["max_epochs"] == 3 and isinstance(v.params["max_epochs"], int) and v.params["tol"] == 0.01
    assert v.canonical_id == "linear:max_epochs=3,tol=0.01"
    assert get_variant("knn:metric=euclidean,k=10").canonical_id == "knn:k=10,metric=euclidean,ties=lowest"
    assert get_variant("knn").canonical_id == "knn:metric=euclidean,ties=lowest"  # the metric always
    assert get_variant("projected:dim=16").label == "projected16" and get_variant("projected").params["dim"] == 256


def _outside(value: Number) -> list[float]:
    """Values just beyond each bound a declaration has (and NaN for reals)."""
    step = 1 if value.whole else 1e-9
    out = [b - step for b in (value.ge,) if b is not None] + [b for b in (value.gt, value.lt) if b is not None]
    out += [b + step for b in (value.le,) if b is not None]
    return [v for v in out if v not in value.also] + ([] if value.whole else [math.nan, math.inf])


def test_every_registered_variant_declares_each_parameter_with_its_range():
    """The mechanism any variant adopts by declaring `parameters`: defaults pass, values beyond a bound (or
    outside the choices) do not."""
    assert {"linear", "paper", "projected", "knn", "head-probe", "tuned-lens", "lens-direct"} <= set(VARIANTS)
    for name, cls in VARIANTS.items():
        variant = cls()
        assert set(variant.params) == set(cls.parameters), name
        for key, value in cls.parameters.items():
            assert value.check(value.default) == value.default, (name, key)
            # a store location, free-form: an unreachable scheme or a number is refused
            if isinstance(value, StoreLocationValue):
                outside = ["gopher://host/store", 1]
            elif isinstance(value, Text):
                assert value.choices, f"{name}:{key} declares no choices"
                outside = [f"not-{value.default}", 1]
            else:
                assert value.ge is not None or value.gt is not None, f"{name}:{key} declares no lower bound"
                outside = _outside(value)
            for bad in outside:
                with pytest.raises(FeatstoreError, match=f"probe variant {name}: {key}="):
                    cls(**{key: bad})


def test_a_bad_variant_is_one_line_before_any_work(store, tmp_path):
    db = tmp_path / "f.duckdb"
    for spec in ("linear:tol=nan", "projected:dim=0", "linear:max_epochs=0"):
        assert f"--variant {spec}: " in fails(*probe_args(store, db, "--variant", spec))
    assert "--project-dim 0: must be a whole number >= 1" in fails(*probe_args(store, db, "--project-dim", "0"))
    assert not db.exists()


@pytest.mark.parametrize("args, message", [
    (["--val-frac", "1.5"], "--val-frac 1.5: must be a number > 0 and < 1"),
    (["--val-frac", "-0.1"], "--val-frac -0.1: must be a number > 0 and < 1"),
    (["--val-frac", "1.0"], "--val-frac 1.0: must be a number > 0 and < 1"),
    (["--val-frac", "nan"], "--val-frac nan: must be a number > 0 and < 1"),
    (["--view", ""], "--view '': must be a name or a comma list of names"),  # exited 0 doing nothing
    (["--view", " , "], "--view ' , ': must be a name or a comma list of names"),
    (["--train-on-view", ""], "--train-on-view '': must be a name"),
    (["--seed", "-1"], "--seed -1: must be a whole number >= 0"),
    (["--split-seed", "-2"], "--split-seed -2: must be a whole number >= 0"),
    (["--cross-fit", "1"], "--cross-fit 1: must be 0 or a whole number >= 2"),
    (["--memory-budget", "lots"], "--memory-budget lots: must be a size such as 4GB"),
    (["--threads", "0"], "--threads 0: must be a whole number >= 1"),
])
def test_probe_options_out_of_range(store, tmp_path, args, message):
    db = tmp_path / "f.duckdb"
    assert message in fails(*probe_args(store, db, *args))
    assert not db.exists()


@pytest.mark.parametrize("args, message", [
    (["ddb", "--db", "{tmp}/c.duckdb", "--tau", "0.9"], "--tau 0.9: must be a number > 0 and < 0.5"),  # overlap
    (["ddb", "--db", "{tmp}/c.duckdb", "--tau", "-1"], "--tau -1: must be a number > 0 and < 0.5"),  # nulls, rc 0
    (["ddb", "--db", "{tmp}/c.duckdb", "--tau", "0.5"], "--tau 0.5: must be a number > 0 and < 0.5"),
    (["zoo", "{tmp}/zoo.toml", "--db", "{tmp}/z.duckdb", "--batch-size", "0"], "--batch-size 0: must be a whole"),
    (["zoo", "{tmp}/zoo.toml", "--db", "{tmp}/z.duckdb", "--tau", "0.7"], "--tau 0.7: must be a number > 0"),
    (["zoo", "{tmp}/zoo.toml", "--db", "{tmp}/z.duckdb", "--top-n", "0"], "--top-n 0: must be a whole number >= 1"),
    (["circuits", "--model", "test_vit", "--data", "{tmp}", "--db", "{tmp}/c.duckdb", "--ig-steps", "0"],
     "--ig-steps 0: must be a whole number >= 1"),
    (["build", "--model", "resnet18", "--data", "{tmp}", "--store", "{tmp}/s.zarr", "--chunk-rows", "0"],
     "--chunk-rows 0: must be a whole number >= 1"),
    (["build", "--model", "resnet18", "--data", "{tmp}", "--store", "{tmp}/s.zarr", "--views", ""],
     "--views '': must be a name or a comma list"),
    (["cost", "--model", "resnet18", "--db", "{tmp}/c.duckdb", "--repeats", "0"], "--repeats 0: must be a whole"),
    (["demo", "--out", "{tmp}/demo", "--epochs", "0"], "--epochs 0: must be a whole number >= 1"),
])
def test_other_options_out_of_range(tmp_path, args, message):
    (tmp_path / "zoo.toml").write_text("")
    before = sorted(tmp_path.iterdir())
    assert message in fails(*[a.format(tmp=tmp_path) for a in args])
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize("too_many", [cores() + 1, 100_000, 1_000_000])
def test_more_threads_than_cores_warn_in_one_line_and_run_on_the_cores(store, tmp_path, too_many):
    """--threads 512 on 2 cores ran several times slower without a word; 100,000 crashed in libgomp (rc 139) and a
    million was a std::bad_alloc traceback. Now one warning line, and the probe runs on the cores."""
    db = tmp_path / "f.duckdb"
    out = run_cli(*probe_args(store, db, "--threads", str(too_many))).output
    warnings = [line for line in out.splitlines() if "warning" in line]
    assert warnings == [f"featstore: warning: --threads {too_many}: this process may run on {cores()} core(s), so it "
                        f"runs {cores()} threads (more threads than cores make every kernel wait for descheduled "
                        f"threads); give at most {cores()} or leave --threads out"]
    assert "wrote run synthetic/clean/linear" in out
    info = duckdb.connect(str(db), read_only=True).execute("SELECT DISTINCT info FROM probe_fits").fetchall()
    assert {json.loads(i)["threads"] for (i,) in info} == {cores()}
    out = run_cli(*probe_args(store, tmp_path / "f.duckdb", "--threads", str(cores()))).output
    assert "warning" not in out


STUDY_MODEL = '[[models]]\nname = "resnet18"\nweights = "none"\n'


@pytest.mark.parametrize("text, message", [
    ('[probe]\nseeds = "01"\n', '[probe]: seeds = \'01\' must be a non-empty list, each a whole number >= 0'),
    ("[probe]\nseeds = 1\n", "[probe]: seeds = 1 must be a non-empty list"),
    ("[probe]\nseeds = [0, -1]\n", "[probe]: seeds = [0, -1] must be a non-empty list, each a whole number >= 0"),
    ("[probe]\nseeds = [0, 0]\n", "[probe] seeds lists 0 twice"),
    ('[probe]\nvariants = "linear"\n', "[probe]: variants = 'linear' must be a non-empty list"),
    ('[probe]\nvariants = ["linear:lr_low=0"]\n', "--variant linear:lr_low=0: lr_low=0 must be a number > 0"),
    ("[probe]\nval_frac = 1.5\n", "[probe]: val_frac = 1.5 must be a number > 0 and < 1"),
    ("[probe]\ncross_fit = 1\n", "[probe]: cross_fit = 1 must be 0 or a whole number >= 2"),
    ("[probe]\nsplit_seed = 0.5\n", "[probe]: split_seed = 0.5 must be a whole number >= 0"),
    ("[probe]\nmemory_budget = true\n", "[probe]: memory_budget = True must be a size"),
    ('[probe]\ndevice = 0\n', "[probe]: device = 0 must be a non-empty string"),
    ('[build]\nviews = "clean"\n', "[build]: views = 'clean' must be a non-empty list"),
    ('[build]\nviews = ["clean", "fog-1"]\n', "unknown view 'fog-1'"),
    ('[build]\nbatch_size = "16"\n', "[build]: batch_size = '16' must be a whole number >= 1"),
    ("[build]\nworkers = -1\n", "[build]: workers = -1 must be a whole number >= 0"),
    ("[build]\nchunk_rows = 0\n", "[build]: chunk_rows = 0 must be a whole number >= 1"),
    ('[build]\nprecision = "fp8"\n', "[build]: precision = 'fp8' must be one of 'auto', 'fp32', 'fp16', 'bf16'"),
    ('[data]\npath = "images"\nlimit = 2.5\n', "[data]: limit = 2.5 must be a whole number >= 1"),
    ('[data]\npath = "images"\nlabels = 3\n', "[data]: labels = 3 must be a non-empty string"),
    ("[data]\npath = 3\n", "[data]: path = 3 must be a non-empty string"),
])
def test_every_study_key_is_type_checked(tmp_path, text, message):
    path = tmp_path / "study.toml"
    path.write_text(STUDY_MODEL + ("" if "[data]" in text else '[data]\npath = "images"\n') + text)
    line = fails("study", path, "--out", tmp_path / "out")
    assert str(path) in line and message in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("top, message", [
    ("k = 0", ": k = 0 must be a whole number >= 1"),  # an all-null table, rc 0
    ("k = 100", ": k = 100 must be below the 12 anchors of resnet18 (k counts the anchors after the first that "
                "must agree: 1 <= k <= 11)"),
    ('k = "2"', ": k = '2' must be a whole number >= 1"),
    ("name = 3", ": name = 3 must be a non-empty string"),
    ("published = 1", ": published = 1 must be a non-empty string"),
    ('models = "resnet18"', " [[models]] #1 must be a table of keys, not 'resnet18'"),
    ('models = [{name = "resnet18", weights = 3}]',
     " [[models]] #1: weights = 3 must be a non-empty string or a non-empty list"),
    ('models = [{name = "resnet18", image_size = "32"}]',
     " [[models]] #1: image_size = '32' must be a whole number >= 1"),
    ('models = [{name = "resnet18", anchors = ["relu"]}]',
     " [[models]] #1: anchors = ['relu'] must be a non-empty string"),
    ('models = [{name = "resnet18", anchors = "relu,layer1.0"}]\nk = 2', ": k = 2 must be below the 2 anchors"),
    ("data = 3", " [data] must be a table of keys, not 3"),
])
def test_study_top_level_keys_and_k(tmp_path, top, message):
    path = tmp_path / "study.toml"
    models = "" if "models" in top else STUDY_MODEL
    path.write_text(f"{top}\n{models}" + ("" if top.startswith("data") else '[data]\npath = "images"\n'))
    line = fails("study", path, "--out", tmp_path / "out")
    assert f"study file {path}{message}" in line, line
    assert not (tmp_path / "out").exists()


def test_a_k_every_model_has_anchors_for_passes(tmp_path):
    from featstore.workflows.study import load_study

    (tmp_path / "images").mkdir()
    path = tmp_path / "study.toml"
    path.write_text(f'k = 11\n{STUDY_MODEL}[data]\npath = "images"\n[probe]\nseeds = [0, 2]\n')
    study = load_study(path)
    assert study.k == 11 and study.seeds == [0, 2]


ZOO_MODELS = "".join(f'[[models]]\nname = "m{i}"\nmodel = "test_vit"\n' for i in range(3))


@pytest.mark.parametrize("text, message", [
    ('study = 3\n[id]\ndata = "x"\n[[ood]]\nname = "n"\n' + ZOO_MODELS, ": study = 3 must be a non-empty string"),
    ('[id]\ndata = 3\n[[ood]]\nname = "n"\n' + ZOO_MODELS, " [id]: data = 3 must be a non-empty string"),
    ('id = "x"\n[[ood]]\nname = "n"\n' + ZOO_MODELS, " [id] must be a table of keys, not 'x'"),
    ('[id]\ndata = "x"\n[[ood]]\nname = 5\n' + ZOO_MODELS, " [[ood]] #1: name = 5 must be a non-empty string"),
    ('[id]\ndata = "x"\n[[ood]]\nname = "n"\nview = ["clean"]\n' + ZOO_MODELS,
     " [[ood]] #1: view = ['clean'] must be a non-empty string"),
    ('ood = 3\n[id]\ndata = "x"\n' + ZOO_MODELS, " [[ood]] #1 must be a table of keys, not 3"),
    ('[id]\ndata = "x"\n[[ood]]\nname = "n"\n' + ZOO_MODELS.replace('name = "m0"', "name = 0"),
     " [[models]] #1: name = 0 must be a non-empty string"),
    ('[id]\ndata = "x"\n[[ood]]\nname = "n"\n' + ZOO_MODELS.replace('"test_vit"', '"test_vit"\nimage_size = "64"', 1),
     " [[models]] #1: image_size = '64' must be a whole number >= 1"),
    ('[id]\ndata = "x"\n[[ood]]\nname = "n"\n' + ZOO_MODELS.replace('"test_vit"', '"test_vit"\nweights = 5', 1),
     " [[models]] #1: weights = 5 must be a non-empty string"),
])
def test_every_zoo_key_is_type_checked(tmp_path, text, message):
    path = tmp_path / "zoo.toml"
    path.write_text(text)
    line = fails("zoo", path, "--db", tmp_path / "z.duckdb")
    assert f"{path}{message}" in line, line
    assert not (tmp_path / "z.duckdb").exists()
