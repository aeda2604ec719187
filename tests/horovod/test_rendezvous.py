"""horovodrun's rendezvous server clears a Gloo scope once all its ranks are done with it, so
the next hvd.init (after hvd.shutdown) reads no address from the last round (patch 18)."""

import urllib.request

from horovod.runner.common.util.hosts import SlotInfo
from horovod.runner.http.http_server import RendezvousServer


def test_a_scope_is_cleared_when_its_ranks_finish_whatever_the_other_scopes_do():
    # Two ranks on one host: scopes global and local_a hold both, cross_0 and cross_1 one each.
    plan = [SlotInfo("a", rank, rank, 0, 2, 2, 1) for rank in (0, 1)]
    server = RendezvousServer()
    port = server.start()
    server.init(plan)

    def call(method: str, scope: str, rank: int, body: bytes | None = None) -> None:
        url = f"http://127.0.0.1:{port}/{scope}/{rank}"
        urllib.request.urlopen(urllib.request.Request(url, body, method=method), timeout=10)

    try:
        for rank in (0, 1):
            call("PUT", "local_a", rank, f"address of rank {rank}".encode())
        # Rank 1 is done with local_a, then with its own cross scope, before rank 0 is done
        # with local_a: the cross scope completing must not forget rank 1's local_a.
        call("DELETE", "local_a", 1)
        call("PUT", "cross_1", 0, b"address")
        call("DELETE", "cross_1", 0)
        call("DELETE", "local_a", 0)
        assert server._httpd.cache.get("local_a", {}) == {}
    finally:
        server.stop()
