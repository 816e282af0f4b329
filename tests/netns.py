"""Two "nodes" on one machine for the multi-node tests: two network namespaces joined by a veth pair.

Each namespace has its loopback and one end of the pair, with a private address (NET below) and no
default route: nothing sent inside them can leave them, and the machine's own network is untouched.
The filesystem, /tmp, the cgroups and the process table stay shared (as a shared filesystem is on a
real cluster), so processes of both "nodes" are started, found and ended by their pids from here. What
runs inside (`Pair.inside`) enters the namespace's network only (nsenter, not `ip netns exec`, which
mounts a /sys without cgroups: slurmd needs them) and, in a mount namespace of its own, sees a hosts
file over /etc/hosts that names both nodes and gives the machine's host name the namespace's own
address, as a node's own name resolves to its address: the nodes find each other by name, and the
machine's /etc is never written.

`namespace_pair()` builds them and removes them at the end (also on failure), or says in one line why
it cannot (not root, no `ip`, a kernel that refuses). `start_group` and `end_group` start and end a
daemon's whole process group (Ray's daemons, Slurm's), by pid. `quick_toy` writes the toy task the
runs of these tests train on.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

NET = "10.231.0"  # a private /24 inside the namespaces only (RFC 1918); the two ends are .1 and .2
PREFIX = "rpgmn"  # the namespaces' and interfaces' names: PREFIX<pid of the test process><a|b>
TOOLS = ("ip", "nsenter", "unshare", "mount")


@dataclass(frozen=True)
class Pair:
    """Two namespaces, `names[i]` holding the address `addrs[i]`, known inside as `hosts[i]`."""

    names: tuple[str, str]
    addrs: tuple[str, str]
    hosts: tuple[str, str]
    hosts_files: tuple[Path, Path]  # shown as /etc/hosts inside each

    def inside(self, i: int, argv: Sequence[str]) -> list[str]:
        """`argv` run in namespace i's network, with that namespace's hosts file as its /etc/hosts."""
        bind = 'mount --bind "$0" /etc/hosts && exec "$@"'
        return [
            "nsenter", f"--net=/run/netns/{self.names[i]}", "unshare", "--mount", "--propagation", "private",
            "sh", "-c", bind, str(self.hosts_files[i]), *argv,
        ]  # fmt: skip

    def net_inode(self, i: int) -> int:
        """The namespace's inode: /proc/<pid>/ns/net of a process inside it has the same one."""
        return os.stat(f"/run/netns/{self.names[i]}").st_ino


def why_no_namespaces() -> str | None:
    """None when this process can build network namespaces, else why not (one line)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); this test is not root"
    if missing := [t for t in TOOLS if not shutil.which(t)]:
        return f"{', '.join(missing)} not installed (iproute2, util-linux, mount): the two-node tests need them"
    return None


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _remove(name: str) -> None:
    """Delete a namespace (its end of the veth pair goes with it); quiet if gone."""
    _ip("netns", "delete", name)


def _remove_stale() -> None:
    """Namespaces of an earlier test process that died before removing them (its pid is gone)."""
    listed = _ip("netns", "list").stdout.split()
    for name in listed:
        pid = name.removeprefix(PREFIX)[:-1]
        if name.startswith(PREFIX) and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _remove(name)


@contextlib.contextmanager
def namespace_pair(hosts: tuple[str, str] = ("node-a", "node-b")) -> Iterator[Pair | str]:
    """Two namespaces joined by a veth pair, each knowing both by the names `hosts`; removed at the end.
    Yields the Pair, or instead a one-line reason when they cannot be built (the caller skips)."""
    if why := why_no_namespaces():
        yield why
        return
    _remove_stale()
    tag = f"{PREFIX}{os.getpid()}"
    etc = Path(tempfile.mkdtemp(prefix=f"{tag}-"))
    etc.chmod(0o755)  # the hosts file is read by whoever runs inside
    pair = Pair((f"{tag}a", f"{tag}b"), (f"{NET}.1", f"{NET}.2"), hosts, (etc / "hosts-a", etc / "hosts-b"))
    machine = socket.gethostname()  # both namespaces share it: inside each, it names that "node"
    for addr, path in zip(pair.addrs, pair.hosts_files):
        lines = ["127.0.0.1 localhost", f"{addr} {machine}", *(f"{a} {h}" for a, h in zip(pair.addrs, hosts))]
        path.write_text("\n".join(lines) + "\n")
    steps = [
        *(("netns", "add", name) for name in pair.names),
        ("link", "add", pair.names[0], "type", "veth", "peer", "name", pair.names[1]),
    ]
    for i, name in enumerate(pair.names):  # each end into its namespace, addressed, up; loopback up
        steps += [
            ("link", "set", name, "netns", name),
            ("-n", name, "addr", "add", f"{pair.addrs[i]}/24", "dev", name),
            ("-n", name, "link", "set", "lo", "up"),
            ("-n", name, "link", "set", name, "up"),
        ]
    try:
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                yield f"cannot build network namespaces here: `ip {' '.join(step)}`: {done.stderr.strip()[:200]}"
                return
        yield pair
    finally:
        for name in pair.names:
            _remove(name)
        _ip("link", "delete", pair.names[0])  # left in the machine's namespace if a step above failed
        shutil.rmtree(etc, ignore_errors=True)


# ------------------------------------------------------------------------------- daemons by pid


def start_group(argv: Sequence[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """`argv` in a process group (and session) of its own, output to `log`: its daemons stay in that
    group, so `end_group` finds every one of them by the group's id (the returned pid)."""
    with open(log, "w") as out:
        return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def group_family(pgid: int, marker: str) -> list:
    """The processes of group `pgid` and everything they started (Ray runs jobs in groups of their own);
    none unless one of the group names `marker` on its command line (the group id may have been reused)."""
    import psutil

    def in_group(p: psutil.Process) -> bool:
        with contextlib.suppress(OSError):
            return os.getpgid(p.pid) == pgid
        return False

    def names_marker(p: psutil.Process) -> bool:
        with contextlib.suppress(psutil.Error):
            return marker in " ".join(p.cmdline())
        return False

    family = {p for p in psutil.process_iter() if in_group(p)}
    if not any(names_marker(p) for p in family):
        return []
    for p in list(family):
        with contextlib.suppress(psutil.Error):
            family.update(p.children(recursive=True))
    family.discard(psutil.Process())
    return list(family)


def end_group(pgid: int, marker: str, grace_s: float = 3.0) -> int:
    """End group `pgid` and its descendants (`group_family`): SIGTERM, then SIGKILL after `grace_s` (0: SIGKILL
    at once, as when a machine dies). Returns how many processes there were."""
    import psutil

    family = group_family(pgid, marker)
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
    _, alive = psutil.wait_procs(family, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=10)
    return len(family)


def in_namespace(pid: int, pair: Pair, i: int) -> bool:
    """Whether process `pid` lives in namespace i of `pair`."""
    with contextlib.suppress(OSError):
        return os.stat(f"/proc/{pid}/ns/net").st_ino == pair.net_inode(i)
    return False


def wait_for(condition, timeout_s: float, what: str, step_s: float = 0.25):
    """The first truthy value of `condition()`; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def quick_toy(out_dir: Path) -> Path:
    """`rpg prepare-data --toy`'s task in `out_dir` (model/, train.parquet, val.parquet), its model left
    as built: these tests are about where runs go, not what they learn, and the format's warm-up takes
    minutes of CPU (800 steps)."""
    from unittest import mock

    from rpg_cli.datasets import toy

    with mock.patch.object(toy, "warm_up_format", lambda *args, **kwargs: float("nan")):
        toy.write_toy(out_dir)
    return out_dir
