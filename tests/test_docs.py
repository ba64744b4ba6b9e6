"""Every code block of README.md and docs/*.md runs.

Per file, in a fresh temporary folder (the working directory, and FEATURELAKE_HOME
for the CLI): the ```python blocks run in order in one namespace, and the ```bash
blocks of `featurelake` commands run in order through the CLI (typer's runner, in
process), so later blocks use what earlier ones made. A block that cannot run
here (it needs torch, an S3 server, or runs the whole test suite) is preceded by
`<!-- no-test: why -->`; any other python or bash block must run. In a CLI block,
`export NAME=value` sets an environment variable for the commands after it.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
NO_TEST = re.compile(r"<!--.*\bno-test:\s*(\S.*?)\s*-->")


@dataclass
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    skip: str | None  # why it is not run


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of a markdown text, with the no-test reason of each, if any."""
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        before = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        marker = NO_TEST.search(before)
        out.append(Block(m.group(1).lower(), "\n".join(lines[start + 1:j]) + "\n", start + 1,
                         marker.group(1) if marker else None))
        i = j + 1
    return out


def cli_commands(code: str) -> list[list[str]]:
    """The commands of a bash block (one per line or separated by `;`), each a list of words."""
    commands = []
    for line in code.splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index(";") if ";" in words else len(words)
            commands.append(words[:cut])
            words = words[cut + 1:]
    return commands


def _is_cli(block: Block) -> bool:
    return block.lang in ("bash", "sh", "shell") and any(c[:1] == ["featurelake"] for c in cli_commands(block.code))


@pytest.fixture
def clean_dir(tmp_path, monkeypatch):
    for var in ("FEATURELAKE_CATALOG_URI", "FEATURELAKE_WAREHOUSE", "FEATURELAKE_CATALOG", "FEATURELAKE_LANDING"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FEATURELAKE_HOME", str(tmp_path / ".featurelake"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_code_blocks_run(doc: Path, clean_dir, monkeypatch):
    from typer.testing import CliRunner

    from featurelake.cli import app

    runner = CliRunner()
    scope: dict = {"__name__": f"doc:{doc.name}"}
    ran = 0
    for block in blocks(doc.read_text()):
        where = f"{doc.name}:{block.line}"
        if block.lang not in ("python", "bash", "sh", "shell"):
            continue
        if block.skip is not None:
            assert len(block.skip) > 10, f"{where}: say why the block is not run"
            continue
        if block.lang == "python":
            exec(compile(block.code, where, "exec"), scope)
        else:
            assert _is_cli(block), f"{where}: a bash block must be featurelake commands or carry <!-- no-test: why -->"
            for command in cli_commands(block.code):
                if command[0] == "export" and len(command) == 2 and "=" in command[1]:
                    monkeypatch.setenv(*command[1].split("=", 1))
                    continue
                assert command[:1] == ["featurelake"], f"{where}: not a featurelake command: {command}"
                result = runner.invoke(app, command[1:])
                assert result.exit_code == 0, (where, command, result.output, result.exception)
        ran += 1
    if doc.name in ("README.md", "capabilities.md"):
        assert ran >= 4, f"{doc.name}: its examples are not found any more"


def test_blocks_and_commands_are_parsed_as_written():
    text = "x\n<!-- no-test: needs an S3 server -->\n```bash\nexport A=1\n```\n```python\nprint(1)\n```\n"
    got = blocks(text)
    assert [(b.lang, b.code, b.line, b.skip) for b in got] == [
        ("bash", "export A=1\n", 3, "needs an S3 server"), ("python", "print(1)\n", 6, None)]
    assert cli_commands("featurelake a 'b c' ; featurelake d  # note\n\nfeaturelake e\n") == [
        ["featurelake", "a", "b c"], ["featurelake", "d"], ["featurelake", "e"]]
