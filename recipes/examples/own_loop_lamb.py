"""A loop of one's own in the style of a large-batch training script, under torch: LAMB with its
parameter groups, a one-cycle learning rate from torch's own scheduler (made before `setup`, as
scripts make it), gradients added up over two batches a step (`no_sync`) and sent as bfloat16,
clipped after averaging. The model and LAMB are ported_script.py's, the same kind of script
ported to a recipe.

    horovodrun -np 2 python recipes/examples/own_loop_lamb.py --epochs 2
"""

import argparse
import contextlib
from pathlib import Path

import torch
import torch.nn.functional as F

from hvd_train import Data, Distributed
from hvd_train.recipe import load_recipe

PORTED = load_recipe(str(Path(__file__).with_name("ported_script.py")))


def main(epochs=2, accumulate=2, batch_size=32, limit_steps=None, seed=42, data_dir=None):
    dist = Distributed("torch")
    torch.manual_seed(seed)
    model = PORTED.torch_model()
    optimizer = PORTED.optimizer.function(model)  # LAMB, weight decay on the matrices only
    mnist = Data("mnist").load(data_dir)
    train = dist.loader(mnist.train, batch_size, seed=seed)
    batches = min(len(train), limit_steps or len(train))
    peaks = [group["lr"] * dist.world_size for group in optimizer.param_groups]
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=peaks, total_steps=epochs * (batches // accumulate), pct_start=0.25
    )
    model, optimizer = dist.setup(model, optimizer, compression="bf16", gradient_clip_norm=1.0)
    for epoch in range(epochs):
        model.train()
        train.set_epoch(epoch)
        for index, (images, labels) in zip(range(batches), train, strict=False):
            stepping = (index + 1) % accumulate == 0
            with contextlib.nullcontext() if stepping else dist.no_sync():
                dist.backward(F.cross_entropy(model(images), labels) / accumulate)
            if stepping:
                optimizer.step()
                schedule.step()
                optimizer.zero_grad()
        dist.print(f"epoch {epoch + 1}: learning rate {schedule.get_last_lr()[0]:.2e}")
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for images, labels in dist.loader(mnist.test, 1000, shuffle=False):
            counts += torch.tensor([(model(images).argmax(1) == labels).sum(), len(labels)])
    correct, count = dist.all_reduce(counts, op="sum").tolist()
    dist.print(f"test accuracy {correct / count:.2%}")
    return correct / count


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--limit-steps", type=int, help="batches per epoch (default: all)")
    parser.add_argument("--data-dir", help="the four MNIST files (default: the cache)")
    options = vars(parser.parse_args())
    if options["limit_steps"] is not None and options["limit_steps"] < 1:
        parser.error("--limit-steps: give a positive number of batches an epoch")
    main(**options)
