import re

import pytest

from hvd_train.errors import UsageError
from hvd_train.recipe import settings
from hvd_train.recipe.settings import READ_ONLY_WHEN

# For each key READ_ONLY_WHEN lists: a value other than its default, the table's other values
# under which something reads it, and those under which nothing does.
EXAMPLES = {
    ("Optimizer", "momentum"): (0.9, {"name": "rmsprop"}, {"name": "adamw"}),
    ("Optimizer", "nesterov"): (True, {"name": "sgd", "momentum": 0.9},
                                {"name": "rmsprop", "momentum": 0.9}),
    ("Optimizer", "weight_decay_exclude"): (["bias"], {"weight_decay": 0.01}, {}),
    ("Loading", "prefetch"): (4, {}, {"workers": 0}),
    ("Loading", "timeout"): (60.0, {"workers": 2}, {"workers": 0}),
    ("Checkpoints", "monitor"): ("val_accuracy", {"keep_best": 2}, {}),
    ("Checkpoints", "mode"): ("max", {"keep_best": 1}, {}),
}  # fmt: skip
ENTRIES = [(table, key) for table, keys in READ_ONLY_WHEN.items() for key in keys]


def test_every_key_the_table_lists_has_an_example():
    assert sorted(EXAMPLES) == sorted(ENTRIES)


@pytest.mark.parametrize(("table", "key"), ENTRIES)
def test_a_setting_nothing_chosen_reads_is_refused_naming_what_reads_it(table, key):
    cls, (value, read, unread) = getattr(settings, table), EXAMPLES[table, key]
    assert getattr(cls(**read, **{key: value}), key) == (
        tuple(value) if isinstance(value, list) else value
    )
    reader = READ_ONLY_WHEN[table][key].reader
    message = f"{cls.section}.{key}: set, but nothing chosen reads it (only {reader} does)"
    with pytest.raises(UsageError, match="^" + re.escape(message)):
        cls(**unread, **{key: value})
    cls(**unread)  # the key left at its default is no mistake
