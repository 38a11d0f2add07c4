"""tfbnn.hub and tfbnn.convert.by_policy on tiny KerasHub models built from configs (offline, random weights)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbnn

keras_hub = pytest.importorskip("keras_hub")

N, L, C = 16, 8, 3


@pytest.fixture(scope="module")
def task():
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=L, dropout=0.2)
    return keras_hub.models.BertTextClassifier(backbone=backbone, preprocessor=None, num_classes=C, dropout=0.1)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(0, 50, (N, L)).astype("int32"), "segment_ids": np.zeros((N, L), "int32"),
         "padding_mask": np.ones((N, L), "int32")}
    return x, rng.integers(0, C, N).astype("int32")


POLICY = [("bert_backbone/pooled_dense", "flipout"), ("logits", "local_reparameterization"),
          ("classifier_dropout", "mc_dropout"), ("*", "keep")]


def test_policy_selects_exactly_the_intended_paths(task):
    assert tfbnn.convert.policy_plan(task, POLICY) == {
        "bert_backbone/pooled_dense": "flipout", "classifier_dropout": "mc_dropout",
        "logits": "local_reparameterization"}
    # first match wins; a regex; a Bayesian method skips the dropout layers a glob also matches
    plan = tfbnn.convert.policy_plan(task, [("logits", "keep"), ("re:.*(pooled_dense|logits)", "reparameterization"),
                                            ("*dropout", "flipout")])
    assert plan == {"bert_backbone/pooled_dense": "reparameterization"}


def test_converted_task_trains_predicts_and_round_trips(task, data, tmp_path):
    x, y = data
    bnn = tfbnn.convert.by_policy(task, POLICY, init_scale="moped", moped_delta=0.05, num_examples=N, seed=3)
    backbone = bnn.get_layer("bert_backbone")
    assert type(backbone.get_layer("pooled_dense")).__name__ == "DenseFlipout"
    assert type(bnn.get_layer("logits")).__name__ == "DenseLocalReparameterization"
    assert type(bnn.get_layer("classifier_dropout")).__name__ == "MCDropout"
    encoder = backbone.get_layer("transformer_layer_0")
    assert type(encoder._feedforward_output_dense) is keras.layers.Dense  # inside a subclassed layer: kept
    with tfbnn.posterior_mean(bnn):  # MOPED means = the trained weights
        np.testing.assert_allclose(bnn(x), task(x), atol=1e-5)
    bnn(x)
    kl = sum(float(k) for k in bnn.losses)  # the ELBO convention: kl_weight = 1/N
    np.testing.assert_allclose(kl, float(tfbnn.kl_divergence(bnn)) / N, rtol=1e-5)
    bnn.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    bnn.fit(x, y, batch_size=N, epochs=1, verbose=0)
    path = str(tmp_path / "bnn.keras")
    bnn.save(path)
    loaded = keras.saving.load_model(path)
    with tfbnn.posterior_mean(bnn), tfbnn.posterior_mean(loaded):
        np.testing.assert_allclose(loaded(x), bnn(x), atol=1e-6)
    for model in (bnn, loaded):
        for layer in tfbnn.stochastic_layers(model):
            layer.seed_generator.state.assign(np.array([7, 0], "uint32"))
    np.testing.assert_allclose(bnn(x), loaded(x), atol=1e-6)  # equal seeded samples
    a = tfbnn.predict(bnn, x, num_samples=2, from_logits=True, return_samples=True).samples
    assert np.std(a, axis=0).max() > 0  # samples differ


@pytest.mark.parametrize("policy, message", [
    ([("*query", "flipout")], "EinsumDense layer 'bert_backbone/transformer_layer_0/self_attention_layer/query'"),
    ([("*feedforward_output_dense", "vd")], "inside the subclassed layer 'bert_backbone/transformer_layer_0'"),
    ([("*/feedforward_dropout", "mc_dropout")], "tfbnn.predict(..., mc_dropout=True)"),
    ([("no_such_layer", "flipout")], "patterns ['no_such_layer'] that match none"),
    ([("logits", "bayes")], "Received: method='bayes' for pattern 'logits'"),
    ([("re:(", "flipout")], "valid regular expression"),
    ([("logits", "keep")], "changes no layer"),
    (5, "Received: policy=5"),
    ([], "Expected at least one (pattern, method) entry"),
])
def test_refusals_name_the_layer(task, policy, message):
    with pytest.raises(ValueError) as e:
        tfbnn.convert.by_policy(task, policy)
    assert message in str(e.value)


def test_shared_layer_is_refused():
    inp = keras.Input((3,))
    shared = keras.layers.Dense(3, name="shared")
    model = keras.Model(inp, keras.layers.Dense(2, name="out")(shared(shared(inp))))
    with pytest.raises(ValueError, match="Layer 'shared' is shared"):
        tfbnn.convert.by_policy(model, {"*": "flipout"})
    assert tfbnn.convert.policy_plan(model, [("shared", "keep"), ("*", "flipout")]) == {"out": "flipout"}


def test_verbose_prints_the_report(capsys):
    inner = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="hidden")], name="body")
    model = keras.Sequential([keras.Input((3,)), inner, keras.layers.Dropout(0.5, name="drop"),
                              keras.layers.Dense(2, name="out")])
    bnn = tfbnn.convert.by_policy(model, [("body/*", "vd"), ("*", "mc_dropout")], seed=0, verbose=True)
    assert capsys.readouterr().out.splitlines() == ["body/hidden -> vd", "drop -> mc_dropout"]
    assert type(bnn.get_layer("body").get_layer("hidden")).__name__ == "DenseVariationalDropout"
    assert bnn.get_layer("drop").rate == 0.5 and type(bnn.get_layer("out")) is keras.layers.Dense


def test_mc_dropout_reaches_the_backbone_dropout(task, data):
    x, _ = data
    samples = tfbnn.predict(task, x, num_samples=4, mc_dropout=True, from_logits=True, return_samples=True).samples
    spread = np.std(samples, axis=0).max()
    assert spread > 1e-3 * np.abs(samples).max()
    # the task's own classifier_dropout has rate 0.1 < the backbone's: with it alone off, still random
    feats = tfbnn.predict(tfbnn.hub.feature_model(task), x, num_samples=4, mc_dropout=True, return_samples=True)
    assert np.std(feats.samples, axis=0).max() > 0


def test_last_layer_laplace_equals_laplace_on_a_plain_dense_model(task, data):
    x, y = data
    la = tfbnn.hub.last_layer_laplace(task, x, y)
    phi = task.layers[-1].input  # the pooled features, computed independently
    features = keras.Model(task.inputs, phi).predict(x, verbose=0)
    logits = task.get_layer("logits")
    plain = keras.Sequential([keras.Input((features.shape[1],)), keras.layers.Dense(C)])
    plain.set_weights(logits.get_weights())
    ref = tfbnn.laplace.fit(plain, features, y, hessian="kron").optimize_prior_precision(method="marglik")
    np.testing.assert_allclose(la.prior_precision, ref.prior_precision, rtol=1e-6)
    np.testing.assert_allclose(la.predict(features), ref.predict(features), atol=1e-6)
    fixed = tfbnn.hub.last_layer_laplace(task, x, y, prior_precision=2.0)
    assert fixed.prior_precision == 2.0
    with pytest.raises(ValueError, match="prior_precision='evidence'"):
        tfbnn.hub.last_layer_laplace(task, x, y, prior_precision="evidence")


def test_bayesian_head_trains_only_the_head(task, data):
    x, y = data
    model = tfbnn.hub.bayesian_head(task, method="reparameterization", num_examples=N, seed=0)
    assert type(model.layers[-1]).__name__ == "DenseReparameterization"
    assert {v.path.split("/")[0] for v in model.trainable_variables} == {"logits"}
    before = [w.copy() for w in model.get_layer("bert_backbone").get_weights()]
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=N, epochs=1, verbose=0)
    for a, b in zip(before, model.get_layer("bert_backbone").get_weights()):
        np.testing.assert_array_equal(a, b)


def test_ensemble_of_heads_equals_separate_heads(task, data, tmp_path):
    x, y = data
    M = 3
    phi = tfbnn.hub.pooled_features(task, x)
    heads = tfbnn.hub.ensemble_heads(task, M, seed=0)
    layer = heads.get_layer("heads")
    kernel, bias = layer.kernel.numpy().astype("float64"), layer.bias.numpy().astype("float64")
    assert not np.allclose(kernel[0], kernel[1])  # members start apart
    heads.compile(keras.optimizers.SGD(0.5), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    heads.fit(phi, tfbnn.hub.tile_labels(y, M), batch_size=N, epochs=2, verbose=0, shuffle=False)
    onehot = np.eye(C)[y]
    for _ in range(2):  # M separate heads, each by its own gradient step phi^T (p - y) / (N M) (the members' mean)
        logits = np.einsum("nd,mdk->mnk", phi, kernel) + bias[:, None]
        p = np.exp(logits - logits.max(-1, keepdims=True))
        residual = p / p.sum(-1, keepdims=True) - onehot
        kernel -= 0.5 * np.einsum("nd,mnk->mdk", phi, residual) / (N * M)
        bias -= 0.5 * residual.sum(1) / (N * M)
    joint = heads(phi).numpy()
    for m in range(M):
        np.testing.assert_allclose(joint[:, m], phi @ kernel[m] + bias[m], atol=1e-5)
    model = tfbnn.hub.ensemble_model(task, heads)
    expected = np.mean(keras.ops.softmax(joint).numpy(), axis=1)
    np.testing.assert_allclose(model(x), expected, atol=1e-5)
    res = tfbnn.predict(model, x, num_samples=1, task="classification")
    np.testing.assert_allclose(res.mean_probs, expected, atol=1e-5)
    path = str(tmp_path / "ensemble.keras")
    model.save(path)
    np.testing.assert_allclose(keras.saving.load_model(path)(x), expected, atol=1e-5)


def test_ensemble_dense_config_and_bad_input():
    layer = tfbnn.hub.EnsembleDense(2, 3, activation="softmax", seed=1)
    clone = tfbnn.hub.EnsembleDense.from_config(layer.get_config())
    assert (clone.num_members, clone.units, clone.seed) == (2, 3, 1)
    a = tfbnn.hub.EnsembleDense(2, 3, seed=1)
    b = tfbnn.hub.EnsembleDense(2, 3, seed=1)
    a.build((None, 4))
    b.build((None, 4))
    np.testing.assert_array_equal(a.kernel.numpy(), b.kernel.numpy())  # seeded
    with pytest.raises(ValueError, match="num_members=0"):
        tfbnn.hub.EnsembleDense(0, 3)
    with pytest.raises(ValueError, match="seed='x'"):
        tfbnn.hub.EnsembleDense(2, 3, seed="x")
    with pytest.raises(ValueError, match="Received: last layer 'drop'"):
        inp = keras.Input((3,))
        tfbnn.hub.head_layer(keras.Model(inp, keras.layers.Dropout(0.1, name="drop")(inp)))
    with pytest.raises(ValueError, match="batch_size=0"):
        tfbnn.hub.pooled_features(keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]), np.ones((2, 2)), 0)


def test_resnet_classifier_convolutions_convert_with_means_at_the_trained_weights():
    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64], stackwise_num_blocks=[1],
        stackwise_num_strides=[1], block_type="basic_block", use_pre_activation=False, image_shape=(8, 8, 3))
    task = keras_hub.models.ResNetImageClassifier(backbone=backbone, num_classes=2, preprocessor=None)
    policy = {"re:.*_conv": "flipout", "predictions": "vd"}
    assert tfbnn.convert.policy_plan(task, policy) == {
        "res_net_backbone/conv1_conv": "flipout", "res_net_backbone/stack0_block0_1_conv": "flipout",
        "res_net_backbone/stack0_block0_2_conv": "flipout", "predictions": "vd"}
    bnn = tfbnn.convert.by_policy(task, policy, init_scale=1e-3, seed=0)
    images = np.random.default_rng(1).normal(size=(2, 8, 8, 3)).astype("float32")
    with tfbnn.posterior_mean(bnn):
        np.testing.assert_allclose(bnn(images), task(images), atol=1e-5)
    assert type(bnn.get_layer("res_net_backbone").get_layer("conv1_bn")) is keras.layers.BatchNormalization


def _tiny_vit(num_classes):
    """The smallest KerasHub ViT classifier: 8x8x1 images, 4x4 patches, one layer of width 8, no dropout."""
    keras.utils.set_random_seed(2)
    backbone = keras_hub.models.ViTBackbone(image_shape=(8, 8, 1), patch_size=4, num_layers=1, num_heads=1,
                                            hidden_dim=8, mlp_dim=8, dropout_rate=0.0, attention_dropout=0.0)
    return keras_hub.models.ViTImageClassifier(backbone=backbone, preprocessor=None, num_classes=num_classes)


def test_bayesian_head_on_a_kerashub_vit_trains_predicts_saves_and_exports_its_summary(tmp_path):
    """keras-hub 0.32's ViTPatchingAndEmbedding cannot be rebuilt from its own config; the head's conversion
    reuses the backbone instead, and the ViTBackbone saves with its own (constructor) config. Checked against the
    task's own logits (posterior means), the in-memory Monte Carlo summary under the export's seeding, and the
    weights before and after a training step."""
    import tensorflow as tf

    vit = _tiny_vit(C)
    rng = np.random.default_rng(1)
    x, y = rng.random((N, 8, 8, 1), dtype=np.float32), rng.integers(0, C, N).astype("int32")
    logits = vit(x).numpy()
    model = tfbnn.hub.bayesian_head(vit, method="flipout", num_examples=N, init_scale=0.5, seed=0)
    assert model.get_layer(vit.backbone.name) is vit.backbone  # shared, not rebuilt
    assert not vit.backbone.trainable  # shared, so frozen in the task too (documented)
    assert type(model.layers[-1]) is tfbnn.layers.DenseFlipout
    with tfbnn.posterior_mean(model):  # posterior means at the trained weights: the task's logits
        np.testing.assert_allclose(model(x), logits, atol=1e-5)
    samples = tfbnn.predict(model, x, num_samples=4, from_logits=True, return_samples=True).samples
    assert samples.shape == (4, N, C) and np.std(samples, axis=0).min() > 1e-3

    head = model.layers[-1]
    assert {v.path.split("/")[0] for v in model.trainable_variables} == {head.name}
    frozen = [w.numpy().copy() for w in model.weights if not w.path.startswith(head.name)]
    loc = head.kernel_loc.numpy().copy()
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=N, epochs=1, verbose=0)
    assert np.abs(head.kernel_loc.numpy() - loc).min() > 0  # one Adam step moves every posterior mean
    for before, after in zip(frozen, [w for w in model.weights if not w.path.startswith(head.name)]):
        np.testing.assert_array_equal(before, after.numpy())  # the backbone (and seed states) untouched

    path = str(tmp_path / "vit_head.keras")
    model.save(path)
    loaded = tfbnn.hub.load_model(path)
    assert type(loaded.get_layer(vit.backbone.name)) is keras_hub.models.ViTBackbone
    assert [v.path for v in loaded.trainable_variables] == [v.path for v in model.trainable_variables]
    with tfbnn.posterior_mean(model), tfbnn.posterior_mean(loaded):
        np.testing.assert_allclose(loaded(x), model(x), atol=1e-6)

    T, seed = 5, 3
    served = tf.saved_model.load(tfbnn.export.export(model, str(tmp_path / "sm"), num_samples=T, from_logits=True))
    got = {k: v.numpy() for k, v in served.summary_seeded(tf.constant(x), tf.constant(seed, tf.int64)).items()}
    for i, generator in enumerate(tfbnn.export.seed_generators(model)):  # the export's seeding: [seed, i 2^32]
        generator.state.assign(np.array([seed, i * 2**32], "int64").astype(generator.state.dtype))
    ref = tfbnn.predict(model, x, num_samples=T, batch_size=N, from_logits=True)
    np.testing.assert_allclose(got["mean_probs"], ref.mean_probs, atol=1e-5)
    np.testing.assert_allclose(got["predictive_entropy"], ref.predictive_entropy, atol=1e-5)
    np.testing.assert_allclose(got["aleatoric"], ref.expected_entropy, atol=1e-5)
    np.testing.assert_allclose(got["epistemic"], ref.mutual_information, atol=1e-5)
    assert got["epistemic"].max() > 1e-4  # the head samples differ
    with tfbnn.posterior_mean(model):
        np.testing.assert_allclose(served.mean(tf.constant(x)), model(x), atol=1e-5)


def test_members_to_rows_and_ensemble_mean_keep_a_known_batch_size():
    probs = keras.Input((3, 4), batch_size=5)  # (B, M, K), B = 5, M = 3
    rows = tfbnn.hub.MembersToRows()(probs)
    mean = tfbnn.layers.EnsembleMean(3)(rows)
    assert tuple(rows.shape) == (15, 4) and tuple(mean.shape) == (5, 4)
    assert tfbnn.hub.MembersToRows().compute_output_shape((5, 3, 4)) == (15, 4)
    assert tfbnn.layers.EnsembleMean(3).compute_output_shape((15, 4)) == (5, 4)
    assert tuple(tfbnn.layers.EnsembleMean(3)(keras.Input((4,))).shape) == (None, 4)  # unknown stays unknown
    x = np.arange(5 * 3 * 4, dtype="float32").reshape(5, 3, 4)
    np.testing.assert_allclose(keras.Model(probs, mean)(x), x.mean(axis=1))  # each example's members averaged


def test_ensemble_mean_on_rows_not_divisible_by_its_size_names_the_argument():
    layer = tfbnn.layers.EnsembleMean(2)
    message = r"expects E \* B rows at inference \(E = ensemble_size = 2\).*Received: 3 rows with ensemble_size=2"
    with pytest.raises(ValueError, match=message):
        layer(np.ones((3, 4), "float32"))
    with pytest.raises(ValueError, match=message):
        layer(keras.Input((4,), batch_size=3))
    assert layer(np.ones((3, 4), "float32"), training=True).shape == (3, 4)  # training passes the rows through
    traced = tf.function(lambda x: layer(x), input_signature=[tf.TensorSpec((None, 4))])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"expects E \* B rows at inference"):
        traced(np.ones((3, 4), "float32"))


def test_hub_takes_numpy_integers_and_refuses_zero_members():
    layer = tfbnn.hub.EnsembleDense(np.int64(2), np.int32(3), seed=np.int64(3))
    assert layer.get_config()["seed"] == 3 and type(layer.get_config()["seed"]) is int
    assert (layer.num_members, layer.units) == (2, 3)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, name="dense")])
    inp = keras.Input((2,))
    task = keras.Model(inp, keras.layers.Dense(2)(model(inp)))
    assert tfbnn.hub.pooled_features(task, np.ones((4, 2), "float32"), np.int64(3)).shape == (4, 3)
    np.testing.assert_array_equal(tfbnn.hub.tile_labels(np.array([0, 2]), np.int64(2)), [[0, 0], [2, 2]])
    with pytest.raises(ValueError, match=r"Expected `num_members` to be a positive integer. Received: num_members=0"):
        tfbnn.hub.tile_labels(np.array([0, 1]), 0)
    with pytest.raises(ValueError, match=r"Received: y.shape=\(2, 1\)"):
        tfbnn.hub.tile_labels(np.array([[0], [1]]), 2)
