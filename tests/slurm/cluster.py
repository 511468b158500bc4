"""A real single-node Slurm cluster for the tests: munged, slurmctld and slurmd as our own processes.

Everything lives in one temporary directory with a generated slurm.conf on free ports, named
by SLURM_CONF for the daemons and for every sbatch/squeue/scancel the tests (and the stack's
scripts) run; no system-wide Slurm or munge configuration or service is touched.

The node declares more CPUs than the machine has (SlurmdParameters=config_overrides): the
service's jobs are I/O-bound and a test runs a dozen of them at once on two cores, each still
asking for its CPUs the way it does in production. Memory is not a consumable (CR_Core).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

NODE_CPUS = 64
GRACE_TIME_S = 30
BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SlurmCluster:
    def __init__(self, root: Path, kill_wait_s: int = 10) -> None:
        self.root = root
        self.kill_wait_s = kill_wait_s
        self.node = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons: list[tuple[str, subprocess.Popen[bytes]]] = []

    # --- start ------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> SlurmCluster:
        try:
            self._start_munge()
            self._write_conf()
            for daemon in ("slurmctld", "slurmd"):
                self._spawn(daemon, [daemon, "-D", "-f", str(self.conf)])
            self._wait_node_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self) -> None:
        # munged insists on a private key directory and key owned by its user, and a socket
        # directory everyone may enter; it runs as the munge user, not root.
        keys, run = self.root / "munge", self.root / "run"
        for path, mode in ((keys, 0o700), (run, 0o755)):
            path.mkdir(parents=True)
            shutil.chown(path, "munge", "munge")
            path.chmod(mode)
        key = keys / "munge.key"
        subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True, capture_output=True)
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
        self.munge_socket = run / "munge.socket"
        argv = [
            "munged",
            "--foreground",
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
            f"--pid-file={run / 'munged.pid'}",
            f"--log-file={keys / 'munged.log'}",
            f"--seed-file={keys / 'seed'}",
        ]
        self._spawn("munged", argv, user="munge")
        self._wait(lambda: self.munge_socket.exists(), 15, "munged's socket")

    def _write_conf(self) -> None:
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(exist_ok=True)
        self.partition = "rollouts"
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=rolloutstest",
                    f"SlurmctldHost={self.node}(127.0.0.1)",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "SlurmUser=root",  # the tests run as root here
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    f"StateSaveLocation={self.root / 'state'}",
                    f"SlurmdSpoolDir={self.root / 'spool'}",
                    f"SlurmctldPidFile={self.root / 'run' / 'slurmctld.pid'}",
                    f"SlurmdPidFile={self.root / 'run' / 'slurmd.pid'}",
                    f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={self.root / 'log' / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "SwitchType=switch/none",
                    "MpiDefault=none",
                    "SchedulerType=sched/builtin",
                    # A job whose `after` dependency was just met waits for the main scheduling loop
                    # (60 s by default); 2 s keeps the whole-stack test short.
                    "SchedulerParameters=sched_interval=2",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "SlurmdParameters=config_overrides",
                    "ReturnToService=2",
                    f"KillWait={self.kill_wait_s}",
                    "MinJobAge=600",
                    "InactiveLimit=0",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} RealMemory=2048 State=UNKNOWN",
                    # Jobs in `urgent` preempt the service's; those get their --signal (B:TERM) at once
                    # and GraceTime to go, as docs/OPERATIONS.md asks sites to configure.
                    "PreemptType=preempt/partition_prio",
                    "PreemptMode=CANCEL",
                    "SlurmctldParameters=preempt_send_user_signal",
                    f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP"
                    f" PriorityTier=1 GraceTime={GRACE_TIME_S}",
                    f"PartitionName=urgent Nodes={self.node} MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF",
                    "",
                ]
            )
        )

    def _spawn(self, name: str, argv: list[str], user: str | None = None) -> None:
        with open(self.root / f"{name}.out", "ab") as log:
            process = subprocess.Popen(
                argv,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                user=user,
                group=user,
                extra_groups=[] if user else None,
                start_new_session=True,
            )
        self._daemons.append((name, process))

    def _wait_node_idle(self, timeout: float) -> None:
        def idle() -> bool:
            for name, process in self._daemons:
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited ({process.returncode}); see {self.root}/{name}.out")
            out = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout
            return set(out.split()) == {"idle"}  # one line per partition

        self._wait(idle, timeout, "the node to be idle")

    @staticmethod
    def _wait(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.2)

    # --- use --------------------------------------------------------------
    def run(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        check: bool = True,
        cwd: Path | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            argv, env={**self.env, **(env or {})}, capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr or result.stdout}")
        return result

    def sbatch(
        self, script: Path | None, *options: str, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> str:
        """Submit `script` (None with a --wrap option); returns the job id."""
        argv = ["sbatch", "--parsable", *options, *([str(script)] if script else [])]
        out = self.run(argv, env=env, cwd=cwd).stdout
        return out.strip().split(";")[0]

    def tasks(self, job_id: str) -> dict[str, str]:
        """Task id ("123_4", or "123") -> state, for what is still in the queue."""
        out = self.run(["squeue", "-h", "-j", job_id, "-o", "%i %T"], check=False).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def job_state(self, job_id: str) -> str:
        """JobState of one job or array task ("123_4"), finished ones included (MinJobAge)."""
        out = self.run(["scontrol", "-o", "show", "job", job_id]).stdout
        return next(field.split("=", 1)[1] for field in out.split() if field.startswith("JobState="))

    # --- stop -------------------------------------------------------------
    def stop(self) -> None:
        """Cancel what is left, then stop the daemons: slurmd, slurmctld, munged."""
        if any(name == "slurmctld" and p.poll() is None for name, p in self._daemons):
            self.run(["scancel", "--partition", getattr(self, "partition", "rollouts")], check=False)
            deadline = time.monotonic() + self.kill_wait_s + 10
            while time.monotonic() < deadline and self.run(["squeue", "-h"], check=False).stdout.strip():
                time.sleep(0.5)
        for _name, process in reversed(self._daemons):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self._daemons.clear()
