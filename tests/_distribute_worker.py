"""Subprocess side of tests/test_distribute.py (TF must see 2 logical CPUs from the start).

    python tests/_distribute_worker.py mirrored OUT.json   # MirroredStrategy checks on 2 logical CPUs
    python tests/_distribute_worker.py worker OUT_DIR      # one MultiWorkerMirroredStrategy worker (TF_CONFIG)
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

from tfbnn import distribute  # noqa: E402

ESTIMATORS = ("DenseReparameterization", "DenseFlipout", "DenseLocalReparameterization")
NUM_EXAMPLES = 100  # N of the KL scale: the KL is a large part of the loss, so a wrong scale shows


def _mlp(rho, seed=1, estimators=ESTIMATORS):
    """5 -> 8 -> ... -> 3, one Bayesian dense layer per estimator (the last one is the softmax output)."""
    import keras

    import tfbnn

    kwargs = {"kernel_scale_initializer": keras.initializers.Constant(rho),
              "bias_scale_initializer": keras.initializers.Constant(rho)}
    stack = [keras.Input((5,))]
    for i, name in enumerate(estimators):
        last = i == len(estimators) - 1
        stack.append(getattr(tfbnn.layers, name)(3 if last else 8, activation="softmax" if last else "tanh",
                                                 seed=seed + i, name=name, **kwargs))
    return keras.Sequential(stack)


def _data(n=16, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5)).astype("float32"), rng.integers(0, 3, size=n).astype("int32")


def _one_step(model, x, y):
    """One SGD step on the whole batch with kl_weight = 1 / N: (loss, weights before, weights after)."""
    import tfbnn

    tfbnn.set_kl_weight(model, 1.0 / NUM_EXAMPLES)
    before = [w.copy() for w in model.get_weights()]
    loss = model.train_on_batch(x, y)
    return float(loss), before, model.get_weights()


def _compile(model, strategy):
    import keras

    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.5), loss="sparse_categorical_crossentropy",
                  jit_compile=distribute.jit_compile_for(strategy, False))


def check_one_step(strategy):
    """The mirrored SGD step against the single-device step, noise off (sigma ~ 1e-6)."""
    import numpy as np

    import tfbnn

    x, y = _data()
    single = _mlp(rho=-30.0)
    _compile(single, tf.distribute.get_strategy())
    init = single.get_weights()
    loss_1, before_1, after_1 = _one_step(single, x, y)
    with strategy.scope():
        mirrored = _mlp(rho=-30.0)
        mirrored.set_weights(init)
        _compile(mirrored, strategy)
    loss_2, before_2, after_2 = _one_step(mirrored, x, y)

    # The loop tfbnn.distribute.fit runs across workers, here on the 2 local replicas.
    with strategy.scope():
        looped = _mlp(rho=-30.0)
        looped.set_weights(init)
        _compile(looped, strategy)
    tfbnn.set_kl_weight(looped, 1.0 / NUM_EXAMPLES)
    history = distribute._multi_worker_loop(looped, strategy, tf.data.Dataset.from_tensors((x, y)).repeat(),
                                            epochs=1, steps=1, callbacks=None, verbose=0)
    after_3 = looped.get_weights()
    return {
        "loss_single": loss_1,
        "loss_mirrored": loss_2,
        "kl_over_n": float(tfbnn.kl_divergence(single)) / NUM_EXAMPLES,
        "kl_weights": [float(layer.kl_weight.numpy()) for layer in tfbnn.bayesian_layers(mirrored)],
        "max_update": max(float(np.abs(a - b).max()) for a, b in zip(after_1, before_1)),
        "max_update_diff": max(float(np.abs((a2 - b2) - (a1 - b1)).max())
                               for a1, b1, a2, b2 in zip(after_1, before_1, after_2, before_2)),
        "max_weight_diff": max(float(np.abs(a - b).max()) for a, b in zip(after_1, after_2)),
        "loss_loop": float(history.history["loss"][0]),
        "max_weight_diff_loop": max(float(np.abs(a - b).max()) for a, b in zip(after_1, after_3)),
    }


def check_replica_noise(strategy):
    """Per layer: outputs of 2 replicas for identical inputs, and a single-device run of the same seed."""
    import keras
    import numpy as np

    import tfbnn

    makers = {name: (lambda name=name: getattr(tfbnn.layers, name)(
        4, seed=7, kl_weight=0.0, kernel_scale_initializer=keras.initializers.Constant(0.0)))
        for name in ESTIMATORS}
    makers["MCDropout"] = lambda: tfbnn.layers.MCDropout(0.5, seed=7)
    x = tf.ones((3, 6))
    out = {}
    for name, make in makers.items():
        with strategy.scope():
            layer = make()
            layer.build(x.shape)
        for w in layer.weights:
            if "loc" in w.path or w.path.endswith("kernel"):
                w.assign(np.full(w.shape, 0.5, "float32"))
        run = tf.function(lambda layer=layer: strategy.run(lambda: layer(x, training=True)))
        first = [r.numpy() for r in strategy.experimental_local_results(run())]
        second = [r.numpy() for r in strategy.experimental_local_results(run())]
        states = [s.numpy().tolist() for s in strategy.experimental_local_results(layer.seed_generator.state.value)]

        alone = make()  # the same seed on one device, no replica id folded in
        alone.build(x.shape)
        alone.set_weights(layer.get_weights())
        single = alone(x, training=True).numpy()
        out[name] = {
            "replica_diff": float(np.abs(first[0] - first[1]).max()),
            "step_diff": float(np.abs(first[0] - second[0]).max()),
            "replica0_vs_single": float(np.abs(first[0] - single).max()),
            "seed_states": states,
        }
    return out


def run_mirrored(path):
    devices = distribute.split_cpu(2)
    strategy = distribute.get_strategy("mirrored")
    result = {
        "devices": devices,
        "num_replicas": strategy.num_replicas_in_sync,
        "auto": distribute.resolve_strategy_name("auto"),
        "jit_compile": distribute.jit_compile_for(strategy, "auto"),
        "one_step": check_one_step(strategy),
        "replica_noise": check_replica_noise(strategy),
    }
    with open(path, "w") as f:
        json.dump(result, f)


def run_worker(out_dir):
    import keras
    import numpy as np

    import tfbnn

    tf.config.threading.set_intra_op_parallelism_threads(1)
    strategy = distribute.get_strategy("auto")  # multi_worker: TF_CONFIG lists 2 workers
    assert isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy), type(strategy)
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    keras.utils.set_random_seed(index)  # different initial values: the strategy must sync them
    x, y = _data(n=64, seed=2)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)
    with strategy.scope():
        model = _mlp(rho=-5.0, seed=3, estimators=("DenseFlipout", "DenseLocalReparameterization"))
        _compile(model, strategy)
    initial = model.get_weights()  # already the same on both workers: worker 0's values are broadcast
    # distribute.fit: Keras 3's model.fit fails under MultiWorkerMirroredStrategy.
    history = distribute.fit(model, ds, steps_per_epoch=3, epochs=2,
                             callbacks=[tfbnn.KLAnnealing(num_examples=64, schedule="constant")])
    np.savez(os.path.join(out_dir, f"worker{index}.npz"), *model.get_weights(),
             loss=np.array(history.history["loss"]), chief=np.array(distribute.is_chief(strategy)),
             moved=np.array(max(float(np.abs(a - b).max()) for a, b in zip(initial, model.get_weights()))))


if __name__ == "__main__":
    mode, target = sys.argv[1], sys.argv[2]
    {"mirrored": run_mirrored, "worker": run_worker}[mode](target)
