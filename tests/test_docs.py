"""The figures on the README and the docs pages come from the results files in docs/results/,
through benchmarks.render: a page whose figure differs from its file fails here."""

import json
import re

from benchmarks import render


def test_every_figure_block_matches_its_results_file():
    assert render.stale_blocks() == [], "run python -m benchmarks.render"


def test_a_figure_changed_by_hand_is_found(tmp_path):
    readme = (render.ROOT / "README.md").read_text()
    block = render.BLOCK.search(readme)
    assert block is not None
    body = block["body"]
    changed = body.replace(re.findall(r"\d+", body)[0], "12345", 1)
    page = tmp_path / "README.md"
    page.write_text(readme.replace(body, changed))
    assert render.stale_blocks([page]) == [f"README.md: {block['name']}"]


def test_every_block_names_a_renderer_and_every_results_file_its_date_and_machine():
    names = {m["name"] for page in render.pages() for m in render.BLOCK.finditer(page.read_text())}
    assert names == set(render.RENDERERS)  # none unknown, none unused
    for path in render.RESULTS.glob("*.json"):
        machine = json.loads(path.read_text())["machine"]
        assert re.match(r"\d{4}-\d\d-\d\d, x86_64, \d+ cores, Python ", machine), path
