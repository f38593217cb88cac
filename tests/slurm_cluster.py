"""A real one-node SLURM cluster on this machine, for the cluster path's end-to-end tests and for
people who want to try ``+cluster=slurm`` here (``make slurm-up`` / ``make slurm-down``).

munged, slurmctld and slurmd (Debian's ``munge`` and ``slurm-wlm``) run as root with every file in
one directory: a munge key and socket, slurm.conf (one node with this machine's CPUs and memory,
one partition, no cgroups: ``proctrack/linuxproc``, ``task/none``), the state and spool
directories, pid files and logs; the ports are free ones, so the host's own SLURM (if any) is not
touched. Where ``slurmdbd`` and ``mariadb-server`` are installed, a MariaDB of that directory and
slurmdbd keep the jobs' accounting, so that ``sacct`` (which submitit asks for a job's end) knows a
cancelled or timed-out job. Client commands find the cluster through ``SLURM_CONF``
(``Cluster.env``). ``stop`` cancels every job, then stops the daemons and waits until none runs.

    python -m tests.slurm_cluster up DIR      # prints: export SLURM_CONF=DIR/slurm.conf
    python -m tests.slurm_cluster down DIR
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SLURM = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel", "scontrol", "srun")
ACCOUNTING = ("mariadb-install-db", "mariadbd", "slurmdbd", "sacct")
PACKAGES = ("munge", "slurm-wlm", "slurmdbd", "mariadb-server")
"""Debian's packages of the cluster (the last two for the accounting)."""
DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd", "slurmstepd")
"""The processes of a cluster, in the order they start (slurmstepd: a job step's, from slurmd)."""
PARTITION = "memsweep"
START_S = 90.0
"""How long the daemons may take to bring the node up (seconds)."""


def find(name: str) -> str | None:
    """The path of a SLURM, munge or MariaDB program, on the PATH or in /usr/sbin."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")


def unavailable() -> str | None:
    """Why no cluster can be started here (a line), or None when it can."""
    if sys.platform != "linux":
        return "SLURM runs on Linux only"
    if os.geteuid() != 0:
        return "starting munged, slurmctld and slurmd here needs root (they run as SlurmUser=root)"
    missing = [n for n in SLURM if find(n) is None]
    if missing:
        return f"{', '.join(missing)} not installed (Debian: apt-get install munge slurm-wlm; .ci/run installs them)"
    return None


def accounting() -> bool:
    """Whether the job accounting (MariaDB and slurmdbd) can run here."""
    return all(find(n) is not None for n in ACCOUNTING)


def install() -> str | None:
    """Install PACKAGES with apt-get where SLURM is missing and this user may; returns why no
    cluster can start (a line), or None."""
    if unavailable() is None:
        return None
    if os.geteuid() == 0 and shutil.which("apt-get") is not None:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=900)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
            env=env,
            capture_output=True,
            timeout=900,
        )
    return unavailable()


def free_port() -> int:
    """A TCP port free on this host now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_resources() -> tuple[int, int]:
    """This machine's CPUs (usable by this process) and nine tenths of its memory (MiB)."""
    cpus = len(os.sched_getaffinity(0))
    with open("/proc/meminfo") as f:
        mem_kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return cpus, mem_kib // 1024 * 9 // 10


def slurm_conf(root: Path, host: str, ports: dict[str, int], cpus: int, mem_mib: int) -> str:
    """slurm.conf of a one-node cluster whose files all lie under ``root``; with ``ports["dbd"]``,
    its accounting goes to slurmdbd there."""
    if "dbd" in ports:
        storage = [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=localhost",
            f"AccountingStoragePort={ports['dbd']}",
            f"AccountingStoragePass={root / 'munge.socket'}",
        ]
    else:
        storage = ["AccountingStorageType=accounting_storage/none"]
    return "\n".join(
        [
            "ClusterName=memsweep",
            f"SlurmctldHost={host}",
            f"SlurmctldPort={ports['ctld']}",
            f"SlurmdPort={ports['d']}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={root / 'munge.socket'}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd.pid'}",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'slurmd.log'}",
            f"PlugStackConfig={root / 'plugstack.conf'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            *storage,
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "ReturnToService=2",
            "KillWait=5",
            "MinJobAge=600",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mib} State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes={host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def slurmdbd_conf(root: Path, ports: dict[str, int]) -> str:
    """slurmdbd.conf: slurmdbd on ``ports["dbd"]``, its database the MariaDB on ``ports["db"]``."""
    return "\n".join(
        [
            "AuthType=auth/munge",
            f"AuthInfo=socket={root / 'munge.socket'}",
            "DbdHost=localhost",
            f"DbdPort={ports['dbd']}",
            "SlurmUser=root",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={ports['db']}",
            "StorageUser=root",
            "StorageLoc=slurm_acct_db",
            f"LogFile={root / 'slurmdbd.log'}",
            f"PidFile={root / 'slurmdbd.pid'}",
            "",
        ]
    )


@dataclass(frozen=True)
class Cluster:
    """A cluster's directory; ``env`` is what a client command needs (``SLURM_CONF``)."""

    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def accounted(self) -> bool:
        """Whether this cluster keeps the jobs' accounting (sacct answers)."""
        return (self.root / "slurmdbd.conf").exists()

    def client(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a SLURM client command (``squeue -h``) against this cluster, output as text."""
        return subprocess.run(
            [find(argv[0]) or argv[0], *argv[1:]], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def node_state(self) -> str:
        """The node's state as sinfo prints it (``idle``, ``alloc``, ``down*``), "" when none."""
        proc = self.client("sinfo", "-h", "-N", "-o", "%t")
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def jobs(self) -> list[str]:
        """The ids of the jobs the controller holds (pending, running, completing); none when the
        controller does not run."""
        if "slurmctld" not in self.processes():
            return []
        proc = self.client("squeue", "-h", "-o", "%i")
        return proc.stdout.split() if proc.returncode == 0 else []

    def processes(self) -> dict[str, list[int]]:
        """This cluster's live processes (not zombies) by name: those of DAEMONS whose command
        line or environment names this directory."""
        found: dict[str, list[int]] = {}
        mark = str(self.root).encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                name = (proc / "comm").read_text().strip()
                if name not in DAEMONS or (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
                if mark in (proc / "cmdline").read_bytes() or mark in (proc / "environ").read_bytes():
                    found.setdefault(name, []).append(int(proc.name))
            except OSError:
                continue
        return found

    def logs(self) -> str:
        """The end of every daemon's log, for a failure's message."""
        parts = []
        for log in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.err")):
            parts.append(f"--- {log}\n" + log.read_text(errors="replace")[-1500:])
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel every job, wait until the controller holds none, stop the daemons one by one
        (SIGTERM, SIGKILL after 15 s), and wait until none of them runs."""
        if self.jobs():
            self.client("scancel", "--full", "--user=root")
            deadline = time.monotonic() + 30
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.5)
        for name in reversed(DAEMONS):
            for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
                pids = self.processes().get(name, [])
                for pid in pids:
                    with_ignored(os.kill, pid, sig)
                deadline = time.monotonic() + wait_s
                while pids and name in self.processes() and time.monotonic() < deadline:
                    time.sleep(0.2)


def with_ignored(call, *args) -> None:
    """``call(*args)``, a process already gone not being an error."""
    try:
        call(*args)
    except ProcessLookupError:
        pass


def daemon(cluster: Cluster, name: str, argv: list[str]) -> subprocess.Popen:
    """Start one daemon in the foreground of its own session, its stderr in ``root/NAME.err``."""
    with open(cluster.root / f"{name}.err", "ab") as err:
        return subprocess.Popen(
            [find(name) or name, *argv],
            env=cluster.env,
            cwd=cluster.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )


def wait_for(what: str, ready, procs: list[subprocess.Popen], timeout: float) -> None:
    """Poll ``ready()`` until true; raise RuntimeError naming ``what`` when a daemon of ``procs``
    exited or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while not ready():
        dead = [p.args[0] for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(
                f"{what}: not ready after {timeout:.0f} s" + (f" ({', '.join(dead)} exited)" if dead else "")
            )
        time.sleep(0.3)


def start_accounting(cluster: Cluster, ports: dict[str, int]) -> list[subprocess.Popen]:
    """MariaDB (a fresh data directory, no grant tables, on 127.0.0.1) and slurmdbd."""
    root, data = cluster.root, cluster.root / "db"
    if not data.exists():
        init = [find("mariadb-install-db") or "", f"--datadir={data}", "--user=root", "--skip-test-db"]
        proc = subprocess.run(init + ["--auth-root-authentication-method=normal"], capture_output=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"mariadb-install-db exited {proc.returncode}: {proc.stderr[-800:]!r}")
    (root / "slurmdbd.conf").write_text(slurmdbd_conf(root, ports))
    (root / "slurmdbd.conf").chmod(0o600)
    db = daemon(
        cluster,
        "mariadbd",
        ["--no-defaults", f"--datadir={data}", f"--socket={root / 'mysql.sock'}", f"--port={ports['db']}"]
        + ["--bind-address=127.0.0.1", "--user=root", f"--pid-file={root / 'mariadbd.pid'}"]
        + [f"--log-error={root / 'mariadbd.log'}", "--skip-grant-tables", "--innodb-buffer-pool-size=16M"],
    )
    wait_for("mariadbd", lambda: (root / "mysql.sock").exists(), [db], START_S)
    dbd = daemon(cluster, "slurmdbd", ["-D"])
    wait_for("slurmdbd", lambda: "started" in read(root / "slurmdbd.log"), [db, dbd], START_S)
    return [db, dbd]


def read(path: Path) -> str:
    """A file's text, "" when it is missing."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def start(root: Path) -> Cluster:
    """Write a one-node cluster's files under ``root``, start munged (and the accounting, where
    it is installed), slurmctld and slurmd, and wait until sinfo shows the node idle.

    Raises:
        RuntimeError: a daemon did not start, or the node was not idle within START_S seconds
            (the daemons are stopped again; the message holds the ends of their logs).
    """
    root = Path(root).absolute()
    for sub in ("state", "spool"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    cluster = Cluster(root)
    cluster.stop()  # an earlier cluster of this directory
    host = socket.gethostname().split(".")[0]
    ports = {"ctld": free_port(), "d": free_port()}
    if accounting():
        ports.update(dbd=free_port(), db=free_port())
    (root / "plugstack.conf").write_text("")
    cluster.conf.write_text(slurm_conf(root, host, ports, *node_resources()))
    key = root / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    try:
        munge = [f"--key-file={key}", f"--socket={root / 'munge.socket'}", f"--pid-file={root / 'munged.pid'}"]
        munge += [f"--log-file={root / 'munged.log'}", f"--seed-file={root / 'munged.seed'}", "--force"]
        procs = [daemon(cluster, "munged", ["-F", *munge])]
        wait_for("munged", lambda: (root / "munge.socket").exists(), procs, START_S)
        if "dbd" in ports:
            procs += start_accounting(cluster, ports)
        procs.append(daemon(cluster, "slurmctld", ["-D", "-c", "-f", str(cluster.conf)]))
        procs.append(daemon(cluster, "slurmd", ["-D", "-f", str(cluster.conf), "-N", host]))
        wait_for("the node (sinfo: idle)", lambda: cluster.node_state() == "idle", procs, START_S)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        logs = cluster.logs()
        cluster.stop()
        raise RuntimeError(f"{exc}\n{logs}") from None
    return cluster


def main(argv: list[str]) -> int:
    """``up DIR`` (installing PACKAGES first where SLURM is missing) or ``down DIR``."""
    if len(argv) != 2 or argv[0] not in ("up", "down"):
        print("usage: python -m tests.slurm_cluster up DIR | down DIR", file=sys.stderr)
        return 2
    cluster = Cluster(Path(argv[1]).absolute())
    if argv[0] == "down":
        cluster.stop()
        left = cluster.processes()
        print(f"memsweep: the SLURM cluster of {argv[1]} is stopped" + (f"; still running: {left}" if left else ""))
        return 1 if left else 0
    why = install()
    if why:
        print(f"memsweep: no SLURM cluster here: {why}", file=sys.stderr)
        return 1
    start(cluster.root)
    accounted = "with" if cluster.accounted else "without"
    print(
        f"memsweep: a one-node SLURM cluster runs (partition {PARTITION}, {accounted} accounting); its commands need:"
    )
    print(f"export SLURM_CONF={cluster.conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
