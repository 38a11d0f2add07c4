"""`import tfbnn` (and the `tfbnn` command) choose TensorFlow's pooled CPU allocator unless the user chose."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# After the import: the variable's value, and whether TensorFlow's CPU allocator keeps statistics, which the
# pooled allocators do (BFC; oneDNN's) and plain malloc, the Eigen path's default, does not.
_PROBE = """
import json, os, sys
{start}
import tensorflow as tf
tf.reduce_sum(tf.fill([256, 256], 1.0))
try:
    pooled = tf.config.experimental.get_memory_info("CPU:0")["peak"] > 0
except ValueError as error:
    pooled = str(error)
print(json.dumps({{"value": os.environ.get("TF_CPU_ALLOCATOR_USE_BFC"), "pooled": pooled}}))
"""
_STARTS = {
    "library": "import tfbnn",
    # the command: its entry module registers the package, then imports TensorFlow quietly and runs __init__
    "command": "import _tfbnn_command\nfrom tfbnn._internal import startup\nstartup.complete_package_import()",
}


def _probe(start, value):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    env.update({"PYTHONPATH": ROOT, "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "3"})
    if value is not None:
        env["TF_CPU_ALLOCATOR_USE_BFC"] = value
    result = subprocess.run([sys.executable, "-c", _PROBE.format(start=_STARTS[start])], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_import_chooses_the_pooled_allocator_on_the_eigen_path_unless_the_user_chose():
    assert _probe("library", None) == {"value": "true", "pooled": True}
    assert _probe("command", None) == {"value": "true", "pooled": True}
    # A value the user set is kept, and TensorFlow honours it: plain malloc, no allocator statistics.
    kept = _probe("library", "false")
    assert kept["value"] == "false" and "not available" in kept["pooled"], kept
