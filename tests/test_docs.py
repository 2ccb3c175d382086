"""The docs stay true to the CLI: every command line they show parses, and every relative link resolves.

A command line is a line in a fenced code block of README.md or docs/*.md that starts with
`vllm-sentinel ` (or `.venv/bin/vllm-sentinel `, after an optional `$ ` prompt). Lines ending in `\\`
are joined with the next; a trailing `# comment` and anything after a pipe or a redirection (`|`,
`>`, `&&`, ...) are not the command's. For each distinct (sub)command the test asks
`vllm-sentinel <command...> --help` once, in this process (typer's CliRunner), and checks that the
command exists and that every `--flag` the line uses appears in that help text. Blocks fenced as
```text or ```output show what a command printed and are not read as commands.
"""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("vllm-sentinel", ".venv/bin/vllm-sentinel")
FENCE = re.compile(r"^\s*(```|~~~)")
OUTPUT_FENCES = {"text", "output"}  # info strings of blocks that show what a command printed
# a group's help lists its subcommands in a "Commands" section (rich's panel or click's plain text)
COMMANDS_SECTION = re.compile(r"^\W*Commands\b", re.MULTILINE)
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
HELP_ENV = {"COLUMNS": "400"}  # wide enough that rich never cuts a long option name ("--prometheus-concurre…")


def fenced_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line inside a fenced code block, `\\` continuations joined; blocks
    fenced as output (```text) are a program's output, not commands, and are left out."""
    out: list[tuple[int, str]] = []
    inside, output, pending, start = False, False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            if not inside:
                info = line.strip()[3:].strip().lower()
                output = info.split()[0] in OUTPUT_FENCES if info else False
            inside, pending = not inside, ""
            continue
        if not inside or output:
            continue
        if not pending:
            start = number
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def command_tokens(line: str) -> list[str] | None:
    """The words of a documented vllm-sentinel command line after the program name, up to the first shell
    operator; None when the line is not one."""
    line = line.strip()
    if line.startswith("$ "):
        line = line[2:].lstrip()
    if not line.startswith(tuple(p + " " for p in PROGRAMS)) and line not in PROGRAMS:
        return None
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True  # paths, globs and '{job="vllm"}' stay one word each
    words = list(lexer)  # the lexer drops a "# comment" to the end of the line
    args: list[str] = []
    for word in words[1:]:
        if word and all(c in lexer.punctuation_chars for c in word):  # |, >, >>, &&, ;, ...
            if word.startswith((">", "<")) and args and args[-1].isdigit():  # 2>/dev/null
                args.pop()
            break
        args.append(word)
    return args


@functools.lru_cache(maxsize=None)
def help_of(path: tuple[str, ...]) -> tuple[int, str]:
    """(exit code, output) of `vllm-sentinel *path --help`, asked once per path."""
    from typer.testing import CliRunner

    from vllm_sentinel.agent.cli.app import app

    result = CliRunner().invoke(app, [*path, "--help"], env=HELP_ENV)
    return result.exit_code, result.output


def is_group(path: tuple[str, ...]) -> bool:
    code, text = help_of(path)
    return code == 0 and bool(COMMANDS_SECTION.search(text))


def problems(line: str) -> list[str]:
    """What is wrong with a documented command line: an unknown (sub)command, or flags its help does not
    name. Empty when it parses."""
    args = command_tokens(line)
    if args is None:
        return [f"not a vllm-sentinel command line: {line!r}"]
    path: tuple[str, ...] = ()
    rest = list(args)
    while rest and not rest[0].startswith("-") and (not path or is_group(path)):
        path = (*path, rest.pop(0))
        code, text = help_of(path)
        if code != 0:
            return [f"no such command: vllm-sentinel {' '.join(path)} (its --help exits {code})"]
    if not path:
        return [f"no command given: {line!r}"]
    code, text = help_of(path)
    known = set(FLAG.findall(text))
    used = [w.split("=", 1)[0] for w in rest if re.fullmatch(r"--[A-Za-z][\w-]*(=.*)?|-[A-Za-z]", w)]
    return [f"vllm-sentinel {' '.join(path)} has no option {flag} (not in its --help)"
            for flag in dict.fromkeys(used) if flag not in known]


def documented_commands() -> dict[str, list[str]]:
    """Each distinct documented command line -> where it appears ("docs/x.md:12")."""
    found: dict[str, list[str]] = {}
    for doc in DOCS:
        for number, line in fenced_lines(doc.read_text(encoding="utf-8")):
            if command_tokens(line) is not None:
                key = " ".join(line.split())
                found.setdefault(key, []).append(f"{doc.relative_to(ROOT)}:{number}")
    return found


COMMAND_LINES = documented_commands()


def test_docs_show_commands() -> None:
    # the extractor found the README's first five commands; an empty collection would pass everything
    assert len(COMMAND_LINES) >= 20, COMMAND_LINES
    readme = {line for line, where in COMMAND_LINES.items() if any(w.startswith("README.md:") for w in where)}
    for command in ("run", "diagnose", "whatif", "compare", "report"):
        assert any(command_tokens(line)[:1] == [command] for line in readme), f"README shows no `{command}` line"


@pytest.mark.parametrize("line", sorted(COMMAND_LINES), ids=lambda line: COMMAND_LINES[line][0])
def test_documented_command_parses(line: str) -> None:
    assert problems(line) == [], f"{', '.join(COMMAND_LINES[line])}: {line}"


def test_extractor_reads_shell_lines() -> None:
    text = "\n".join([
        "```sh",
        "$ vllm-sentinel diagnose --prometheus https://thanos:10902 --ca-file ca.pem \\",
        "    --since 6h --format json        # Thanos too",
        "vllm-sentinel diagnose --since 2h --format markdown > incident.md",
        "vllm-sentinel rules export --format prometheusrule | kubectl apply -f -",
        "vllm-sentinel diagnose --selector '{job=\"vllm\"}' 2>/dev/null",
        "make demo",
        "```",
        "vllm-sentinel outside --a-fence",
        "```text",
        "vllm-sentinel diagnose  2026-11-29T22:54:18Z .. 2026-11-29T23:02:17Z",
        "```",
    ])
    lines = fenced_lines(text)
    assert [n for n, _ in lines] == [2, 4, 5, 6, 7]
    tokens = [command_tokens(line) for _, line in lines]
    assert tokens == [
        ["diagnose", "--prometheus", "https://thanos:10902", "--ca-file", "ca.pem", "--since", "6h", "--format", "json"],
        ["diagnose", "--since", "2h", "--format", "markdown"],
        ["rules", "export", "--format", "prometheusrule"],
        ["diagnose", "--selector", '{job="vllm"}'],
        None,
    ]


def test_checker_catches_made_up_flags_and_commands() -> None:
    assert problems("vllm-sentinel diagnose --since 1h | less   # fine") == []
    assert problems("vllm-sentinel rules export --out exported/") == []
    assert problems("vllm-sentinel export grafana --out d.json") == []
    assert problems("vllm-sentinel whatif --set=num-gpu-blocks=80") == []
    made_up = problems("vllm-sentinel diagnose --no-such-flag")
    assert made_up and "--no-such-flag" in made_up[0]
    # a flag of another command is not one of this one's
    assert problems("vllm-sentinel status --set num-gpu-blocks=80")
    # a subcommand's flag is checked against the subcommand's help, not the group's
    assert problems("vllm-sentinel rules export --no-such-flag")
    assert "no such command" in problems("vllm-sentinel no-such-command --since 1h")[0]
    assert "no such command" in problems("vllm-sentinel rules no-such-subcommand")[0]


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)


def outside_fences(text: str) -> list[str]:
    """The lines of a Markdown text outside its fenced code blocks."""
    kept, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            kept.append(line)
    return kept


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans: where links are links."""
    return "\n".join(re.sub(r"(`+).*?\1", "", line) for line in outside_fences(text))


def anchors(markdown: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file: lower case, punctuation (backticks, colons,
    apostrophes) dropped, spaces to hyphens."""
    out = set()
    for line in outside_fences(markdown.read_text(encoding="utf-8")):
        heading = re.match(r"#{1,6}\s+(.+?)\s*#*\s*$", line)
        if heading:
            out.add(re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_relative_links_resolve() -> None:
    broken = []
    for doc in DOCS:
        text = prose(doc.read_text(encoding="utf-8"))
        for target in LINK.findall(text) + REFERENCE.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and file.suffix == ".md" and fragment not in anchors(file):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_docs_index_lists_every_page() -> None:
    index = prose((ROOT / "docs" / "README.md").read_text(encoding="utf-8"))
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(index)}
    missing = [p.name for p in DOCS[1:] if p.name != "README.md" and p.name not in linked]
    assert not missing, f"docs/README.md does not list {missing}"


def test_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines < 200, f"README.md has {lines} lines: move depth to docs/, history to CHANGELOG.md"
