"""Every file in tests/bad_inputs/ is refused by `rlgraph compile` with a one-line error.

Each file states what the error must say in its header:

    # expect: [line=N|override] key=dotted.key|- text="..." [text="..."]
    # args: key=value ...        (overrides passed after the file; optional)
    # needs: compiler            (a placement refusal: skipped until rlgraph.compiler exists)

and marks the offending line with a trailing `# <-` (or gives `line=`). The header is ASCII
even where the rest of the file is not UTF-8 text (yaml_latin1.yaml, yaml_binary.yaml).
Attacks that cannot be a file in git (a FIFO, /dev/zero, a 300-character name, UTF-16, an
unwritable -o) are in test_hostile_inputs.py. The test asserts
exit status 2, `file:LINE:` (or `<override ...>`), the key and each text on stderr, nothing
on stdout, and no traceback.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rlgraph.cli.main import main

CORPUS = Path(__file__).parent


@dataclass
class Expect:
    """What a corpus file's error must contain."""

    path: Path
    line: int | str
    key: str | None
    texts: list[str]
    args: list[str] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)


def parse_expect(path: Path) -> Expect:
    """Read the header comments and the `# <-` marker of a corpus file."""
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()  # some are not UTF-8
    header: dict[str, list[str]] = {}
    for text in lines:
        match = re.match(r"#\s*(expect|args|needs):\s*(.*)", text)
        if match:
            header.setdefault(match.group(1), []).extend(shlex.split(match.group(2)))
    fields: dict[str, list[str]] = {}
    for word in header.get("expect", []):
        name, _, value = word.partition("=")
        fields.setdefault(name, []).append(value)
    marked = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith("# <-")]
    line: int | str = fields["line"][0] if "line" in fields else marked[0]
    line = int(line) if str(line).isdigit() else line
    key = fields.get("key", ["-"])[0]
    return Expect(path, line, None if key == "-" else key, fields.get("text", []),
                  header.get("args", []), header.get("needs", []))


def _compiler_ready() -> bool:
    try:
        from rlgraph.compiler import compile_plan  # noqa: F401
    except ImportError:
        return False
    return True


CASES = sorted(CORPUS.glob("*.yaml"))


def check(expect: Expect, status: int, out: str, err: str) -> None:
    """The assertions every corpus file must pass, whichever way the CLI was run."""
    name = expect.path.name
    assert status == 2, f"{name}: exit status {status}\n{err}"
    assert "Traceback" not in err, f"{name}: printed a traceback\n{err}"
    assert out == "", f"{name}: printed on stdout: {out!r}"
    message = err.strip()
    assert len(message.splitlines()) == 1, f"{name}: error is not one line\n{err}"
    if expect.line == "override":
        assert message.startswith("<override "), message
    else:
        assert f"{name}:{expect.line}:" in message, f"expected line {expect.line}: {message}"
    if expect.key:
        assert f"{expect.key}:" in message, f"expected key {expect.key}: {message}"
    for text in expect.texts:
        assert text in message, f"expected {text!r} in: {message}"


def test_corpus_is_large_and_well_formed() -> None:
    assert len(CASES) >= 30
    for path in CASES:
        expect = parse_expect(path)
        assert expect.texts, f"{path.name}: no text= to check"
        assert isinstance(expect.line, int) or expect.line == "override", path.name


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_bad_input_is_refused(path: Path, capsys: pytest.CaptureFixture[str],
                              tmp_path: Path) -> None:
    expect = parse_expect(path)
    if "compiler" in expect.needs and not _compiler_ready():
        pytest.skip("placement refusals need rlgraph.compiler")
    status = main(["compile", str(path), *expect.args, "-o", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    check(expect, status, out, err)
    assert not (tmp_path / "out").exists(), "a refused graph must not write outputs"


@pytest.mark.parametrize("name", ["yaml_bad_indent.yaml", "unknown_group_key.yaml",
                                  "override_wrong_type.yaml"])
def test_bad_input_through_a_real_process(name: str, tmp_path: Path) -> None:
    expect = parse_expect(CORPUS / name)
    proc = subprocess.run(
        [sys.executable, "-m", "rlgraph", "compile", str(expect.path), *expect.args,
         "-o", str(tmp_path)], capture_output=True, text=True, timeout=60)
    check(expect, proc.returncode, proc.stdout, proc.stderr)


def test_missing_file_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status = main(["compile", str(tmp_path / "nope.yaml")])
    _, err = capsys.readouterr()
    assert status == 2 and "nope.yaml" in err and "No such file" in err
    assert "Traceback" not in err
