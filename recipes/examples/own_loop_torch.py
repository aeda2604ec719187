"""Horovod's examples/pytorch/pytorch_mnist.py (v0.28.1), ported to hvd_train's own-loop layer:
the same loop, written by hand as there, with hvd_train's data reading, checkpoints and exact
resume. `recipe` names the model and the data for `hvd-train eval`. The network is Horovod's
with mnist_cnn's widths (32 and 64 filters, 128 units), and SGD's momentum 0.9: Horovod's
widths (10, 20, 50) and momentum (0.5) reach about 98% after two epochs at best.

    horovodrun -np 2 python recipes/examples/own_loop_torch.py --epochs 2 --output-dir runs/own
    python recipes/examples/own_loop_torch.py --np 2 --epochs 3 --output-dir runs/own --resume
    hvd-train eval --checkpoint runs/own
"""

import argparse
from itertools import islice
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from hvd_train import Data, Distributed, Recipe, launch
from hvd_train.errors import UsageError

HERE = str(Path(__file__).resolve())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, kernel_size=5)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(1024, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(F.dropout(x, training=self.training)), dim=1)


recipe = Recipe(data=Data("mnist"), torch_model=Net, loss=F.nll_loss, metrics=("accuracy",))


def test(dist, model, batches):
    """The test set's loss and accuracy, each example counted once across the ranks."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for data, target in batches:
            output = model(data)
            sums += torch.tensor([F.nll_loss(output, target, reduction="sum"),
                                  (output.argmax(1) == target).sum(), len(target)])  # fmt: skip
    loss, correct, count = dist.all_reduce(sums, op="sum").tolist()
    return loss / count, correct / count


def main(epochs=2, output_dir="runs/own-loop-torch", resume=False, batch_size=64, lr=0.01,
         momentum=0.9, seed=42, fp16_allreduce=False, log_interval=100, data_dir=None,
         limit_steps=None):  # fmt: skip
    dist = Distributed("torch")
    torch.manual_seed(seed)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model, optimizer = dist.setup(model, optimizer, scale_learning_rate="linear",
                                  compression="fp16" if fp16_allreduce else "none")  # fmt: skip
    mnist = Data("mnist").load(data_dir)
    train = dist.loader(mnist.train, batch_size, seed=seed)
    test_batches = dist.loader(mnist.test, 1000, shuffle=False)
    first, accuracy = 0, None
    if resume:
        saved = dist.load(output_dir)
        if saved is None:
            raise UsageError(f"--resume: {output_dir} holds no checkpoint; leave --resume out")
        first = saved["epoch"]
    for epoch in range(first, epochs):
        model.train()
        train.set_epoch(epoch)
        for index, (data, target) in enumerate(islice(train, limit_steps)):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            dist.backward(loss)
            optimizer.step()
            if index % log_interval == 0:
                dist.print(f"epoch {epoch + 1}: step {index}/{len(train)}, loss {loss.item():.4f}")
        dist.save(output_dir, {"model": model, "optimizer": optimizer, "epoch": epoch + 1},
                  recipe=HERE)  # fmt: skip
        test_loss, accuracy = test(dist, model, test_batches)
        dist.print(f"epoch {epoch + 1}: test loss {test_loss:.4f}, accuracy {accuracy:.2%}")
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--output-dir", default="runs/own-loop-torch")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01, help="for one process; times the ranks")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fp16-allreduce", action="store_true")
    parser.add_argument("--data-dir", help="the four MNIST files (default: the cache)")
    parser.add_argument("--limit-steps", type=int, help="batches per epoch (default: all)")
    parser.add_argument("--np", type=int, help="start this many ranks here with hvd_train.launch")
    options = vars(parser.parse_args())
    if options["limit_steps"] is not None and options["limit_steps"] < 1:
        parser.error("--limit-steps: give a positive number of batches an epoch")
    ranks = options.pop("np")
    if ranks:
        launch(main, np=ranks, **options)
    else:
        main(**options)
