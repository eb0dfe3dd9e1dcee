"""Several hosts on one machine (scripts/cluster.sh): waves across them, and a host killed,
Redis restarted and a host cut off the network in the middle of a wave.

Black-box: the cluster runs its own Postgres, Redis, central repository (git daemon), beat and
one worker per network namespace; these tests drive it with the script and `manage.py`, and
read its database and its central repository. One cluster for the module (up once, down at the
end even on failure). Heartbeat TTL 5 s: a dead host's agents run again within 2 x TTL.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from tests.hosts.cluster import AgentRow, Cluster, cluster_running, skip_unless_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TTL_S = 5.0
# What a re-run costs beyond the lease's expiry and does not shrink with the TTL: the safety
# net's round (every second), the task's pick-up, the workspace's fetch and fence push. Measured
# on a loaded 2-core machine: 9.6-11 s after a SIGKILL, 16-17 s after a cut (TTL 5 s).
SLACK_S = 10.0
WAVE = 30
# The waves a fault lands in: big enough that it lands mid-wave, small enough to stay quick.
FAULT_WAVE = 15


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_unless_cluster()
    with cluster_running(
        tmp_path_factory.mktemp("hosts"),
        hosts=3,
        sleep=0.5,
        concurrency=4,
        ANNIHILATION_HEARTBEAT_TTL_S=str(TTL_S),
        ANNIHILATION_DISPATCH_GRACE_S=str(TTL_S),
        ANNIHILATION_SAFETY_NET_INTERVAL_S="1",
        ANNIHILATION_CENTRAL_RETRY_S="30",
    ) as running:
        yield running


@pytest.fixture(autouse=True)
def hosts_whole(cluster: Cluster) -> None:
    """Each test starts with every host up, whatever the one before did to them."""
    cluster.hosts_restore()


def assert_wave_whole(cluster: Cluster, wave_id: int, quantum_ids: list[int]) -> None:
    """The wave completed; no quantum lost; every agent's commit on its branch exactly once;
    the last stage's commit follows the coder's and its agent saw the coder's note."""
    detail = cluster.wave_wait(wave_id)
    assert detail["status"] == "done", detail
    assert {r["status"] for r in detail["runs"]} == {"done"}, detail["runs"]
    closed = cluster.query(
        "SELECT count(*) FROM quanta_quantum WHERE id = ANY(%s) AND status = 'closed'",
        quantum_ids,
    )[0][0]
    assert closed == len(quantum_ids)
    for qid in quantum_ids:
        commits = cluster.commits(qid)
        subjects = [s for _, s in commits]
        assert len(subjects) == len(set(subjects)), f"q-{qid}: a commit doubled: {subjects}"
        coder, tester = f"q-{qid}: {qid}_s1_coder (coder)", f"q-{qid}: {qid}_s3_tester (tester)"
        assert coder in subjects and tester in subjects, f"q-{qid}: a commit lost: {subjects}"
        sha = dict((s, h) for h, s in commits)
        ancestor = cluster.git("merge-base", "--is-ancestor", sha[coder], sha[tester], check=False)
        assert ancestor.returncode == 0
        seen = cluster.git("show", f"{sha[tester]}:seen/{qid}_s3_tester.txt").stdout.split()
        assert f"{qid}_s1_coder.md" in seen, f"q-{qid}: the tester did not see the coder's note"


def hosts_per_quantum(agents: list[AgentRow]) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    for a in agents:
        if a.status == "done":
            found.setdefault(a.quantum_id, set()).add(a.host)
    return found


def wait_running_on(cluster: Cluster, host: str, quantum_ids: list[int]) -> list[AgentRow]:
    """Until at least two agents of these quanta run on `host` (one in its model turn)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = cluster.running_on(host, quantum_ids)
        if len(running) >= 2:
            return running
        time.sleep(0.1)
    raise AssertionError(f"no agent ran on {host}:\n{cluster.logs_tail()}")


def wait_fenced_on(
    cluster: Cluster, host: str, quantum_ids: list[int]
) -> tuple[list[AgentRow], dict[str, tuple[str, str, int]]]:
    """Until agents run on `host` and one of them holds its fence in the central repository
    (taken as its workspace is prepared, just after it starts running). Returns them and what
    the host saw of each: {agent: (its branch's tip, its fence, its quantum)}."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        victims = wait_running_on(cluster, host, quantum_ids)
        seen = {
            v.agent_id: (
                cluster.tip(f"refs/heads/annihilation/q-{v.quantum_id}"),
                cluster.tip(f"refs/annihilation/fence/{v.agent_id}"),
                v.quantum_id,
            )
            for v in victims
        }
        if any(fence for _, fence, _ in seen.values()):
            return victims, seen
        time.sleep(0.05)
    raise AssertionError(f"no agent on {host} took its fence:\n{cluster.logs_tail()}")


def reruns_after(
    cluster: Cluster, victims: list[AgentRow], quantum_ids: list[int], since: datetime
) -> list[float]:
    """For each agent caught on the lost host: seconds from `since` until it started again on
    another host (its `started` event: the lost host cannot write one meanwhile)."""
    agents = cluster.agents(quantum_ids)
    delays = []
    for v in victims:
        rows = [a for a in agents if a.agent_id == v.agent_id and a.attempt >= v.attempt]
        if all(a.host == v.host for a in rows):
            # It ended on the lost host before the host was lost: nothing to run again.
            assert [a.status for a in rows] == ["done"], f"{v.agent_id}: {rows}"
            continue
        (started,) = cluster.query(
            "SELECT min(created_at) FROM core_event WHERE topic = %s AND type = 'started' "
            "AND created_at >= %s",
            f"agent:{v.agent_id}",
            since,
        )[0]
        assert started is not None, f"{v.agent_id} never started again: {rows}"
        delays.append(round((started - since).total_seconds(), 1))
    return delays


def test_a_wave_of_30_quanta_completes_across_three_hosts(cluster: Cluster) -> None:
    ids = cluster.quanta_add("wave", WAVE)
    started = time.monotonic()
    wave_id = cluster.wave_start("wave")
    assert_wave_whole(cluster, wave_id, ids)
    print(f"\n{WAVE} quanta on 3 hosts: {time.monotonic() - started:.1f} s")

    agents = cluster.agents(ids)
    assert {a.host for a in agents} == {"h1", "h2", "h3"}
    spread = hosts_per_quantum(agents)
    assert sum(len(h) >= 2 for h in spread.values()) >= WAVE // 3, spread
    # A coder on one host, the last tester on another: the tester saw the coder's note
    # (assert_wave_whole) through the central repository.
    crossed = [
        qid
        for qid in ids
        if {a.host for a in agents if a.agent_id == f"{qid}_s1_coder"}
        != {a.host for a in agents if a.agent_id == f"{qid}_s3_tester"}
    ]
    assert crossed


def test_a_host_killed_mid_wave_loses_nothing(cluster: Cluster) -> None:
    ids = cluster.quanta_add("kill", FAULT_WAVE)
    wave_id = cluster.wave_start("kill")
    victims, seen = wait_fenced_on(cluster, "h2", ids)
    killed_at = datetime.now(UTC)
    cluster.sh("kill", "h2")

    assert_wave_whole(cluster, wave_id, ids)
    delays = reruns_after(cluster, victims, ids, killed_at)
    print(f"\nafter SIGKILL of h2: {len(delays)} agent(s) ran again after {delays} s")
    assert delays and max(delays) <= 2 * TTL_S + SLACK_S

    # The killed attempt's push, replayed now, is refused: its fence moved on.
    agent_id, (tip, fence, qid) = next((a, s) for a, s in seen.items() if s[1])
    landed = cluster.tip(f"refs/heads/annihilation/q-{qid}")
    refused = stale_push(cluster, qid, agent_id, tip=tip, fence=fence)
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert cluster.tip(f"refs/heads/annihilation/q-{qid}") == landed
    assert "(stale)" not in cluster.git("log", "--format=%s", f"annihilation/q-{qid}").stdout
    # The same push with leases that hold (refs that do not exist yet) lands: the refusal above
    # is the leases', not the server's.
    probe = stale_push(cluster, 999_999, "probe", tip="", fence="")
    assert probe.returncode == 0, probe.stdout + probe.stderr


def stale_push(
    cluster: Cluster, qid: int, agent_id: str, *, tip: str, fence: str
) -> subprocess.CompletedProcess[str]:
    """The push a stale execution makes: a commit on the tip it saw and a new fence, both
    leased on what it saw (`tip` "" = the branch did not exist), atomically."""
    base = tip or cluster.tip("main")
    tree = cluster.git("rev-parse", f"{base}^{{tree}}").stdout.strip()
    commit = cluster.git(
        "-c", "user.name=stale", "-c", "user.email=stale@example.invalid",
        "commit-tree", tree, "-p", base, "-m", f"q-{qid}: {agent_id} (stale)",
    ).stdout.strip()  # fmt: skip
    blob = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"],
        cwd=cluster.bare, input="stale", capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    branch = f"refs/heads/annihilation/q-{qid}"
    fence_ref = f"refs/annihilation/fence/{agent_id}"
    return subprocess.run(
        [
            "git", "push", "--atomic", "--porcelain",
            f"--force-with-lease={branch}:{tip}", f"--force-with-lease={fence_ref}:{fence}",
            cluster.env["ANNIHILATION_REPO"], f"{commit}:{branch}", f"{blob}:{fence_ref}",
        ],
        cwd=cluster.bare, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_a_host_cut_off_the_network_mid_wave_loses_nothing(cluster: Cluster) -> None:
    ids = cluster.quanta_add("cut", FAULT_WAVE)
    wave_id = cluster.wave_start("cut")
    victims = wait_running_on(cluster, "h3", ids)
    cut_at = datetime.now(UTC)
    cluster.sh("partition", "h3", "20", timeout=60)

    assert_wave_whole(cluster, wave_id, ids)
    delays = reruns_after(cluster, victims, ids, cut_at)
    print(f"\nh3 cut off for 20 s: {len(delays)} agent(s) ran again after {delays} s")
    assert delays and max(delays) <= 2 * TTL_S + SLACK_S


def test_a_redis_restart_mid_wave_loses_nothing(cluster: Cluster) -> None:
    ids = cluster.quanta_add("redis", FAULT_WAVE)
    wave_id = cluster.wave_start("redis")
    wait_running_on(cluster, "h1", ids)
    cluster.sh("redis-restart")

    assert_wave_whole(cluster, wave_id, ids)
