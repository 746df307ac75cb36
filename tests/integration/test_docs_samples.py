"""Every code sample of the docs site runs here against a real Redis, so none can rot.

A sample is written in its page, as a complete program (issue #22: a page reads on a code
host as on the site): a ```python block that reads ``os.environ.get("REDIS_URL"``, or a
```bash block that uses ``$REDIS_URL``, runs as it stands in the Markdown. The pages that
show parts of one program (outbox.md, sqlalchemy.md, django.md, the migration guides) still
include sections of files under docs/snippets/ (pymdownx.snippets), which run as files. Each
runs as a user runs it, in a subprocess, on an empty private redis-server of its own (samples
use the default prefix and plain names like "orders"), with ``REDIS_URL`` pointing there.
docs/snippets/foreign/ holds the other libraries' code (Celery, RQ, arq, BullMQ, Redisson) the
migration guides show beside delayq's; it is shown, never run.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayq.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SNIPPETS = DOCS / "snippets"
FOREIGN = SNIPPETS / "foreign"
PYTHON_SAMPLES = sorted(SNIPPETS.glob("*.py"))
SHELL_SAMPLES = sorted(SNIPPETS.glob("*.sh"))
INCLUDE = re.compile(r'--8<--\s+"([^"]+)"')
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
CODE = {"python", "py", "pycon", "bash", "sh", "shell", "javascript", "js", "java"}
SECTION = re.compile(r"^# --8<-- \[start:(\w+)\]$", re.MULTILINE)


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if SNIPPETS not in p.parents)


def included() -> set[Path]:
    """Every snippet file a page includes (``--8<-- "name.py"`` or ``"name.py:section"``)."""
    found = set()
    for page in pages():
        for target in INCLUDE.findall(page.read_text()):
            found.add(SNIPPETS / target.split(":", 1)[0])
    return found


@pytest.fixture
def empty_redis_url(redis7_server: EmbeddedRedis) -> Iterator[str]:
    """A fresh server for each sample, which sees an empty Redis as the docs assume. One
    version suffices: the samples test the docs; the rest of the suite covers the versions."""
    with EmbeddedRedis(redis7_server.binary) as server:
        yield server.url


def run_sample(command: list[str], url: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "REDIS_URL": url,
        "COLUMNS": "100",
        "METRICS_PORT": "0",  # the metrics sample binds a free port, not the 9809 it shows
        "DELAYQ_DASHBOARD_TOKEN": secrets.token_urlsafe(24),
    }
    # The `delayq` command of this interpreter's environment comes first on PATH.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        command, cwd=SNIPPETS, env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("sample", PYTHON_SAMPLES, ids=lambda p: p.name)
def page_programs() -> list[tuple[str, str, str]]:
    """(page:line, language, program) of every sample written out in a page."""
    found = []
    for page in pages():
        text = page.read_text()
        for match in FENCE.finditer(text):
            lang, body = match.group(1), match.group(2)
            runs = (lang == "python" and 'os.environ.get("REDIS_URL"' in body) or (
                lang == "bash" and "$REDIS_URL" in body
            )
            if runs:
                line = text.count("\n", 0, match.start()) + 1
                found.append((f"{page.relative_to(DOCS)}:{line}", lang, body))
    return found


PAGE_PROGRAMS = page_programs()


@pytest.mark.parametrize(
    ("where", "lang", "program"), PAGE_PROGRAMS, ids=[p[0] for p in PAGE_PROGRAMS]
)
def test_page_sample_runs(where: str, lang: str, program: str, empty_redis_url: str) -> None:
    if lang == "python":
        done = run_sample([sys.executable, "-c", program], empty_redis_url)
    else:
        done = run_sample(["bash", "-euo", "pipefail", "-c", program], empty_redis_url)
    assert done.returncode == 0, f"{where}:\n{done.stdout}{done.stderr}"


def test_pages_hold_their_samples() -> None:
    assert len(PAGE_PROGRAMS) >= 20  # index, concepts, getting-started, ha, operations


@pytest.mark.parametrize("sample", PYTHON_SAMPLES, ids=lambda p: p.name)
def test_python_sample_runs(sample: Path, empty_redis_url: str) -> None:
    done = run_sample([sys.executable, str(sample)], empty_redis_url)
    assert done.returncode == 0, f"{sample.name}:\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize("sample", SHELL_SAMPLES, ids=lambda p: p.name)
def test_shell_sample_runs(sample: Path, empty_redis_url: str) -> None:
    done = run_sample(["bash", "-euo", "pipefail", str(sample)], empty_redis_url)
    assert done.returncode == 0, f"{sample.name}:\n{done.stdout}{done.stderr}"


def test_samples_exist() -> None:
    assert len(PYTHON_SAMPLES) >= 5


def test_every_sample_is_shown_on_a_page_and_every_include_exists() -> None:
    runnable = runnable_texts()
    shown = included() | {runnable[body] for _, _, body in code_blocks() if body in runnable}
    samples = {*PYTHON_SAMPLES, *SHELL_SAMPLES, *FOREIGN.iterdir()}
    assert not sorted(p.name for p in samples - shown), "samples no page includes"
    assert not sorted(str(p) for p in shown if not p.is_file()), "includes of missing files"


def runnable_texts() -> dict[str, Path]:
    """The text of every run sample and of each of its sections (as a page may copy it) ->
    the sample."""
    texts = {}
    for sample in (*PYTHON_SAMPLES, *SHELL_SAMPLES):
        text = sample.read_text()
        texts[text.strip()] = sample
        for name in SECTION.findall(text):
            body = text.split(f"# --8<-- [start:{name}]\n", 1)[1]
            texts[body.split(f"# --8<-- [end:{name}]", 1)[0].strip()] = sample
    return texts


def code_blocks() -> Iterator[tuple[Path, str, str]]:
    """(page, language, body) of every fenced block of the docs."""
    for page in pages():
        for lang, body in FENCE.findall(page.read_text()):
            yield page, lang, body.strip()


def test_every_code_sample_on_a_page_is_a_sample_that_runs() -> None:
    # A page includes its samples (--8<--), or, where it is also read outside the site (the
    # pages the README links to), holds an exact copy of a sample or a section of one.
    # Console transcripts, configuration and diagrams are not code samples.
    runnable = runnable_texts() | {body.strip(): DOCS for _, _, body in PAGE_PROGRAMS}
    stray = [
        f"{page.relative_to(DOCS)}: {body.splitlines()[0]}"
        for page, lang, body in code_blocks()
        if lang in CODE and not INCLUDE.fullmatch(body) and body not in runnable
    ]
    assert not stray, f"code samples that no test runs: {stray}"


def test_foreign_samples_are_marked_as_not_run() -> None:
    for sample in FOREIGN.iterdir():
        first = sample.read_text().splitlines()[0]
        assert "NOT run by delayq's tests" in first, sample.name


def test_samples_take_redis_from_the_environment() -> None:
    # Never the machine's own Redis: a sample that hard-codes a URL would bypass REDIS_URL.
    for sample in PYTHON_SAMPLES:
        text = sample.read_text()
        assert 'os.environ.get("REDIS_URL"' in text, sample.name
        assert text.count("redis://") == 1, f"{sample.name} names a Redis URL of its own"
    for where, lang, program in PAGE_PROGRAMS:
        if lang == "python":
            assert program.count("redis://") == 1, f"{where} names a Redis URL of its own"
