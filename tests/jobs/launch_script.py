"""A user's script calling hvd_train.launch at its top level, with no `if __name__ ==
"__main__":` guard, as a user pastes an example, with a recipe made in the script itself.
usage: launch_script.py CASE OUTPUT_DIR

CASE: `trains`, `usage` (a mistake in the options, refused before any rank starts) or
`rank-failure` (a mistake only the ranks find: a data folder that is not there).
Prints `SUMMARY {...}`, or `RAISED <type>: <message>`.
"""

import json
import sys

import numpy as np

import hvd_train


def sign_of_the_first_feature():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return (x[:1600], y[:1600]), (x[1600:], y[1600:])


def linear():
    from torch import nn

    return nn.Linear(8, 2)


recipe = hvd_train.Recipe(
    data=sign_of_the_first_feature,
    torch_model=linear,
    optimizer=hvd_train.Optimizer(learning_rate=0.01),
)
case, output_dir = sys.argv[1:3]
if case == "trains":  # as a user writes it: no try, which would hide a failure of the script
    summary = hvd_train.launch(recipe, np=2, framework="torch", output_dir=output_dir, epochs=2)
    print("SUMMARY " + json.dumps(summary))
else:
    chosen, keywords = {
        "usage": (recipe, {"epochs": 0}),
        "rank-failure": ("mnist_cnn", {"data_dir": f"{output_dir}/no-such-folder"}),
    }[case]
    try:
        hvd_train.launch(chosen, np=2, framework="torch", output_dir=output_dir, **keywords)
    except Exception as error:
        print(f"RAISED {type(error).__name__}: {error}")
