"""Per-example transforms: each example's numbers come from (seed, epoch, its index), so it is
augmented alike in any batch, at any world size and with any workers; evaluation takes the
deterministic ones only; every mistake in the list is one line naming the entry."""

import numpy as np
import pytest

from hvd_train.data import take
from hvd_train.data.order import epoch_order, rank_steps
from hvd_train.data.pipeline import augmentation, read_ahead
from hvd_train.data.transforms import apply, parse_transforms
from hvd_train.errors import UsageError
from hvd_train.recipe import Data, Recipe, load_data

CROP_FLIP_NORMALIZE = [
    {"type": "random_crop", "padding": 2},
    {"type": "horizontal_flip"},
    {"type": "normalize", "mean": [0.5, 0.25], "std": [2, 4]},
]


def images(count: int) -> np.ndarray:
    return np.random.default_rng(0).random((count, 6, 5, 2), dtype=np.float32)


def test_an_example_is_augmented_alike_in_any_batch_and_differently_each_epoch():
    training = parse_transforms(CROP_FLIP_NORMALIZE).training
    x = images(8)
    indices = np.arange(100, 108)
    whole = apply(training, x, indices, seed=1, epoch=3)
    # The examples split as two ranks at np=2 (or four, or one) would take them.
    for part in (slice(0, 8, 2), slice(1, 8, 2), slice(5, 6)):
        np.testing.assert_array_equal(
            apply(training, x[part], indices[part], seed=1, epoch=3), whole[part]
        )
    assert not np.array_equal(apply(training, x, indices, seed=1, epoch=4), whole)
    assert not np.array_equal(apply(training, x, indices, seed=2, epoch=3), whole)
    assert whole.shape == x.shape and whole.dtype == np.float32


def test_crop_shifts_within_the_padding_flip_mirrors_and_normalize_scales():
    x = images(1)[0]
    crop = parse_transforms([{"type": "random_crop", "padding": 1}]).training[0]
    shifted = [crop(x, np.random.default_rng(seed)) for seed in range(20)]
    padded = np.pad(x, ((1, 1), (1, 1), (0, 0)))
    for y in shifted:
        assert any(
            np.array_equal(y, padded[t : t + 6, c : c + 5]) for t in range(3) for c in range(3)
        )
    assert len({y.tobytes() for y in shifted}) > 3
    always = parse_transforms([{"type": "horizontal_flip", "probability": 1}]).training[0]
    np.testing.assert_array_equal(always(x, np.random.default_rng(0)), x[:, ::-1])
    scale = parse_transforms([CROP_FLIP_NORMALIZE[2]]).training[0]
    np.testing.assert_allclose(scale(x, None), (x - [0.5, 0.25]) / [2, 4], rtol=1e-6)


def test_workers_augment_exactly_what_the_step_would():
    x = images(64)
    dataset = type("Arrays", (), {"__len__": lambda self: 64,
                                   "__getitem__": lambda self, i: (x[i], i % 3)})()  # fmt: skip
    steps = rank_steps(epoch_order(64, 0, 0), 0, 2, 4, 1)
    augment = augmentation(parse_transforms(CROP_FLIP_NORMALIZE), seed=5, epoch=0)
    alone = list(read_ahead(dataset, steps, 0, 2, augment))
    ahead = list(read_ahead(dataset, steps, 3, 2, augment))
    for (a,), (b,) in zip(alone, ahead, strict=True):
        np.testing.assert_array_equal(a[0], b[0])


def test_deterministic_transforms_draw_no_numbers(monkeypatch):
    # An example's generator costs more than normalising it: only random transforms get one.
    drawn = []

    def example_rng(*key):
        drawn.append(key)
        return np.random.default_rng(key)

    monkeypatch.setattr("hvd_train.data.transforms.example_rng", example_rng)
    normalize = parse_transforms(CROP_FLIP_NORMALIZE[2:])
    augment = augmentation(normalize, seed=5, epoch=0)
    x = images(4)
    np.testing.assert_allclose(augment(x, np.arange(4)), (x - [0.5, 0.25]) / [2, 4], rtol=1e-6)
    assert drawn == []
    augmentation(parse_transforms(CROP_FLIP_NORMALIZE[1:]), seed=5, epoch=0)(x, np.arange(4))
    assert len(drawn) == 4


def test_evaluation_takes_the_deterministic_transforms_only():
    data = Data("synthetic", input_shape=(6, 5, 2), train_samples=8, test_samples=8,
                transforms=CROP_FLIP_NORMALIZE)  # fmt: skip
    recipe = Recipe(data=data, torch_model=lambda: None)
    untransformed = Data("synthetic", input_shape=(6, 5, 2), train_samples=8, test_samples=8)
    plain = load_data(Recipe(data=untransformed, torch_model=lambda: None), None)
    splits = load_data(recipe, None)
    everything = np.arange(8)
    np.testing.assert_array_equal(take(splits.train, everything)[0],
                                  take(plain.train, everything)[0])  # fmt: skip
    np.testing.assert_allclose(take(splits.test, everything)[0],
                               (take(plain.test, everything)[0] - [0.5, 0.25]) / [2, 4],
                               rtol=1e-6)  # fmt: skip


def test_a_python_recipes_transform_trains_and_evaluation_leaves_it_out():
    def mine(x, rng):
        return x + rng.random()

    recipe = Recipe(data=lambda: None, torch_model=lambda: None, transform=mine)
    assert recipe.transforms().training == (mine,) and recipe.transforms().evaluation == ()
    with pytest.raises(UsageError, match="^transform: expected a function"):
        Recipe(data=lambda: None, torch_model=lambda: None, transform=3)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"type": "rotate"}, r"data.transforms\[0\]: expected a table with type = one of "),
        ({"type": "random_crop"}, r"data.transforms\[0\]: random_crop takes padding; got"),
        ({"type": "random_crop", "padding": 0},
         r"data.transforms\[0\].padding: expected a positive integer, got 0"),
        ({"type": "horizontal_flip", "probability": 2},
         r"data.transforms\[0\]: probability 2.0 is above 1"),
        ({"type": "normalize", "mean": [0.5], "std": [0]},
         r"data.transforms\[0\]: give mean and std as lists of one number per channel"),
        ({"type": "normalize", "mean": "0.5", "std": [1]},
         r"data.transforms\[0\].mean: expected a list of numbers, one per channel"),
    ],
)  # fmt: skip
def test_a_mistake_in_the_list_is_one_line_naming_the_entry(entry, message):
    with pytest.raises(UsageError, match="^" + message):
        Data("synthetic", transforms=[entry])


def test_resize_gives_every_channel_the_new_size():
    resize = parse_transforms([{"type": "resize", "height": 3, "width": 4}]).evaluation[0]
    x = np.stack([np.full((6, 5), 0.25, np.float32), np.full((6, 5), 0.75, np.float32)], -1)
    y = resize(x, None)
    assert y.shape == (3, 4, 2)
    np.testing.assert_allclose(y, np.stack([np.full((3, 4), 0.25), np.full((3, 4), 0.75)], -1))


def test_deterministic_transforms_take_the_batch_whole_as_they_would_each_example():
    transforms = parse_transforms(
        [{"type": "resize", "height": 3, "width": 4}, *CROP_FLIP_NORMALIZE[2:]]
    ).evaluation
    x, indices = images(5), np.arange(5)
    whole = apply(transforms, x, indices, seed=0, epoch=0, random=False)
    each = apply(transforms, x, indices, seed=0, epoch=0)
    assert whole.shape == (5, 3, 4, 2) and whole.dtype == np.float32
    np.testing.assert_array_equal(whole, each)
