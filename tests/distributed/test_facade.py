"""`Distributed` is a façade: it keeps what a loop of one's own calls, each documented on the
own-loop page, and hands every other job to a facet (Lightning Fabric's shape)."""

import ast
import inspect
import textwrap

from hvd_train.distributed.facade import Distributed
from tests.conftest import REPO

MOST = 30  # public members the façade keeps


def public_members() -> set[str]:
    """The façade's public methods and properties, and the attributes its `__init__` sets."""
    members = {name for name in vars(Distributed) if not name.startswith("_")}
    made = ast.parse(textwrap.dedent(inspect.getsource(Distributed.__init__)))
    set_here = {target.attr for node in ast.walk(made) if isinstance(node, ast.Assign)
                for target in node.targets if isinstance(target, ast.Attribute)}  # fmt: skip
    return members | set_here


def documented(name: str, page: str) -> bool:
    """Whether `page` names `name` as code: `name`, `name(...)` or `dist.name`."""
    return any(form in page for form in (f"`{name}`", f"`{name}(", f"`dist.{name}`"))


def test_the_facade_keeps_at_most_30_public_members_each_documented():
    members = public_members()
    assert len(members) <= MOST, sorted(members)
    page = (REPO / "docs" / "own-loop.md").read_text()
    assert sorted(m for m in members if not documented(m, page)) == []


def test_the_count_sees_methods_properties_and_attributes():
    assert {"setup", "rank", "exchange", "checkpoints", "save"} <= public_members()
