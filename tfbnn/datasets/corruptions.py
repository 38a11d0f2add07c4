"""Input corruptions for covariate-shift experiments, and a sweep over their intensity.

Following Trinh et al. (2022, sec. 6 and eq. 28), an input ``x`` is corrupted with
intensity ``gamma`` (Gaussian noise) or ``p`` (salt and pepper)::

    gaussian_noise:   x' = (1 - gamma) x + gamma eps,          eps ~ N(0, 1) per element
    salt_and_pepper:  x'_j = low  with probability p / 2,
                      x'_j = high with probability p / 2,
                      x'_j = x_j  otherwise                    (eq. 28)
    token_replacement: x'_j = a uniform token id in 1..V-1 with probability p
                      (token sequences; padding, id 0, is kept)

:func:`tfbnn.evaluation.shift_sweep` applies increasing intensities to a test set
and reports, per level, accuracy and the mean total / aleatoric / epistemic
uncertainty: under a growing shift a good Bayesian model gets less accurate and
more uncertain.

Image corruptions (Hendrycks & Dietterich 2019, the CIFAR-10-C / ImageNet-C benchmark): ten
of the :data:`IMAGE_CORRUPTIONS` (noise, blur, digital) at severities 1-5, written in
TensorFlow so that they run as seeded ``tf.data`` transforms on any image dataset
(:func:`corruption_transform`), with :func:`corrupt_images` for NumPy arrays; the
``tfbnn shift-benchmark`` study sweeps them.

All randomness of the first three is NumPy's ``Generator`` seeded by ``seed`` (an int, or a
``numpy.random.Generator`` to continue a stream); the same seed gives the same
corruption.

References:
    Trinh, Heinonen, Acerbi, Kaski. Tackling Covariate Shift with Node-based
    Bayesian Neural Networks. ICML 2022 (eq. 26-28).
    Hendrycks, Dietterich. Benchmarking Neural Network Robustness to Common
    Corruptions and Perturbations. ICLR 2019.
"""

import math

import numpy as np
import tensorflow as tf

from tfbnn._internal import checks

__all__ = ["gaussian_noise", "salt_and_pepper", "token_replacement", "check_levels", "make_rng", "CORRUPTIONS", "DEFAULT_LEVELS",
           "IMAGE_CORRUPTIONS", "SEVERITY_PARAMETERS", "check_image_corruption", "corrupt_image", "corruption_transform",
           "corrupt_images", "disk_kernel", "pixelate_size"]

#: Default intensities of :func:`tfbnn.evaluation.shift_sweep` per corruption (0 = clean data).
DEFAULT_LEVELS = {
    "gaussian": (0.0, 0.2, 0.4, 0.6, 0.8),
    "salt_and_pepper": (0.0, 0.05, 0.1, 0.2, 0.3),
    "token_replacement": (0.0, 0.1, 0.25, 0.5, 0.75),
}


def make_rng(seed):
    """A NumPy Generator from an int seed (or None: OS entropy); a Generator is returned as is."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ValueError(f"Expected `seed` to be a non-negative int, a numpy Generator or None. Received: seed={seed!r}")
    return np.random.default_rng(seed)


def _check_fraction(value, name):
    return checks.number(name, value, low=0, high=1, what="in [0, 1]")


def _as_float_array(x):
    """``x`` as a float array of finite numbers (integers as float32); else a ValueError naming ``x``."""
    x = checks.finite_array("x", x)
    if x.dtype.kind == "b":
        raise ValueError(f"Expected numeric inputs `x`. Received: x of dtype {x.dtype}")
    return x if x.dtype.kind == "f" else x.astype(np.float32)


def gaussian_noise(x, gamma, seed=None):
    """Mixes the inputs with standard normal noise: ``(1 - gamma) x + gamma eps``.

    ``gamma = 0`` returns ``x`` unchanged, ``gamma = 1`` pure noise. The result is
    not clipped (inputs in [0, 1] leave that range).

    Args:
        x: array ``(N, ...)`` of inputs.
        gamma: float in [0, 1], the intensity.
        seed: int, ``numpy.random.Generator`` or None (unseeded).

    Returns:
        Array of ``x``'s shape and float dtype.

    Example:
        >>> import numpy as np, tfbnn
        >>> x = np.full((2, 3), 0.5, "float32")
        >>> float(tfbnn.datasets.corruptions.gaussian_noise(x, 0.0, seed=0)[0, 0])  # gamma = 0: unchanged
        0.5
    """
    gamma = _check_fraction(gamma, "gamma")
    x = _as_float_array(x)
    eps = make_rng(seed).standard_normal(x.shape)
    return ((1.0 - gamma) * x + gamma * eps).astype(x.dtype)


def salt_and_pepper(x, p, seed=None, low=0.0, high=1.0):
    """Sets each input element to ``low`` or ``high`` with probability ``p`` (Trinh et al. 2022, eq. 28).

    Each element is independently corrupted with probability ``p``; a corrupted
    element is ``low`` (pepper) or ``high`` (salt) with equal probability.

    Args:
        x: array ``(N, ...)`` of inputs.
        p: float in [0, 1], the probability that an element is corrupted.
        seed: int, ``numpy.random.Generator`` or None (unseeded).
        low: float, the pepper value. Default 0.
        high: float >= low, the salt value. Default 1.

    Returns:
        Array of ``x``'s shape and float dtype.

    Example:
        >>> import numpy as np, tfbnn
        >>> x = np.full((1000,), 0.5, "float32")
        >>> out = tfbnn.datasets.corruptions.salt_and_pepper(x, 1.0, seed=0)  # every element 0 or 1
        >>> bool(np.all((out == 0) | (out == 1)))
        True
    """
    p = _check_fraction(p, "p")
    low, high = checks.number("low", low), checks.number("high", high)
    if low > high:
        raise ValueError(f"Expected finite `low` <= `high`. Received: low={low!r}, high={high!r}")
    x = _as_float_array(x)
    rng = make_rng(seed)
    corrupt = rng.random(x.shape) < p
    salt = rng.random(x.shape) < 0.5
    return np.where(corrupt, np.where(salt, high, low), x).astype(x.dtype)


def token_replacement(x, p, seed=None, vocab_size=None):
    """Replaces each token id with a uniformly random one with probability ``p``: a shift for text models.

    Integer token sequences cannot take additive noise (a Gaussian shift leaves the
    vocabulary); instead each non-padding token (id != 0) becomes, with probability
    ``p``, a token id drawn uniformly from ``1 .. vocab_size - 1``. ``p = 1`` leaves
    no word of the review: its label is then unpredictable.

    Args:
        x: int array ``(N, length)`` of token ids, 0 the padding.
        p: float in [0, 1], the probability that a token is replaced.
        seed: int, ``numpy.random.Generator`` or None (unseeded).
        vocab_size: int >= 2 or None: the token ids are ``0 .. vocab_size - 1``;
            None: ``x.max() + 1``.

    Returns:
        Array of ``x``'s shape and dtype.

    Example:
        >>> import numpy as np, tfbnn
        >>> x = np.array([[5, 7, 9, 0, 0]])
        >>> out = tfbnn.datasets.corruptions.token_replacement(x, 1.0, seed=0, vocab_size=100)
        >>> out.dtype == x.dtype, bool(np.all(out[:, 3:] == 0)), bool(np.all(out[:, :3] >= 1))
        (True, True, True)
    """
    p = _check_fraction(p, "p")
    x = checks.array("x", x)
    if x.dtype.kind not in "iu":
        raise ValueError(f"Expected integer token ids `x`. Received: x of dtype {x.dtype}")
    if vocab_size is None:
        vocab_size = int(x.max()) + 1 if x.size else 2
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 2:
        raise ValueError(f"Expected `vocab_size` to be an integer >= 2. Received: vocab_size={vocab_size!r}")
    rng = make_rng(seed)
    replace = (rng.random(x.shape) < p) & (x != 0)
    return np.where(replace, rng.integers(1, max(2, vocab_size), size=x.shape), x).astype(x.dtype)


CORRUPTIONS = {"gaussian": gaussian_noise, "salt_and_pepper": salt_and_pepper, "token_replacement": token_replacement}


def check_levels(corruption, levels=None):
    """The intensities of a sweep of ``corruption``, checked (default :data:`DEFAULT_LEVELS`).

    Raises:
        ValueError: an unknown corruption, no level, or a level outside [0, 1]
            (named ``gamma`` for Gaussian noise, ``p`` for salt and pepper).
    """
    if not isinstance(corruption, str) or corruption not in CORRUPTIONS:
        raise ValueError(f"Unknown corruption. Expected one of {list(CORRUPTIONS)}. Received: corruption={corruption!r}")
    if levels is None:
        return DEFAULT_LEVELS[corruption]
    values = checks.array("levels", levels).reshape(-1) if not isinstance(levels, (list, tuple)) else levels
    if isinstance(levels, str) or not len(values):
        raise ValueError(f"Expected at least one level. Received: levels={levels!r}")
    name = "gamma" if corruption == "gaussian" else "p"
    try:
        return tuple(_check_fraction(level, name) for level in values)
    except ValueError as e:
        raise ValueError(f"Expected `levels` to be intensities in [0, 1] ({e}). Received: levels={levels!r}") from None


# -- image corruptions (Hendrycks & Dietterich 2019) ------------------------------------------------

#: The image corruptions of :func:`corrupt_image`, :func:`corruption_transform` and :func:`corrupt_images`.
IMAGE_CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "motion_blur", "zoom_blur",
                     "contrast", "brightness", "pixelate", "jpeg_compression")

#: Per corruption, its parameter at severities 1..5: the CIFAR-10-C tables of Hendrycks & Dietterich
#: (2019, ``make_cifar_c.py``), for images in [0, 1]. Pixel sizes (blur radii, sigmas) hold for images of
#: up to 32 pixels a side and grow with the side beyond (:func:`_pixel_scale`).
SEVERITY_PARAMETERS = {
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),  # noise std
    "shot_noise": (500.0, 250.0, 100.0, 75.0, 50.0),  # photons at intensity 1
    "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),  # fraction of salt-and-pepper elements
    "defocus_blur": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1)),  # (disk radius, alias sigma)
    "motion_blur": ((10, 1.0), (10, 1.5), (10, 2.0), (10, 2.5), (12, 3.0)),  # (radius, sigma)
    "zoom_blur": tuple(tuple(round(1.0 + 0.01 * i, 2) for i in range(n)) for n in (6, 11, 16, 21, 26)),  # zooms
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),  # contrast factor
    "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),  # added to the HSV value
    "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),  # side of the coarse image / side
    "jpeg_compression": (80, 65, 58, 50, 40),  # JPEG quality
}


def check_image_corruption(name, severity):
    """``(name, severity)`` checked: ``name`` one of :data:`IMAGE_CORRUPTIONS`, ``severity`` an int in 1..5.

    Raises:
        ValueError: an unknown name (the known ones listed) or a severity outside 1..5.
    """
    if not isinstance(name, str) or name not in IMAGE_CORRUPTIONS:
        raise ValueError(f"Unknown corruption. Expected one of {list(IMAGE_CORRUPTIONS)}. Received: name={name!r}")
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or not 1 <= severity <= 5:
        raise ValueError(f"Expected `severity` to be an integer in 1..5. Received: severity={severity!r}")
    return name, int(severity)


def _pixel_scale(height, width):
    """Factor of the CIFAR-10-C pixel sizes for an image: 1 up to 32 pixels a side, ``side / 32`` beyond
    (ImageNet-C's radii are about 7 times CIFAR-10-C's at 224 pixels). Smaller images (the 8x8 digits) keep the
    CIFAR pixel sizes: relative to the image the blur is then stronger."""
    return max(1.0, min(height, width) / 32.0)


def disk_kernel(radius, alias_blur):
    """The defocus kernel: a normalized disk of ``radius`` pixels smoothed by a 3x3 Gaussian of std ``alias_blur``.

    As ImageNet-C's ``disk``: ``1[x^2 + y^2 <= r^2]`` on an integer grid, divided by its sum, then a
    3x3 Gaussian blur (border reflected) against aliasing; trimmed to its non-zero support.

    Returns:
        float64 array ``(k, k)``, ``k`` odd, summing to 1.

    Example:
        >>> from tfbnn.datasets.corruptions import disk_kernel
        >>> disk_kernel(1.0, 0.2).shape, round(float(disk_kernel(1.0, 0.2).sum()), 6)
        ((5, 5), 1.0)
    """
    radius = checks.number("radius", radius, low=0)
    alias_blur = checks.number("alias_blur", alias_blur, low=0, low_open=True)
    half = int(math.ceil(radius)) + 1  # one ring more for the Gaussian
    grid = np.arange(-half, half + 1, dtype=np.float64)
    disk = (grid[:, None] ** 2 + grid[None, :] ** 2 <= radius ** 2).astype(np.float64)
    disk /= disk.sum()
    g = np.exp(-((np.arange(-1.0, 2.0) / alias_blur) ** 2) / 2.0)  # (k / s)^2: no 0 / 0 for a tiny s
    g /= g.sum()
    padded = np.pad(disk, 1, mode="reflect")
    rows = sum(g[i] * padded[i:i + disk.shape[0], :] for i in range(3))
    kernel = sum(g[j] * rows[:, j:j + disk.shape[1]] for j in range(3))
    keep = np.nonzero(kernel.sum(axis=0) > 1e-12)[0]
    trim = min(keep[0], len(kernel) - 1 - keep[-1])
    kernel = kernel[trim:len(kernel) - trim, trim:len(kernel) - trim]
    return kernel / kernel.sum()


def pixelate_size(side, severity):
    """The side of the coarse image of :func:`corrupt_image`'s ``pixelate`` for a ``side``-pixel image.

    ``round(side * c)`` (``c`` from :data:`SEVERITY_PARAMETERS`), made to fall by at least one pixel per
    severity (adapted: at 8 pixels CIFAR's factors would give 8, 7, 7, 6, 5) and to stay >= 1.

    Example:
        >>> from tfbnn.datasets.corruptions import pixelate_size
        >>> [pixelate_size(8, s) for s in range(1, 6)], [pixelate_size(32, s) for s in range(1, 6)]
        ([7, 6, 5, 4, 3], [30, 29, 27, 24, 21])
    """
    side = checks.integer("side", side, 1)
    _, severity = check_image_corruption("pixelate", severity)
    size = side
    for c in SEVERITY_PARAMETERS["pixelate"][:severity]:
        size = max(1, min(int(round(side * c)), size - 1))
    return size


def _seed_pair(seed):
    """``seed`` as the int32 pair of a stateless op; else a ValueError naming ``seed``."""
    try:
        t = tf.convert_to_tensor(seed)
    except (TypeError, ValueError, OverflowError):
        t = None
    if t is None or not t.dtype.is_integer or (t.shape.is_fully_defined() and t.shape.num_elements() != 2):
        raise ValueError(f"Expected `seed` to be a pair of integers (a stateless seed, shape (2,)). Received: "
                         f"seed={seed!r}")
    return tf.cast(tf.reshape(t, [2]), tf.int32)


def _conv(image, kernel):
    """``image (h, w, c)`` cross-correlated with the 2-D ``kernel (k, k)`` per channel, borders reflected."""
    k = kernel.shape[0] // 2
    c = image.shape[-1]
    padded = tf.pad(image[None], [[0, 0], [k, k], [k, k], [0, 0]], mode="REFLECT")
    filters = tf.tile(tf.cast(kernel, image.dtype)[:, :, None, None], [1, 1, c, 1])
    return tf.nn.depthwise_conv2d(padded, filters, [1, 1, 1, 1], "VALID")[0]


def _motion_kernel(radius, sigma, angle):
    """A one-sided Gaussian-weighted line of ``radius + 1`` taps at ``angle`` (radians), bilinearly splatted on
    a ``(2 radius + 1)^2`` grid: ImageMagick's motion blur, as ImageNet-C uses it."""
    taps = tf.range(radius + 1, dtype=tf.float32)
    weights = tf.exp(-taps ** 2 / (2.0 * sigma ** 2))
    dy, dx = taps * tf.sin(angle), taps * tf.cos(angle)
    grid = tf.range(-radius, radius + 1, dtype=tf.float32)
    wy = tf.nn.relu(1.0 - tf.abs(grid[None, :] - dy[:, None]))  # (taps, grid)
    wx = tf.nn.relu(1.0 - tf.abs(grid[None, :] - dx[:, None]))
    kernel = tf.einsum("t,ti,tj->ij", weights, wy, wx)
    return kernel / tf.reduce_sum(kernel)


def corrupt_image(image, name, severity, seed):
    """One image corrupted by ``name`` at ``severity`` (Hendrycks & Dietterich 2019), in TensorFlow.

    ``image`` is float in [0, 1], ``(h, w, c)`` with ``c`` 1 or 3. With ``c`` the parameter of
    the severity (:data:`SEVERITY_PARAMETERS`, CIFAR-10-C's) and the result clipped to [0, 1]:

    ==================  ===================================================================
    gaussian_noise      ``x + c eps``, ``eps ~ N(0, 1)`` per element
    shot_noise          ``Poisson(c x) / c`` per element (photon noise)
    impulse_noise       each element set to 0 or 1 (equally likely) with probability ``c``
    defocus_blur        convolution with :func:`disk_kernel` ``(r, a)``, borders reflected
    motion_blur         convolution with a Gaussian-weighted (std ``sigma``) line of ``radius``
                        taps at an angle uniform in [-45, 45] degrees (the taps capped at
                        ``side - 1``: adapted for small images)
    zoom_blur           the mean of ``x`` and its central crops zoomed by each ``z`` of ``c``
                        (bilinear) back to full size
    contrast            ``(x - m) c + m``, ``m`` the per-channel mean of the image
    brightness          HSV value ``v + c`` (grayscale: ``x + c``)
    pixelate            area-downsampled to :func:`pixelate_size` pixels a side, then nearest-
                        neighbour upsampled (blocks of pixels; ImageNet-C uses PIL's box filter)
    jpeg_compression    ``tf.io.encode_jpeg`` at quality ``c``, then decoded (8-bit)
    ==================  ===================================================================

    Blur radii and sigmas are in pixels of a 32-pixel image and scale with the side beyond 32.

    Args:
        image: float tensor ``(h, w, c)`` in [0, 1], ``c`` in {1, 3}.
        name: one of :data:`IMAGE_CORRUPTIONS`.
        severity: int in 1..5.
        seed: int tensor of shape ``(2,)``, the stateless seed of this image's randomness.

    Returns:
        float32 tensor of ``image``'s shape in [0, 1].

    Example:
        >>> import tensorflow as tf
        >>> from tfbnn.datasets.corruptions import corrupt_image
        >>> out = corrupt_image(tf.fill([8, 8, 1], 0.5), "contrast", 5, seed=[0, 0])
        >>> out.shape, float(tf.reduce_max(tf.abs(out - 0.5)))      # a flat image has no contrast to lose
        (TensorShape([8, 8, 1]), 0.0)

    Reference:
        Hendrycks, Dietterich. Benchmarking Neural Network Robustness to Common Corruptions
        and Perturbations. ICLR 2019 (sec. 3, appendix; ``make_cifar_c.py``).
    """
    name, severity = check_image_corruption(name, severity)
    c = SEVERITY_PARAMETERS[name][severity - 1]
    x = tf.cast(checks.float_tensor("image", image), tf.float32)
    if x.shape.rank != 3 or x.shape[-1] not in (1, 3):
        raise ValueError(f"Expected an image of shape (h, w, 1 or 3). Received: image.shape={x.shape}")
    seed = _seed_pair(seed)
    h, w = x.shape[0], x.shape[1]
    scale = _pixel_scale(h, w) if h is not None and w is not None else 1.0
    if name == "gaussian_noise":
        out = x + c * tf.random.stateless_normal(tf.shape(x), seed)
    elif name == "shot_noise":
        out = tf.random.stateless_poisson(tf.shape(x), seed, x * c, dtype=tf.float32) / c
    elif name == "impulse_noise":
        u = tf.random.stateless_uniform(tf.concat([[2], tf.shape(x)], 0), seed)
        out = tf.where(u[0] < c, tf.cast(u[1] < 0.5, tf.float32), x)
    elif name == "defocus_blur":
        out = _conv(x, disk_kernel(c[0] * scale, c[1] * scale))
    elif name == "motion_blur":
        radius = int(min(round(c[0] * scale), min(h, w) - 1))
        angle = tf.random.stateless_uniform([], seed, -math.pi / 4, math.pi / 4)
        out = _conv(x, _motion_kernel(radius, c[1] * scale, angle))
    elif name == "zoom_blur":
        boxes = tf.constant([[0.5 - 0.5 / z, 0.5 - 0.5 / z, 0.5 + 0.5 / z, 0.5 + 0.5 / z] for z in c], tf.float32)
        zoomed = tf.image.crop_and_resize(tf.repeat(x[None], len(c), 0), boxes, tf.range(len(c)), [h, w])
        out = (x + tf.reduce_sum(zoomed, 0)) / (len(c) + 1)
    elif name == "contrast":
        mean = tf.reduce_mean(x, axis=(0, 1), keepdims=True)
        out = (x - mean) * c + mean
    elif name == "brightness":
        if x.shape[-1] == 1:
            out = x + c
        else:
            hsv = tf.image.rgb_to_hsv(x)
            out = tf.image.hsv_to_rgb(tf.concat([hsv[..., :2], tf.clip_by_value(hsv[..., 2:] + c, 0.0, 1.0)], -1))
    elif name == "pixelate":
        size = [pixelate_size(h, severity), pixelate_size(w, severity)]
        small = tf.image.resize(x, size, method="area")
        out = tf.image.resize(small, [h, w], method="nearest")
    else:  # jpeg_compression
        pixels = tf.cast(tf.round(tf.clip_by_value(x, 0.0, 1.0) * 255.0), tf.uint8)
        out = tf.cast(tf.io.decode_jpeg(tf.io.encode_jpeg(pixels, quality=c), channels=x.shape[-1]), tf.float32) / 255.0
    return tf.clip_by_value(tf.reshape(out, tf.shape(x)), 0.0, 1.0)


def _example_seed(seed, name, index):
    """The stateless seed of example ``index``: the corruption's stream of ``seed``, folded with the index."""
    base = tf.constant([seed, IMAGE_CORRUPTIONS.index(name)], tf.int64)
    return tf.random.experimental.stateless_fold_in(base, tf.cast(index, tf.int64))


def corruption_transform(name, severity, seed=0):
    """A seeded ``tf.data`` transform corrupting each image by ``name`` at ``severity``.

    Map it over an **enumerated** dataset: ``dataset.enumerate().map(corruption_transform(...))``.
    Example ``i``'s randomness (noise, motion angle) is drawn from a stateless seed derived from
    ``seed``, the corruption and ``i`` alone: the same seed corrupts the same dataset identically, in
    any order and under parallel ``map``; another seed differently. The transform takes
    ``(index, element)`` and returns the element without the index; ``element`` is an image
    ``(h, w, c)``, a tuple ``(image, label, ...)`` (the first item corrupted) or a dict with an
    ``"image"`` key. See :func:`corrupt_image` for the corruptions.

    Args:
        name: one of :data:`IMAGE_CORRUPTIONS`.
        severity: int in 1..5.
        seed: int >= 0. Default 0.

    Returns:
        A function ``(index, element) -> element``.

    Raises:
        ValueError: an unknown name (the known ones listed), a severity outside 1..5 or a bad seed.

    Example:
        >>> import numpy as np, tensorflow as tf
        >>> from tfbnn.datasets.corruptions import corruption_transform
        >>> images = np.full((4, 8, 8, 1), 0.5, "float32")
        >>> ds = tf.data.Dataset.from_tensor_slices((images, np.arange(4)))
        >>> noisy = ds.enumerate().map(corruption_transform("gaussian_noise", 3, seed=1))
        >>> image, label = next(iter(noisy))
        >>> image.shape, int(label), bool(tf.reduce_any(image != 0.5))
        (TensorShape([8, 8, 1]), 0, True)
    """
    name, severity = check_image_corruption(name, severity)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"Expected `seed` to be a non-negative int. Received: seed={seed!r}")
    seed = int(seed)

    def transform(index, element):
        example_seed = _example_seed(seed, name, index)
        if isinstance(element, dict):
            return {**element, "image": corrupt_image(element["image"], name, severity, example_seed)}
        if isinstance(element, tuple):
            return (corrupt_image(element[0], name, severity, example_seed),) + tuple(element[1:])
        return corrupt_image(element, name, severity, example_seed)

    return transform


def corrupt_images(x, name, severity, seed=0, batch_size=256):
    """NumPy entry point: the images ``x`` corrupted by ``name`` at ``severity`` (as :func:`corruption_transform`).

    Image ``i`` gets the same corruption as element ``i`` of an enumerated ``tf.data`` dataset of ``x``
    under :func:`corruption_transform` with the same seed.

    Args:
        x: float array ``(n, h, w, c)`` in [0, 1], ``c`` in {1, 3}.
        name: one of :data:`IMAGE_CORRUPTIONS`.
        severity: int in 1..5.
        seed: int >= 0. Default 0.
        batch_size: int >= 1, images per batch of the pipeline. Default 256.

    Returns:
        float32 array of ``x``'s shape in [0, 1].

    Example:
        >>> import numpy as np
        >>> from tfbnn.datasets.corruptions import corrupt_images
        >>> x = np.random.default_rng(0).uniform(size=(2, 8, 8, 1)).astype("float32")
        >>> out = corrupt_images(x, "pixelate", 4)     # 2x2 blocks on an 8x8 image
        >>> out.shape, bool(np.all(out[:, ::2, ::2] == out[:, 1::2, 1::2]))
        ((2, 8, 8, 1), True)
    """
    transform = corruption_transform(name, severity, seed)
    batch_size = checks.integer("batch_size", batch_size, 1)
    x = _as_float_array(x)
    if x.ndim != 4 or x.shape[-1] not in (1, 3) or 0 in x.shape:
        raise ValueError(f"Expected images `x` of shape (n, h, w, 1 or 3). Received: x.shape={x.shape}")
    if not np.all(np.isfinite(x)) or x.min() < 0.0 or x.max() > 1.0:
        raise ValueError(f"Expected images `x` with values in [0, 1]. Received: x in [{np.nanmin(x)}, {np.nanmax(x)}]")
    ds = tf.data.Dataset.from_tensor_slices(x.astype(np.float32)).enumerate().map(transform).batch(batch_size)
    return np.concatenate([b.numpy() for b in ds], axis=0)
