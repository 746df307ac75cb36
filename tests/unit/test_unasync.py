"""scripts/unasync.py: generated files are current, and a rule that matches nothing fails."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "unasync.py"


@pytest.fixture(scope="module")
def unasync() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_passes_on_the_tree(unasync: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert unasync.main(["--check"]) == 0, capsys.readouterr().err


def test_a_dead_rule_fails_the_check_and_is_named(
    unasync: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = [*unasync.RULES, (r"\bNoSuchNameAnywhere\b", "Gone")]
    assert unasync.main(["--check"], rules=rules) == 1
    err = capsys.readouterr().err
    assert r"dead rule (matches nothing in any source): \bNoSuchNameAnywhere\b -> Gone" in err
    assert "out of date" not in err  # the live rules still produce the files as they are


def test_stale_missing_and_orphaned_files(
    unasync: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "src" / "_async").mkdir(parents=True)
    (tmp_path / "src" / "_sync").mkdir()
    (tmp_path / "tests").mkdir()
    source = "async def f() -> None:\n    await g()\n"
    (tmp_path / "src" / "_async" / "a.py").write_text(source)
    (tmp_path / "src" / "_async" / "b.py").write_text(source)
    (tmp_path / "src" / "_sync" / "a.py").write_text("# hand-edited\n")
    orphan = tmp_path / "src" / "_sync" / "old.py"
    orphan.write_text(unasync.HEADER.format(source="_async/old.py"))
    pairs = [("src/_async/a.py", "src/_sync/a.py"), ("src/_async/b.py", "src/_sync/b.py")]
    rules = [(r"\basync def\b", "def"), (r"\bawait ", "")]

    assert unasync.main(["--check"], pairs=pairs, rules=rules, root=tmp_path) == 1
    err = capsys.readouterr().err
    assert "out of date: src/_sync/a.py" in err and "out of date: src/_sync/b.py" in err
    assert "no longer listed in PAIRS: src/_sync/old.py" in err

    assert unasync.main([], pairs=pairs, rules=rules, root=tmp_path) == 0
    generated = (tmp_path / "src" / "_sync" / "a.py").read_text()
    assert generated == (
        "# Generated from _async/a.py by scripts/unasync.py: do not edit.\n"
        "def f() -> None:\n    g()\n"
    )
    assert not orphan.exists()
    assert unasync.main(["--check"], pairs=pairs, rules=rules, root=tmp_path) == 0
