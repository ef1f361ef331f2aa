"""The wheel, as an operator installs it: built the standard way (``python -m build``) from the files git tracks,
installed into a fresh virtual environment, run from a directory that is not the checkout.

The default build compiles the per-request modules (``--version`` says so); with no working C compiler the same
command installs the pure-Python package (``CC=/bin/false`` stands in for a machine without one: the real
compiler cannot be taken off this one). Each wheel serves a real client in front of the real cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from proxy.build_info import COMPILED
from tests.support import REPO

pytestmark = pytest.mark.cluster


def _outside_env(**extra: str) -> dict[str, str]:
    """This environment without PYTHONPATH: a local-master SparkSession earlier in the run sets it to the checkout,
    whose egg-info then tells pip the package is installed already (it installed only the dependencies)."""
    return {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}, **extra}


def _source_copy(dest: Path) -> Path:
    """The files git tracks (no compiled modules an editable install left beside the sources)."""
    dest.mkdir()
    subprocess.run(f"git ls-files -z | tar --null -T - -cf - | tar -xf - -C '{dest}'", shell=True, cwd=REPO, check=True)
    return dest


def _install(tmp: Path, name: str, env: dict[str, str]) -> Path:
    """Build the wheel from a copy of the tree, install it into a new venv; the venv's bin directory."""
    src = _source_copy(tmp / f"src-{name}")
    dist = tmp / f"dist-{name}"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist)],
        cwd=src,
        env=_outside_env(**env),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = dist.glob("*.whl")
    venv = tmp / f"venv-{name}"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=_outside_env())
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
        env=_outside_env(),
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    assert (venv / "bin" / "kafka-throttle-proxy").exists(), pip.stdout[-3000:] + pip.stderr[-3000:]
    return venv / "bin"


def _serves_a_client(bin_dir: Path, cluster, workdir: Path) -> None:
    from confluent_kafka import Consumer, Producer

    proc = subprocess.Popen(
        [
            str(bin_dir / "kafka-throttle-proxy"),
            "run",
            "--bootstrap-server",
            cluster.bootstrap,
            "--bootstrap-port",
            "0",
            "--broker-ports",
            "ephemeral",
        ],
        cwd=workdir,  # not the checkout: only the installed package can be imported
        env=_outside_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert "bootstrap.servers=" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
        bootstrap = line.rsplit("bootstrap.servers=", 1)[1].split()[0]
        topic = f"wheel-{uuid.uuid4().hex[:8]}"
        p = Producer({"bootstrap.servers": bootstrap})
        for i in range(10):
            p.produce(topic, str(i).encode(), partition=0)  # one partition: its order is the test's
        assert p.flush(30) == 0
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest"})
        c.subscribe([topic])
        got: list[bytes] = []
        for _ in range(60):
            m = c.poll(1)
            if m is not None and m.error() is None and (value := m.value()) is not None:
                got.append(value)
            if len(got) == 10:
                break
        c.close()
        assert got == [str(i).encode() for i in range(10)]
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def _version(bin_dir: Path, cwd: Path) -> str:
    """What the installed command's ``--version`` prints, run from outside the checkout."""
    return subprocess.run(
        [str(bin_dir / "kafka-throttle-proxy"), "--version"],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        env=_outside_env(),
    ).stdout


def test_the_wheel_installs_compiled_and_serves_a_client(cluster, tmp_path):
    bin_dir = _install(tmp_path, "compiled", {"KTP_MYPYC": "1"})
    version = _version(bin_dir, tmp_path)
    assert version.startswith("kafka-throttle-proxy 0."), version
    assert f"compiled by mypyc ({len(COMPILED)} modules)" in version, version
    _serves_a_client(bin_dir, cluster, tmp_path)


def test_without_a_compiler_the_same_build_installs_pure_python(cluster, tmp_path):
    bin_dir = _install(tmp_path, "pure", {"KTP_MYPYC": "1", "CC": "/bin/false"})
    version = _version(bin_dir, tmp_path)
    assert "pure Python" in version, version
    _serves_a_client(bin_dir, cluster, tmp_path)
