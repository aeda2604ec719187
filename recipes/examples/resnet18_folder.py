"""The packaged ResNet-18 on a folder of images, augmented as CIFAR's training is.

    scripts/make-image-folder images        # MNIST as 70,000 PNG files; or a folder of yours
    HVD_TRAIN_IMAGES=images horovodrun -np 2 python -m hvd_train \
        --recipe recipes/examples/resnet18_folder.py      # --framework tensorflow too

The folder holds `train/<class>/*.png|jpg` and `test/<class>/*` ($HVD_TRAIN_IMAGES, default
`images` in the working directory). The data workers read and decode each batch while the step
runs, resize every image to the network's 32x32 RGB, and augment the training images: a random
crop from 4 pixels of zero padding and a random horizontal flip (each example's draw comes from
the seed, the epoch and its index, so a resumed run sees the same), then normalise them.
Flips suit photographs; on digits they only make the task harder.
"""

import os

from hvd_train.recipes.resnet18 import CLASSES, keras_resnet18, torch_resnet18
from hvd_train.recipes.resnet18 import recipe as packaged

from hvd_train import Data, Recipe, Schedule

recipe = Recipe(
    data=Data(
        "folder",
        path=os.environ.get("HVD_TRAIN_IMAGES", "images"),
        input_shape=(32, 32, 3),
        num_classes=CLASSES,
        resize=True,
        transforms=[
            {"type": "random_crop", "padding": 4},
            {"type": "horizontal_flip"},
            {"type": "normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
        ],
    ),
    torch_model=torch_resnet18,
    keras_model=keras_resnet18,
    optimizer=packaged.optimizer,
    schedule=Schedule(epochs=2, batch_size=32, warmup_epochs=0.1, decay="cosine"),
    description="ResNet-18 on a folder of images, cropped and flipped",
)
