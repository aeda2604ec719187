"""Under TensorFlow, each variable's update in a step's graph waits for its own gradient only, not
for every gradient (as Keras's sum over tf.distribute's replicas made it): so a bucket's update,
and, sharded, its allgather, need not wait for the last bucket's average."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.tensorflow

CODE = """
import keras
import tensorflow as tf
from hvd_train.distributed.tensorflow.exchange import GroupedExchange, distribute

variables = [keras.Variable(tf.ones([3])), keras.Variable(tf.ones([4]))]
optimizer = keras.optimizers.Adam(0.1)
optimizer.build(variables)
distribute(optimizer, GroupedExchange(variables, "none", 1, True, 0.0, 1))

def step(first, second):
    optimizer.apply_own([first, second], variables)

specs = [tf.TensorSpec([3]), tf.TensorSpec([4])]
graph = tf.function(step).get_concrete_function(*specs).graph

def gradients_before(op):
    seen, waiting = set(), [op]
    while waiting:
        current = waiting.pop()
        for before in [*(tensor.op for tensor in current.inputs), *current.control_inputs]:
            if before not in seen:
                seen.add(before)
                waiting.append(before)
    return tuple(sorted(o.name for o in seen if o.name in ("first", "second")))

writes = [op for op in graph.get_operations()
          if op.type in ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")]
print("WAITS", sorted({gradients_before(op) for op in writes}))
"""


def test_each_variable_s_update_waits_for_its_own_gradient_only():
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    # The moments and the variable of each: their own gradient; the step count: none.
    assert "WAITS [(), ('first',), ('second',)]" in result.stdout
