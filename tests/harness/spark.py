"""A real Spark standalone cluster on loopback: one master, one worker, the worker in a Python of its own.

Why this shape: an operator's Spark workers have their own Python, with pyspark and the data libraries but not
this repository or its other dependencies (PyYAML, mmh3, kafka-python...). The worker's interpreter here is a
fresh virtual environment whose only packages are pyspark, py4j, pandas, numpy and pyarrow (linked from this
environment's site-packages, so nothing is downloaded), and the worker runs in a temporary directory: an
executor that imports anything else of the repository, or of its requirements, fails as it would on a real
cluster. Master and worker are pyspark's own ``spark-class`` launchers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
import venv
from pathlib import Path

from tests.harness.cluster import free_port

WORKER_PACKAGES = ("pyspark", "py4j", "pandas", "numpy", "numpy.libs", "pyarrow", "dateutil", "pytz", "tzdata")
"""What a Spark worker's Python has: pyspark and the packages the job names (spark_analysis.job), with their own
requirements; nothing else."""


def bare_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would let a worker's Python see this checkout or this venv
    (a local-master SparkSession earlier in the same process sets PYTHONPATH and PYSPARK_PYTHON)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    env.update(extra)
    return env


def worker_python(root: Path) -> Path:
    """A virtual environment with only :data:`WORKER_PACKAGES` importable; returns its interpreter."""
    env = root / "worker-venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    here = Path(sysconfig.get_paths()["purelib"])
    lib = root / "worker-packages"
    lib.mkdir()
    for name in WORKER_PACKAGES:
        if (here / name).exists():
            (lib / name).symlink_to(here / name)
    python = env / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "worker-packages.pth").write_text(str(lib) + "\n")
    return python


class SparkStandalone:
    """``with SparkStandalone(tmp) as spark: spark.master`` is a ``spark://`` URL with one live worker whose
    executors run ``spark.python``."""

    def __init__(self, root: Path, cores: int = 2, memory: str = "1g") -> None:
        self.root = root
        self.cores, self.memory = cores, memory
        self.python = worker_python(root)
        self.port = free_port()
        self.master = f"spark://127.0.0.1:{self.port}"
        self.work = root / "worker-work"
        self._procs: list[subprocess.Popen] = []

    def _launch(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        spark_home = Path(sysconfig.get_paths()["purelib"]) / "pyspark"
        full_env = bare_env(
            SPARK_HOME=str(spark_home),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(self.root),
            SPARK_NO_DAEMONIZE="1",
            **(env or {}),
        )
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [str(spark_home / "bin" / "spark-class"), *args],
            cwd=self.root,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self._procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def __enter__(self) -> SparkStandalone:
        self.work.mkdir()
        self._launch(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(free_port()),
        )
        self._wait("master", "Starting Spark master")
        self._launch(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--work-dir",
            str(self.work),
            "--webui-port",
            str(free_port()),
            self.master,
            env={"PYSPARK_PYTHON": str(self.python)},
        )
        self._wait("master", "Registering worker")
        return self

    def _wait(self, name: str, needle: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log(name):
                return
            if any(p.poll() is not None for p in self._procs):
                break
            time.sleep(0.25)
        raise RuntimeError(f"Spark {name} did not say {needle!r}:\n{self.log(name)[-3000:]}")

    def executor_logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.work.rglob("stderr"))

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self._procs):
            proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":  # manual check: python -m tests.harness.spark
    import tempfile

    with SparkStandalone(Path(tempfile.mkdtemp())) as s:
        print(s.master, s.python, file=sys.stderr)
