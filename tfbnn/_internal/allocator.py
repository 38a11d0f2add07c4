"""TensorFlow's pooled CPU allocator where the user has not chosen one (no TensorFlow import here).

On the Eigen kernel path (``TF_ENABLE_ONEDNN_OPTS=0``, and TensorFlow's default on ARM) TensorFlow's
CPU allocator is plain ``malloc``: glibc serves each large tensor (a weight-sized temporary, a batch of
activations) with a fresh ``mmap`` and unmaps it when freed, so every train step faults in its large
temporaries' pages again. With oneDNN (the default on x86-64) TensorFlow pools CPU memory instead.
``TF_CPU_ALLOCATOR_USE_BFC=true`` makes TensorFlow pool on every path (its best-fit-with-coalescing
allocator, the one it uses for GPU memory): measured on the 784-1200-1200-10 local-reparameterization
MLP (batch 128, 2 AMD EPYC cores, Eigen path), a train step took 28.3 against 25.9 ms without XLA and
44.1 against 24.3 ms with XLA, with 2.1 million against 0.3 million page faults in a short run; on the
oneDNN path it changes nothing measurable (``benchmarks/dense_floors.py``; benchmarks/README.md, "How
close the dense estimators come to their floors"). Values, seeds and results are the same either way; only where the memory comes from
changes (TensorFlow keeps freed memory for reuse instead of returning it to the system, as it does
with oneDNN).

TensorFlow reads the variable once, when it first allocates CPU memory, so setting it at
``import tfbnn`` takes effect unless the program has already run a TensorFlow op. A program that
wants ``malloc`` sets ``TF_CPU_ALLOCATOR_USE_BFC=false`` (or any value) first: a value that is set
is never changed. Processes the program starts afterwards inherit the variable, as any other.
"""

import os

#: TensorFlow's switch (tensorflow/core/common_runtime/process_state.cc, ``GetCPUAllocator``).
ENV = "TF_CPU_ALLOCATOR_USE_BFC"


def prefer_pooled_allocator():
    """Sets ``TF_CPU_ALLOCATOR_USE_BFC=true`` unless the environment sets it; returns the value in effect."""
    return os.environ.setdefault(ENV, "true")
