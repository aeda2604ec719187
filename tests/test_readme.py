"""The README runs top to bottom as written: every command block in order, in a fresh copy of the
checkout whose set-up is done (its `.venv` is this one, so `make setup` finds nothing to do), each
in the environment the README says to activate. A Python or TOML block titled `title="x.py"` is
the file the text beside it says to write, and is written there. A block may be left out only by a
marker above it, `<!-- not run by tests/test_readme.py: why -->`; SKIPPED names each one, so that a
new one is a change here. MNIST comes from the test data (HVD_TRAIN_DATA_DIR) instead of the
download, since tests have no network."""

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from hvd_train.distributed.checkpoint_files import checkpoint_name, checkpoints
from tests.conftest import REPO

BLOCK = re.compile(
    r"(?:<!-- not run by tests/test_readme\.py: (?P<skip>[^>]*) -->\n)?"
    r'^```(?P<language>\w+)(?: title="(?P<title>[^"]+)")?\n(?P<text>.*?)^```$',
    re.DOTALL | re.MULTILINE,
)
# The blocks the README marks as not run here, by their first command, with the README's reason;
# and the one line left out of a block that runs.
SKIPPED = {
    "pip install torch==2.13.0 tensorflow-cpu==2.21.0": "another environment: make setup's own "
    "steps, which ran first",
}
SKIPPED_LINE = "make test"  # the suite this test runs in


@dataclass
class Block:
    language: str
    title: str | None
    text: str
    skip: str | None


def blocks(readme: str) -> list[Block]:
    return [Block(m["language"], m["title"], m["text"], m["skip"]) for m in BLOCK.finditer(readme)]


def first_command(block: Block) -> str:
    return block.text.splitlines()[0].split("#")[0].strip()


def test_every_block_runs_or_is_written_or_says_why_not():
    found = blocks((REPO / "README.md").read_text())
    assert {b.language for b in found} <= {"sh", "python", "toml", "text"}
    assert [b.text for b in found if b.language in ("python", "toml") and not b.title] == []
    assert {first_command(b): b.skip for b in found if b.skip} == SKIPPED


def test_the_other_environments_steps_are_make_setups():
    """The block for one's own environment is what `make setup` ran: the same packages at the
    same versions, the checkout editable, build-horovod.sh."""
    (block,) = [b for b in blocks((REPO / "README.md").read_text()) if b.skip]
    dry = subprocess.run(["make", "--dry-run", "--always-make", "setup"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    steps = [shlex.split(line) for line in dry.splitlines()]
    for line in block.text.splitlines():
        command = re.sub(r"^\w+=(\$\([^)]*\)|\S+)\s+", "", line)  # PYTHON=... aside
        words = shlex.split(command, comments=True)
        if words[:2] == ["pip", "install"]:
            wanted = {"--editable" if w == "-e" else w for w in words[2:]}
            assert any(wanted <= set(step) for step in steps if "pip" in step), line
        else:
            assert any(words[0] in step for step in steps), line


def fresh_checkout(destination: Path) -> None:
    """The checkout's files as git sees them (committed or not, ignored ones aside), with their
    times, so that make finds the copy's set-up as current as this one's."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, check=True, capture_output=True).stdout  # fmt: skip
    for name in filter(None, listed.decode().split("\0")):
        if (REPO / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, destination / name)
    (destination / ".venv").symlink_to(REPO / ".venv")


def run(block: str, cwd: Path, env: dict) -> str:
    script = "set -euo pipefail\nsource .venv/bin/activate\n" + block
    result = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=900)  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"this block failed as written:\n{block}\n{output[-4000:]}"
    return output


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_readme_runs_top_to_bottom(tmp_path, mnist_dir):
    up_to_date = subprocess.run(["make", "--question", "setup"], cwd=REPO)
    assert up_to_date.returncode == 0, "this checkout's set-up is not current: run make setup"
    checkout = tmp_path / "checkout"
    fresh_checkout(checkout)
    env = os.environ | {"HVD_TRAIN_DATA_DIR": str(mnist_dir)}
    outputs = []
    for block in blocks((REPO / "README.md").read_text()):
        if block.title:
            (checkout / block.title).write_text(block.text)
        elif block.language == "sh" and not block.skip:
            lines = [line for line in block.text.splitlines() if not line.startswith(SKIPPED_LINE)]
            outputs.append(run("\n".join(lines), checkout, env))
    runs = checkout / "runs"

    # What the blocks say they did. make train, then one epoch more: MNIST at 99%, and at 99%
    # after make train's two epochs (mnist_cnn's quality bar under torch, which
    # tests/recipes/test_quality.py leaves to this run).
    (first,) = runs.glob("mnist_cnn-torch-*")
    summary = json.loads((first / "summary.json").read_text())
    assert summary["epochs"] == 3 and summary["test_accuracy"] >= 0.99
    records = [json.loads(line) for line in (first / "metrics.jsonl").read_text().splitlines()]
    evaluations = [record for record in records if record["kind"] == "eval"]
    assert len(evaluations) == 3 and evaluations[1]["test_accuracy"] >= 0.99, evaluations
    assert (checkout / "curves.png").exists()
    assert json.loads((runs / "mine" / "summary.json").read_text())["test_accuracy"] >= 0.95
    assert json.loads((runs / "from-python" / "summary.json").read_text())["epochs"] == 2
    assert list((runs / "regression" / "export").glob("*.pt2"))
    assert checkpoints(runs / "my-loop" / "checkpoints")[-1].name == checkpoint_name(2, 0)
    ported = re.findall(r"epoch 2: test .*accuracy ([\d.]+)%", "\n".join(outputs))
    assert len(ported) == 2 and min(float(a) for a in ported) >= 98.5, ported  # as they did


def test_the_readme_is_short_and_its_links_lead_somewhere():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 400  # a newcomer's five minutes; the rest is in docs/
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert local and [link for link in local if not (REPO / link).exists()] == []
