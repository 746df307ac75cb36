"""Every code sample of the docs site runs here against a real Redis, so none can rot.

A sample is written in its page, as a complete program (issue #22: a page reads on a code
host as on the site): a ```python block that reads ``os.environ.get("REDIS_URL"``, or a
```bash block that uses ``$REDIS_URL``, runs as it stands in the Markdown.

A page may also show files: a block with ``title="path"`` (```python title="shop/tasks.py")
is that file, and blocks with the same title are one file shown in parts, joined in page
order. A page's files are written into the directory its programs run in, so a program
imports them; a file that reads ``os.environ.get("REDIS_URL"`` is a program itself, run as
``python path`` (outbox.md, sqlalchemy.md and django.md show their programs this way).

Each runs as a user runs it, in a subprocess, in a fresh directory, on an empty private
redis-server of its own (samples use the default prefix and plain names like "orders"), with
``REDIS_URL`` pointing there; one that names ``DATABASE_URL`` gets a PostgreSQL database of
its own there (created on the local server, dropped afterwards), as does one beside a page
file that names it.

Two kinds of block are shown and not run here. A web application that needs its server
(embedding.md: FastAPI under uvicorn, Flask under gunicorn) is an exact copy of a section of
its file under examples/, which tests/integration/test_embedding.py serves. The other
libraries' code the migration guides show beside delayq's (Celery, RQ, arq, BullMQ,
Redisson) opens with a line saying it is ``NOT run by delayq's tests``.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from delayq.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SNIPPETS = DOCS / "snippets"
# Run by other tests (test_embedding.py serves them); a page shows their sections, copied.
SERVED_EXAMPLES = sorted((ROOT / "examples" / "embedding").glob("*.py"))
PYTHON_SAMPLES = sorted(SNIPPETS.glob("*.py"))
INCLUDE = re.compile(r'--8<--\s+"([^"]+)"')
FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
# A block titled with a file's path (a name with an extension) is that file; other titles
# ("delayq", "Celery (not run)") only label a block.
TITLE = re.compile(r'\btitle="([\w./-]+\.\w+)"')
READS_REDIS = 'os.environ.get("REDIS_URL"'
PG_ADMIN_DSN = os.environ.get("DELAYQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
CODE = {"python", "py", "pycon", "bash", "sh", "shell", "javascript", "js", "java"}
SECTION = re.compile(r"^# --8<-- \[start:(\w+)\]$", re.MULTILINE)
NOT_RUN = "NOT run by delayq's tests"
NOT_RUN_TITLE = re.compile(r'^```\w+ title="[^"]*\(not run\)"\n([^\n]*)', re.MULTILINE)
# The pages whose includes are still to be written out (issue #22).


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


def run_sample(
    command: list[str], url: str, cwd: Path = SNIPPETS, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        **(extra or {}),
        "REDIS_URL": url,
        "COLUMNS": "100",
        "METRICS_PORT": "0",  # the metrics sample binds a free port, not the 9809 it shows
        "DELAYQ_DASHBOARD_TOKEN": secrets.token_urlsafe(24),
    }
    # The `delayq` command of this interpreter's environment comes first on PATH.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


@dataclass(frozen=True)
class PageProgram:
    """A program written in a page: a block, or one of the page's files (``path``)."""

    where: str  # page:line of its (first) block
    lang: str
    text: str
    path: str | None = None  # the file it is, run as ``python path``
    files: dict[str, str] = field(default_factory=dict)  # the page's files, beside it


def page_files(text: str) -> dict[str, tuple[int, str]]:
    """The files a page shows (``title="path"`` blocks, one title's blocks joined in page
    order): path -> (line of its first block, text)."""
    files: dict[str, tuple[int, str]] = {}
    for match in FENCE.finditer(text):
        title = TITLE.search(match.group(2))
        if title is not None:
            line, before = files.get(title.group(1), (text.count("\n", 0, match.start()) + 1, ""))
            files[title.group(1)] = (line, before + match.group(3))
    return files


def page_programs() -> list[PageProgram]:
    """Every program written out in a page (a block or a file that runs, see above)."""
    found = []
    for page in pages():
        text = page.read_text()
        name = page.relative_to(DOCS)
        files = {path: body for path, (_, body) in page_files(text).items()}
        for match in FENCE.finditer(text):
            lang, body = match.group(1), match.group(3)
            if TITLE.search(match.group(2)):
                continue  # a part of a file, run below if the file is a program
            if (lang == "python" and READS_REDIS in body) or (
                lang == "bash" and "$REDIS_URL" in body
            ):
                line = text.count("\n", 0, match.start()) + 1
                found.append(PageProgram(f"{name}:{line}", lang, body, files=files))
        for path, (line, body) in page_files(text).items():
            if path.endswith(".py") and READS_REDIS in body:
                found.append(PageProgram(f"{name}:{line}", "python", body, path, files))
    return found


PAGE_PROGRAMS = page_programs()


@contextlib.contextmanager
def private_database() -> Iterator[str]:
    """A PostgreSQL database of a sample's own, on the local server; dropped afterwards."""
    psycopg = pytest.importorskip("psycopg")
    name = f"delayq_sample_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"this sample needs PostgreSQL at {PG_ADMIN_DSN}: {exc}", pytrace=False)
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_ADMIN_DSN.rpartition('/')[0]}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize("program", PAGE_PROGRAMS, ids=[p.where for p in PAGE_PROGRAMS])
def test_page_sample_runs(program: PageProgram, empty_redis_url: str, tmp_path: Path) -> None:
    for path, body in program.files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(body)
    if program.path is not None:
        command = [sys.executable, program.path]
    elif program.lang == "python":
        command = [sys.executable, "-c", program.text]
    else:
        command = ["bash", "-euo", "pipefail", "-c", program.text]
    with contextlib.ExitStack() as stack:
        extra = {}
        if any("DATABASE_URL" in text for text in (program.text, *program.files.values())):
            extra["DATABASE_URL"] = stack.enter_context(private_database())
        done = run_sample(command, empty_redis_url, tmp_path, extra)
    assert done.returncode == 0, f"{program.where}:\n{done.stdout}{done.stderr}"


def test_pages_hold_their_samples() -> None:
    # index, concepts, getting-started, ha, operations, limits, schedules, the migration
    # guides, and the outbox pages' files
    assert len(PAGE_PROGRAMS) >= 35
    where = {program.where.split(":")[0] for program in PAGE_PROGRAMS}
    assert {"limits.md", "schedules.md", "migration/celery.md", "migration/redisson.md"} <= where
    by_file = {p.where.split(":")[0] for p in PAGE_PROGRAMS if p.path is not None}
    assert {"outbox.md", "sqlalchemy.md", "django.md"} <= by_file


def test_no_page_includes_snippets() -> None:
    including = {str(p.relative_to(DOCS)) for p in pages() if INCLUDE.search(p.read_text())}
    assert not including, sorted(including)


def test_a_page_file_shown_in_parts_is_joined_in_page_order() -> None:
    text = (
        'Intro.\n\n```python title="app.py"\nimport os\n```\n\nThen:\n\n'
        '```python title="lib/x.py"\nX = 1\n```\n\n```python title="app.py"\nprint(os.sep)\n```\n'
    )
    assert page_files(text) == {
        "app.py": (3, "import os\nprint(os.sep)\n"),
        "lib/x.py": (9, "X = 1\n"),
    }


@pytest.mark.parametrize("sample", PYTHON_SAMPLES, ids=lambda p: p.name)
def test_python_sample_runs(sample: Path, empty_redis_url: str) -> None:
    done = run_sample([sys.executable, str(sample)], empty_redis_url)
    assert done.returncode == 0, f"{sample.name}:\n{done.stdout}{done.stderr}"


def test_samples_exist() -> None:
    assert len(PYTHON_SAMPLES) >= 2  # the dashboard's ASGI app and metrics from Python


def test_every_sample_is_shown_on_a_page_and_every_include_exists() -> None:
    runnable = runnable_texts()
    shown = included() | {runnable[body] for _, _, body, _ in code_blocks() if body in runnable}
    samples = {*PYTHON_SAMPLES, *SERVED_EXAMPLES}
    assert not sorted(p.name for p in samples - shown), "samples no page includes"
    assert not sorted(str(p) for p in shown if not p.is_file()), "includes of missing files"


def runnable_texts() -> dict[str, Path]:
    """The text of every sample run as a file (here, or served by test_embedding.py) and of
    each of its sections (as a page may copy it) -> the sample."""
    texts = {}
    for sample in (*PYTHON_SAMPLES, *SERVED_EXAMPLES):
        text = sample.read_text()
        texts[text.strip()] = sample
        for name in SECTION.findall(text):
            body = text.split(f"# --8<-- [start:{name}]\n", 1)[1]
            texts[body.split(f"# --8<-- [end:{name}]", 1)[0].strip()] = sample
    return texts


def code_blocks() -> Iterator[tuple[Path, str, str, bool]]:
    """(page, language, body, whether it is a part of one of the page's files) of every
    fenced block of the docs."""
    for page in pages():
        for lang, info, body in FENCE.findall(page.read_text()):
            yield page, lang, body.strip(), TITLE.search(info) is not None


def test_every_code_sample_on_a_page_is_a_sample_that_runs() -> None:
    # A page holds its samples as programs, or as the files of a program it holds (titled
    # blocks, on a page with a program), or an exact copy of a sample run as a file or of a
    # section of one. Console transcripts, configuration and diagrams are not code samples,
    # nor is other libraries' code marked as not run.
    runnable = runnable_texts() | {p.text.strip(): DOCS for p in PAGE_PROGRAMS if not p.path}
    with_programs = {p.where.split(":")[0] for p in PAGE_PROGRAMS}
    stray = [
        f"{page.relative_to(DOCS)}: {body.splitlines()[0]}"
        for page, lang, body, in_file in code_blocks()
        if lang in CODE
        and not INCLUDE.fullmatch(body)
        and body not in runnable
        and not is_marked_not_run(body)
        and not (in_file and str(page.relative_to(DOCS)) in with_programs)
    ]
    assert not stray, f"code samples that no test runs: {stray}"


def is_marked_not_run(body: str) -> bool:
    first = body.split("\n", 1)[0]
    return NOT_RUN in first


def test_code_shown_as_not_run_is_other_libraries_code() -> None:
    # The mark lets no delayq sample escape the run: a block that uses delayq cannot carry it.
    shown = [(page, body) for page, _, body, _ in code_blocks() if is_marked_not_run(body)]
    assert len(shown) >= 5  # Celery, RQ, arq, BullMQ, Redisson
    for page, body in shown:
        assert not re.search(r"^\s*(from|import) delayq\b", body, re.MULTILINE), page.name


def test_the_guides_label_the_code_they_do_not_run() -> None:
    # On the site the block's title says "(not run)"; on a code host its first line does.
    for page in pages():
        for match in NOT_RUN_TITLE.finditer(page.read_text()):
            assert NOT_RUN in match.group(1), f"{page.name}: {match.group(1)}"


def test_samples_take_redis_from_the_environment() -> None:
    # Never the machine's own Redis: a sample that hard-codes a URL would bypass REDIS_URL.
    for sample in PYTHON_SAMPLES:
        text = sample.read_text()
        assert 'os.environ.get("REDIS_URL"' in text, sample.name
        assert text.count("redis://") == 1, f"{sample.name} names a Redis URL of its own"
    for program in PAGE_PROGRAMS:
        if program.lang == "python":
            assert program.text.count("redis://") == 1, f"{program.where} names a Redis URL"
