"""The cluster ops (``cluster_status``, ``cluster_add``, ``cluster_remove``) and the admin
snapshot against a real three-node cluster on loopback, with tokens; and what a single
daemon answers to them."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Any, Dict, List

import muster
import muster.sync
import pytest
from conftest import CLUSTER_ID, Daemon, cluster_node, cluster_secret, run

TOKENS = {
    "ops": "o" * 40,
    "jobs-admin": "j" * 40,
    "producer": "p" * 40,
}
"""An admin of every queue, an admin of queues ``jobs*`` only, and a producer."""

CONFIG = "".join(
    f'[[tokens]]\nname = "{name}"\n'
    f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
    f"roles = {roles}\n{queues}\n"
    for name, token, roles, queues in [
        ("ops", TOKENS["ops"], '["admin"]', ""),
        ("jobs-admin", TOKENS["jobs-admin"], '["admin"]', 'queues = ["jobs", "jobs.*"]\n'),
        ("producer", TOKENS["producer"], '["produce"]', ""),
    ]
)

CONVERGE_TIMEOUT = 30.0
"""Longest the nodes may take to hold and apply the leader's whole log."""


class Nodes:
    """Three cluster nodes started for a test: node 1 bootstrapped, nodes 2 and 3
    started with its identity and not yet added."""

    def __init__(self, bins: Path, root: Path) -> None:
        config = root / "muster.toml"
        config.write_text(CONFIG)
        secret = cluster_secret(root)
        args = ["--config", str(config)]
        self.nodes: Dict[int, Daemon] = {}
        try:
            self.nodes[1] = cluster_node(bins, root / "node-1", 1, secret, args)
            for n in (2, 3):
                self.nodes[n] = cluster_node(
                    bins, root / f"node-{n}", n, secret, args, identity_from=root / "node-1"
                )
        except BaseException:
            self.stop()
            raise

    def options(self, node: int, token: str = "ops") -> Dict[str, Any]:
        """Connection options for one node (``connect_node``) or, through it, the
        leader (``connect``): node 1's certificate is every node's."""
        return {
            "addr": self.nodes[node].addr,
            "data": str(self.nodes[1].data),
            "token": TOKENS[token],
        }

    def member(self, node: int, matched: Any = None) -> muster.ClusterMember:
        """Node ``node`` as the membership lists it (a voter)."""
        d = self.nodes[node]
        return muster.ClusterMember(node, d.addr, d.cluster_addr, True, matched)

    def stop(self) -> None:
        """Stops every node still running."""
        for d in self.nodes.values():
            d.stop()


@pytest.fixture
def nodes(bins: Path, tmp_path: Path) -> Any:
    started = Nodes(bins, tmp_path)
    yield started
    started.stop()


async def own_views(nodes: Nodes, ids: List[int]) -> Dict[int, muster.ClusterStatus]:
    """Each node's own view, read over a connection to exactly that node."""
    views = {}
    for n in ids:
        async with await muster.Client.connect_node(**nodes.options(n)) as client:
            views[n] = await client.cluster_status()
    return views


async def converged(nodes: Nodes, ids: List[int]) -> Dict[int, muster.ClusterStatus]:
    """The nodes' own views once every node follows one leader in one term, holds and
    applied the leader's whole log, and the leader knows each to hold it."""
    deadline = time.monotonic() + CONVERGE_TIMEOUT
    while True:
        views = await own_views(nodes, ids)
        agreed = {(v.leader, v.term) for v in views.values()}
        logs = {v.last_log_index for v in views.values()} | {v.last_applied for v in views.values()}
        leader = next((v for v in views.values() if v.role == "leader"), None)
        if (
            leader is not None
            and agreed == {(leader.node, leader.term)}
            and logs == {leader.last_log_index}
            and [m.matched for m in leader.members] == [leader.last_log_index] * len(ids)
        ):
            return views
        assert time.monotonic() < deadline, f"no agreement within {CONVERGE_TIMEOUT}s: {views}"
        await asyncio.sleep(0.05)


def test_a_cluster_is_formed_read_changed_and_snapshotted(nodes: Nodes) -> None:
    async def body() -> None:
        # Node 1 alone: a one-node cluster it leads.
        async with await muster.Client.connect(**nodes.options(1)) as client:
            alone = await client.cluster_status()
            assert (alone.cluster_id, alone.node, alone.role, alone.leader) == (
                CLUSTER_ID,
                1,
                "leader",
                1,
            )
            assert alone.term >= 1
            assert alone.members == [nodes.member(1, alone.last_log_index)]
            assert (alone.voters, alone.learners) == ([1], [])

            # Node 2 joins as a voter once it caught up; node 3 as a learner first,
            # then a second add promotes it.
            two = await client.cluster_add(2, nodes.nodes[2].addr, nodes.nodes[2].cluster_addr)
            assert (two.node, two.role, two.voters, two.learners) == (1, "leader", [1, 2], [])
            learner = await client.cluster_add(
                3, nodes.nodes[3].addr, nodes.nodes[3].cluster_addr, learner=True, catch_up=30
            )
            assert (learner.voters, learner.learners) == ([1, 2], [3])
            three = await client.cluster_add(3, nodes.nodes[3].addr, nodes.nodes[3].cluster_addr)
            assert (three.voters, three.learners) == ([1, 2, 3], [])

            # Every node's own view agrees: one leader (node 1), one term, one log.
            views = await converged(nodes, [1, 2, 3])
            leader = views[1]
            term, last = leader.term, leader.last_log_index
            assert last is not None
            assert leader == muster.ClusterStatus(
                cluster_id=CLUSTER_ID,
                node=1,
                role="leader",
                term=term,
                leader=1,
                last_log_index=last,
                last_applied=last,
                snapshot_index=None,
                members=[nodes.member(n, last) for n in (1, 2, 3)],
            )
            for n in (2, 3):
                assert views[n] == muster.ClusterStatus(
                    cluster_id=CLUSTER_ID,
                    node=n,
                    role="follower",
                    term=term,
                    leader=1,
                    last_log_index=last,
                    last_applied=last,
                    snapshot_index=None,
                    # Only the leader knows how far the others are.
                    members=[nodes.member(m) for m in (1, 2, 3)],
                )
            assert await client.cluster_status() == leader

            # A snapshot of the leader's store, in its snapshot root.
            await client.queue_create("jobs")
            await client.enqueue_many("jobs", [{"n": 1}, {"n": 2}])
            root = (nodes.nodes[1].data / "backups").resolve()
            copy = await client.admin_snapshot("before-remove")
            assert (copy.dir, copy.tasks, copy.queues) == (str(root / "before-remove"), 2, 1)
            assert (root / "before-remove").is_dir()
            assert any((root / "before-remove").iterdir())
            with pytest.raises(muster.AlreadyExists) as exists:
                await client.admin_snapshot("before-remove")
            assert exists.value.code == "already_exists"
            with pytest.raises(muster.BadRequest, match="not inside the snapshot root"):
                await client.admin_snapshot(str(nodes.nodes[1].data / "elsewhere"))

            # Refusals, each with its class and code.
            with pytest.raises(muster.AlreadyExists, match="node 2 is a voter") as again:
                await client.cluster_add(2, nodes.nodes[2].addr, nodes.nodes[2].cluster_addr)
            assert again.value.code == "already_exists"
            with pytest.raises(muster.NotFound, match="node 9") as missing:
                await client.cluster_remove(9)
            assert missing.value.code == "not_found"
            with pytest.raises(muster.BadRequest, match="catch_up_ms 0 is out of range"):
                await client.cluster_add(5, "127.0.0.1:1", "127.0.0.1:2", catch_up=0)
            for bad in (-1, 2**64, True):
                with pytest.raises(muster.InvalidInput, match="a node id is an integer"):
                    await client.cluster_add(bad, "127.0.0.1:1", "127.0.0.1:2")
                with pytest.raises(muster.InvalidInput, match="a node id is an integer"):
                    await client.cluster_remove(bad)
            with pytest.raises(muster.InvalidInput, match="catch_up must be a duration"):
                await client.cluster_add(5, "127.0.0.1:1", "127.0.0.1:2", catch_up=-1)
            # Nothing of that changed the membership.
            unchanged = await client.cluster_status()
            assert (unchanged.voters, unchanged.learners) == ([1, 2, 3], [])

        # A follower answers its status, and refuses a change with where the leader is.
        async with await muster.Client.connect_node(**nodes.options(2)) as follower:
            with pytest.raises(muster.NotLeader, match="node 1") as not_leader:
                await follower.cluster_remove(3)
            assert not_leader.value.code == "not_leader"
            with pytest.raises(muster.NotLeader):
                await follower.cluster_add(4, "127.0.0.1:1", "127.0.0.1:2")
        with pytest.raises(muster.InvalidInput, match="one address is needed"):
            await muster.Client.connect_node(
                **dict(nodes.options(1), addr=f"{nodes.nodes[1].addr},{nodes.nodes[2].addr}")
            )

        # Tokens: membership changes and snapshots need an admin of every queue; the
        # status, any admin.
        async with await muster.Client.connect(**nodes.options(2, "jobs-admin")) as limited:
            assert (await limited.cluster_status()).node == 1
            for refused in (
                limited.cluster_add(4, "127.0.0.1:1", "127.0.0.1:2"),
                limited.cluster_remove(3),
                limited.admin_snapshot("limited"),
            ):
                with pytest.raises(muster.Forbidden, match="limited to some queues") as no:
                    await refused
                assert no.value.code == "forbidden"
        async with await muster.Client.connect(**nodes.options(3, "producer")) as producer:
            for call in (
                producer.cluster_status(),
                producer.cluster_add(4, "127.0.0.1:1", "127.0.0.1:2"),
                producer.cluster_remove(3),
            ):
                with pytest.raises(muster.Forbidden, match="lacks the role admin"):
                    await call
        assert not (root / "limited").exists()

        # Node 3 leaves: the cluster goes on with two voters.
        async with await muster.Client.connect(**nodes.options(1)) as client:
            after = await client.cluster_remove(3)
            assert (after.node, after.role, after.voters, after.learners) == (
                1,
                "leader",
                [1, 2],
                [],
            )
            assert [m.node for m in after.members] == [1, 2]
        nodes.nodes[3].stop()
        views = await converged(nodes, [1, 2])
        assert [(v.role, v.leader, v.voters) for v in views.values()] == [
            ("leader", 1, [1, 2]),
            ("follower", 1, [1, 2]),
        ]

    run(body(), timeout=120)

    # The blocking facade has the same ops.
    with muster.sync.Client.connect_node(**nodes.options(2)) as client:
        status = client.cluster_status()
        assert (status.node, status.role, status.leader, status.voters) == (
            2,
            "follower",
            1,
            [1, 2],
        )
        with pytest.raises(muster.NotLeader):
            client.cluster_remove(2)
    with muster.sync.Client.connect(**nodes.options(2)) as client:
        assert client.cluster_status().node == 1
        with pytest.raises(muster.NotFound):
            client.cluster_remove(3)
        with pytest.raises(muster.AlreadyExists):
            client.cluster_add(2, nodes.nodes[2].addr, nodes.nodes[2].cluster_addr)


def test_a_single_daemon_is_not_a_cluster(daemon: Daemon) -> None:
    async def body() -> None:
        async with await muster.Client.connect(**daemon.connect) as client:
            for call in (
                client.cluster_status(),
                client.cluster_add(2, "127.0.0.1:1", "127.0.0.1:2"),
                client.cluster_remove(2),
            ):
                with pytest.raises(muster.InvalidState, match="not a cluster node") as refused:
                    await call
                assert refused.value.code == "invalid_state"
        # One node's own view is its own even when it is a single daemon.
        async with await muster.Client.connect_node(**daemon.connect) as client:
            with pytest.raises(muster.InvalidState):
                await client.cluster_status()

    run(body())
    with muster.sync.Client.connect(**daemon.connect) as client:
        with pytest.raises(muster.InvalidState):
            client.cluster_status()
