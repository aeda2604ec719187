"""Under TensorFlow with shard = "gradients", the backward pass makes a bucket's gradients only
once an earlier bucket has been reduce-scattered (`_hold_back`): the op that makes a later
gradient waits for the op that sends, in the traced graph; one that the sending op itself waits
for is left alone (the step would never run); eagerly, nothing is held back."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.tensorflow

CODE = """
import tensorflow as tf
from hvd_train.distributed.tensorflow.sharding import _hold_back

seen = {}

@tf.function
def step(x):
    sent_gradient = tf.square(x)          # a bucket's gradient, and the op that sends it
    sent = tf.identity(sent_gradient * 2.0)
    later = tf.matmul(x, x)               # a later bucket's, made by an op of its own
    upstream = set()
    _hold_back([later, sent_gradient], sent, upstream)
    seen["later"] = sent.op in later.op.control_inputs
    seen["upstream"] = sent.op in sent_gradient.op.control_inputs
    seen["found"] = sent_gradient.op in upstream
    return sent + later

x = tf.ones([2, 2])
print("RAN", step(x).numpy().tolist())
eager = tf.matmul(x, x)
_hold_back([eager], tf.identity(x), set())  # eagerly: made already, nothing to hold back
print("SEEN", seen)
"""


def test_a_later_gradient_waits_for_the_send_and_an_upstream_one_does_not():
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "RAN [[4.0, 4.0], [4.0, 4.0]]" in result.stdout
    assert "SEEN {'later': True, 'upstream': False, 'found': True}" in result.stdout
