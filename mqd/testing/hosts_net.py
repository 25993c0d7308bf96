"""Network hosts on one machine: Linux network namespaces on a shared bridge (root needed).

The primitive under :mod:`mqd.testing.hosts`. A :class:`HostNetwork` makes one bridge in the root
namespace with an address of its own (``.1``: the test process itself, which starts, watches and
checks everything, and is never faulted), and each :class:`NetHost` is a network namespace joined
to the bridge by a veth pair, with its own address on the bridge's /24 and its own loopback::

    with HostNetwork() as net:
        a, b = net.add_host("a"), net.add_host("b")
        proc = a.process("srv", ["python3", "-m", "http.server", "8000"], tmp_path / "srv.log")
        proc.start()                 # runs inside a's namespace (``ip netns exec``)
        b.cut(a)                     # b and a no longer reach each other (both directions)
        b.loss(a, 0.3)               # instead: 30 % of b's packets to a dropped, none the other way
        a.isolate()                  # a reaches nobody (the test process neither)
        net.heal()                   # every host's faults lifted

Faults are nftables rules in each host's own namespace (``table inet mqd_faults``), rebuilt from
the host's fault state at every change and loaded atomically (``nft -f``): a cut or an isolation
drops packets (a peer sees silence, as on a real partition, not a refusal); loss drops a share of
packets chosen at random (``numgen random``) in one direction only.

Processes started through :meth:`NetHost.process` run in the namespace (``ip netns exec`` execs the
command: the pid is the process's own, so signals reach it) and die with the test process
(``PR_SET_PDEATHSIG``). With ``clock=True`` they run under libfaketime, reading the offset of
:meth:`NetHost.step_clock` from a file of the host's (wall clock only: ``CLOCK_MONOTONIC`` stays
true, as with an NTP step; namespaces share the kernel's clock, so this is the only way to give one
host another time).

Clean-up: :meth:`HostNetwork.close` (also at exit of the ``with`` block, and at interpreter exit)
kills whatever still runs in the namespaces, deletes them and the bridge. Names carry the owning
pid (``mqd<pid>n<k>-<host>``, bridge ``mqbr<pid>n<k>``): a new network first deletes those of dead owners, so
even a SIGKILLed test leaves nothing behind for long.

Needs root, ``ip`` (iproute2), ``nft`` (nftables) and, for ``clock=True``, libfaketime (Debian:
``nftables``, ``libfaketime``; ``make install`` installs them when it runs as root):
:func:`missing_requirements` says what is missing, so tests can skip with that reason.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mqd.testing.process import ManagedProcess, ProcessError

if TYPE_CHECKING:
    from mqd_dev.chaos.proxy import FaultProxy

FAKETIME_LIBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
)
_PREFIX = "mqd"  # namespaces mqd<pid>n<k>-<host>; bridges mqbr<pid>n<k>; veths mqv<pid>x<i>
_CLONE_NEWNET = 0x40000000
_TABLE = "mqd_faults"
_counter = itertools.count()  # networks and veths made by this process


class NetworkError(ProcessError):
    """An ``ip``/``nft`` command of the rig failed (the message has its output)."""


def faketime_library() -> str | None:
    """libfaketime's multithreaded preload library, if installed."""
    for p in FAKETIME_LIBS:
        if Path(p).exists():
            return p
    return None


def missing_requirements(*, clock: bool = False) -> list[str]:
    """What this machine lacks for a :class:`HostNetwork` (empty: it can run one): root, ``ip``,
    ``nft``, and with ``clock`` libfaketime. A test's skip reason."""
    out = []
    if os.geteuid() != 0:
        out.append("root (network namespaces, a bridge and nftables rules)")
    if shutil.which("ip") is None:
        out.append("`ip` (iproute2)")
    if shutil.which("nft") is None:
        out.append("`nft` (apt-get install nftables)")
    if clock and faketime_library() is None:
        out.append("libfaketime (apt-get install libfaketime)")
    return out


def run(*argv: str, netns: str | None = None, stdin: str | None = None, check: bool = True) -> str:
    """Run a command (inside ``netns`` when given); its stdout. NetworkError when it fails."""
    cmd = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    r = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise NetworkError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_namespace_processes(netns: str) -> None:
    """SIGKILL (after SIGCONT) every process inside ``netns``."""
    for line in run("ip", "netns", "pids", netns, check=False).split():
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.kill(int(line), signal.SIGKILL)


def sweep_stale() -> list[str]:
    """Delete the namespaces and bridges of rigs whose owning process is gone; their names."""
    removed = []
    for line in run("ip", "netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{_PREFIX}(\d+)n\d+-[\w.-]+", name)
        if m and not _pid_alive(int(m.group(1))):
            kill_namespace_processes(name)
            run("ip", "netns", "delete", name, check=False)
            removed.append(name)
    for line in run("ip", "-o", "link", "show", "type", "bridge", check=False).splitlines():
        m = re.match(r"\d+:\s+(mqbr(\d+)n\d+)[:@]", line)
        if m and not _pid_alive(int(m.group(2))):
            run("ip", "link", "delete", m.group(1), check=False)
            removed.append(m.group(1))
    return removed


@dataclass
class _Faults:
    isolated: bool = False
    cut: set[str] = field(default_factory=set)  # peer addresses, both directions dropped
    loss_out: dict[str, float] = field(default_factory=dict)  # peer address -> share of packets dropped
    redirects: list[tuple[str, int, int]] = field(default_factory=list)  # (source addr, port, local port)


class NetHost:
    """One network namespace on the bridge: ``name``, ``address``, ``netns`` (its ``ip netns`` name)."""

    def __init__(self, network: HostNetwork, name: str, address: str, netns: str, veth: str) -> None:
        self.network = network
        self.name = name
        self.address = address
        self.netns = netns
        self.veth = veth
        self.processes: list[ManagedProcess] = []
        self.clock_offset = 0.0  # seconds; see step_clock
        self._clocked: list[ManagedProcess] = []
        self._faults = _Faults()

    def __repr__(self) -> str:
        return f"NetHost({self.name} {self.address})"

    # -- processes ---------------------------------------------------------------------------------

    def process(
        self,
        name: str,
        argv: list[str],
        log_path: Path,
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        clock: bool = False,
    ) -> ManagedProcess:
        """A :class:`ManagedProcess` (not started) running ``argv`` inside this host. ``env``
        replaces the environment (None: ours); ``clock``: under libfaketime, with the offset
        :meth:`step_clock` set when the process starts."""
        environ = dict(env if env is not None else os.environ)
        if clock:
            lib = faketime_library()
            if lib is None:
                raise NetworkError("clock=True needs libfaketime (apt-get install libfaketime)")
            environ |= {"LD_PRELOAD": lib, "FAKETIME": self._faketime()}
        proc = ManagedProcess(
            name,
            ["ip", "netns", "exec", self.netns, *argv],
            log_path,
            cwd=cwd,
            env=environ,
            die_with_parent=True,
        )
        self.processes.append(proc)
        if clock:
            self._clocked.append(proc)
        return proc

    def _faketime(self) -> str:
        return f"{self.clock_offset:+.0f}"

    def step_clock(self, seconds: float) -> None:
        """This host's ``clock=True`` processes run with their clocks ``seconds`` ahead of the
        machine's (negative: behind) from their next start on; 0 puts them back. Restart them
        (:meth:`kill` and start, or stop and start) for the step to take effect: libfaketime 0.9.10
        cannot step a running Python (its sleeps fail with EINVAL once the monotonic clock is left
        alone), so a process keeps the offset it started with, monotonic clock included, and the
        step happens between two runs, as for a host whose clock was wrong when it booted."""
        self.clock_offset = float(seconds)
        for p in self._clocked:
            if p.env is not None:
                p.env["FAKETIME"] = self._faketime()

    def running(self) -> list[ManagedProcess]:
        return [p for p in self.processes if p.running]

    def pids(self) -> list[int]:
        """Every process inside this host's namespace (children of its processes too: a Spark
        worker's executors)."""
        return [int(x) for x in run("ip", "netns", "pids", self.netns, check=False).split()]

    def _signal_all(self, sig: int) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def kill(self) -> list[ManagedProcess]:
        """SIGKILL every process inside this host (it lost its power), started here or not; the
        managed ones that ran (start them again to restart the host)."""
        victims = self.running()
        self._signal_all(signal.SIGKILL)
        for p in victims:
            p.stop(signal.SIGKILL)
        return victims

    def freeze(self) -> None:
        """SIGSTOP every process inside this host (a stalled host: connections open, silent)."""
        for p in self.running():
            p.frozen = True
        self._signal_all(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze`."""
        self._signal_all(signal.SIGCONT)
        for p in self.running():
            p.frozen = False

    # -- faults ------------------------------------------------------------------------------------

    def isolate(self) -> None:
        """This host reaches nobody and nobody reaches it (loopback still works)."""
        self._faults.isolated = True
        self._apply()

    def cut(self, *peers: NetHost) -> None:
        """Drop every packet between this host and each of ``peers``, both directions; other
        pairs are untouched."""
        for p in peers:
            self._faults.cut.add(p.address)
            p._faults.cut.add(self.address)
            p._apply()
        self._apply()

    def loss(self, peer: NetHost, share: float) -> None:
        """Drop ``share`` (0..1) of the packets this host sends to ``peer``; the other direction is
        untouched (asymmetric loss). 0 lifts it."""
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"loss share must be in [0, 1], got {share}")
        if share:
            self._faults.loss_out[peer.address] = share
        else:
            self._faults.loss_out.pop(peer.address, None)
        self._apply()

    def heal(self) -> None:
        """Lift this host's isolation, cuts (on both ends) and losses; redirects stay."""
        for peer in self.network.hosts.values():
            if self.address in peer._faults.cut:
                peer._faults.cut.discard(self.address)
                peer._apply()
        redirects = self._faults.redirects
        self._faults = _Faults(redirects=redirects)
        self._apply()

    def redirect(self, source: NetHost | None, port: int, local_port: int) -> None:
        """New TCP connections to this host's ``port`` (from ``source`` only, or from anyone) go to
        ``127.0.0.1:local_port`` inside it instead: how a proxy is put on a link
        (:meth:`HostNetwork.proxy`)."""
        self._faults.redirects.append((source.address if source else "", port, local_port))
        run("sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1", netns=self.netns)
        self._apply()

    def ruleset(self) -> str:
        """The nftables ruleset this host's faults make (what :meth:`_apply` loads)."""
        f = self._faults
        inp: list[str] = []
        out: list[str] = []
        if f.isolated:
            inp.append('iifname != "lo" drop')
            out.append('oifname != "lo" drop')
        for addr in sorted(f.cut):
            inp.append(f"ip saddr {addr} drop")
            out.append(f"ip daddr {addr} drop")
        for addr, share in sorted(f.loss_out.items()):
            if share >= 1.0:
                out.append(f"ip daddr {addr} drop")
            else:
                out.append(f"ip daddr {addr} numgen random mod 10000 < {round(share * 10000)} drop")
        pre = [
            (f"ip saddr {src} " if src else "") + f"tcp dport {port} dnat ip to 127.0.0.1:{local}"
            for src, port, local in f.redirects
        ]

        def chain(name: str, hook: str, rules: list[str], kind: str = "filter", prio: int = 0) -> str:
            body = "".join(f"    {r}\n" for r in rules)
            head = f"    type {kind} hook {hook} priority {prio}; policy accept;\n"
            return f"  chain {name} {{\n{head}{body}  }}\n"

        return (
            f"table inet {_TABLE} {{\n"
            + chain("input", "input", inp)
            + chain("output", "output", out)
            + (chain("prerouting", "prerouting", pre, "nat", -100) if pre else "")
            + "}\n"
        )

    def _apply(self) -> None:
        # declare, delete, declare anew: one atomic load whatever the table held
        script = f"table inet {_TABLE} {{}}\ndelete table inet {_TABLE}\n" + self.ruleset()
        run("nft", "-f", "-", netns=self.netns, stdin=script)


class HostNetwork:
    """A bridge and the namespaces on it (see the module docstring). ``root``: the rig's folder
    (nothing is written there yet). ``subnet``: the /24's first three octets (default: from the pid)."""

    def __init__(self, root: Path, *, subnet: str | None = None) -> None:
        missing = missing_requirements()
        if missing:
            raise NetworkError("a host network needs " + ", ".join(missing))
        self.root = Path(root)
        pid = os.getpid()
        self._n = next(_counter)
        self.subnet = subnet or _free_subnet(pid, self._n)
        self.bridge = f"mqbr{pid}n{self._n}"
        self.address = f"{self.subnet}.1"  # the test process's own, in the root namespace
        self.hosts: dict[str, NetHost] = {}
        self._pid = pid
        self._closed = False
        self._proxies: list[_ProxyThread] = []
        self._lock = threading.Lock()

    def start(self) -> HostNetwork:
        sweep_stale()
        run("ip", "link", "add", self.bridge, "type", "bridge")
        atexit.register(self.close)
        run("ip", "addr", "add", f"{self.address}/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        return self

    def add_host(self, name: str) -> NetHost:
        """A new namespace joined to the bridge, with the next address of the subnet."""
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,15}", name) or name in self.hosts:
            raise ValueError(f"host name {name!r}: new, lower-case letters, digits and '-' (16 at most)")
        i = len(self.hosts) + 10
        netns = f"{_PREFIX}{self._pid}n{self._n}-{name}"
        k = next(_counter)
        outer, inner = f"mqv{self._pid}x{k}", f"mqi{self._pid}x{k}"
        address = f"{self.subnet}.{i}"
        run("ip", "netns", "add", netns)
        host = NetHost(self, name, address, netns, outer)
        self.hosts[name] = host
        run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        run("ip", "link", "set", inner, "netns", netns)
        run("ip", "link", "set", outer, "master", self.bridge)
        run("ip", "link", "set", outer, "up")
        run("ip", "link", "set", "lo", "up", netns=netns)
        run("ip", "link", "set", inner, "name", "eth0", netns=netns)
        run("ip", "addr", "add", f"{address}/24", "dev", "eth0", netns=netns)
        run("ip", "link", "set", "eth0", "up", netns=netns)
        host._apply()
        return host

    def __getitem__(self, name: str) -> NetHost:
        return self.hosts[name]

    def heal(self) -> None:
        """Lift every host's isolation, cuts and losses, and clear every proxy's faults."""
        for h in self.hosts.values():
            h.heal()
        for p in self._proxies:
            p.proxy.clear()

    def proxy(self, host: NetHost, port: int, *, source: NetHost | None = None, seed: int = 0) -> FaultProxy:
        """mqd's fault proxy (``mqd_dev.chaos.proxy.FaultProxy``, the dev package) inside ``host``,
        in front of its ``port``: new connections to it (from ``source`` only, or from anyone) go
        through the proxy. Transparent until its ``faults`` are set, e.g. delay with jitter::

            p = net.proxy(kafka_host, 9092, source=daemon_host)
            p.faults = Faults(delay=1.0, delay_s=0.2)  # every answer chunk 0.1-0.3 s late

        Put it in place before the clients connect: connections open before keep their path. The
        server must listen on 127.0.0.1 too (0.0.0.0). Returns the ``FaultProxy``."""
        thread = _ProxyThread(host.netns, port, seed)
        thread.begin()
        self._proxies.append(thread)
        host.redirect(source, port, thread.proxy.listen_port)
        return thread.proxy

    def close(self) -> None:
        """Kill every process in the namespaces, delete them and the bridge. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for t in self._proxies:
            t.end()
        for h in self.hosts.values():
            for p in h.processes:
                p.kill_now()
            kill_namespace_processes(h.netns)
            run("ip", "netns", "delete", h.netns, check=False)
            run("ip", "link", "delete", h.veth, check=False)
        run("ip", "link", "delete", self.bridge, check=False)
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)

    def __enter__(self) -> HostNetwork:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _free_subnet(pid: int, n: int) -> str:
    """A /24 under 10.100-249 that no interface of this machine is on (from the pid and ``n``)."""
    used = run("ip", "-o", "-4", "addr", check=False)
    for k in range(150):
        candidate = f"10.{100 + ((pid >> 8) + 37 * n + k) % 150}.{pid % 256}"
        if f" {candidate}." not in used:
            return candidate
    raise NetworkError("no free 10.x.y.0/24 for a host network")


def _setns(netns: str) -> None:
    """Move the calling thread into ``netns`` (sockets it creates afterwards live there)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetworkError(f"setns {netns}: {os.strerror(err)}")
    finally:
        os.close(fd)


class _ProxyThread:
    """A FaultProxy on an event loop of its own, in a thread that joined ``netns``."""

    def __init__(self, netns: str, port: int, seed: int) -> None:
        import asyncio

        from mqd_dev.chaos.proxy import FaultProxy  # the dev package (make install)

        self.netns = netns
        self.proxy = FaultProxy(port, seed=seed)
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"proxy-{netns}-{port}", daemon=True)

    def _main(self) -> None:
        try:
            _setns(self.netns)
            self.loop.run_until_complete(self.proxy.start())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    def begin(self) -> None:
        self._thread.start()
        if not self._ready.wait(10.0) or self._error is not None:
            raise NetworkError(f"the proxy in {self.netns} did not start: {self._error!r}")

    def end(self) -> None:
        import asyncio

        if not self._thread.is_alive():
            return
        fut = asyncio.run_coroutine_threadsafe(self.proxy.stop(), self.loop)
        with contextlib.suppress(Exception):
            fut.result(5.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)


@contextlib.contextmanager
def host_network(root: Path) -> Iterator[HostNetwork]:
    """``with host_network(tmp_path) as net:``: a started :class:`HostNetwork`, closed after."""
    net = HostNetwork(root)
    try:
        yield net.start()
    finally:
        net.close()
