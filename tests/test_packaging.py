"""What a user's `pip install vllm-sentinel` gets: every import declared, and the wheel working in a fresh venv.

`make demo` and `make test` install vLLM beside the package, and vLLM pulls in much of what the CLI
imports: a dependency missing from pyproject.toml passes there and fails a user's clean install
(typer 0.29 stopped depending on click while `cli/app.py` still imported it).
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = ("vllm_sentinel", "agent", "collectors", "reports", "rules")
RECORDING = ROOT / "reports" / "recordings" / "cpu-tiny-llama.prom.gz"
# extras that a user installs beside the base; `server` (vLLM and torch) and `test` are what make test runs in
USER_EXTRAS = ("nvml", "pyspy", "charts")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    """'typer>=0.12,<1' -> 'typer' (normalized as pip does)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)).lower()


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING" or \
        isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(modules imported when `path` is imported, modules imported later: inside functions or try blocks).

    Top-level names only ('matplotlib.pyplot' -> 'matplotlib'); imports under `if TYPE_CHECKING:` never run.
    """
    eager: set[str] = set()
    lazy: set[str] = set()

    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                (lazy if deferred else eager).update(a.name.split(".")[0] for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                (lazy if deferred else eager).add(child.module.split(".")[0])
            visit(child, deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Try)))

    visit(ast.parse(path.read_text(), str(path)), False)
    return eager, lazy


def _third_party(modules: set[str]) -> set[str]:
    return {m for m in modules if m not in sys.stdlib_module_names and m not in ("vllm_sentinel", "__future__")}


def test_every_module_the_code_imports_is_a_declared_dependency_with_a_tested_range():
    """A module-level import of a third-party package must be a base dependency (the CLI imports it on
    every run); one inside a function may come from an extra. Every requirement states the range it was
    tested on (a lower and an upper bound), and the versions installed here lie in it."""
    project = _project()
    base = {_name(r) for r in project["dependencies"]}
    extras = {_name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    distributions = importlib.metadata.packages_distributions()
    problems = []
    for folder in PACKAGE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            eager, lazy = imports(path)
            checks = [(m, base, "base dependencies") for m in _third_party(eager)] + \
                [(m, base | extras, "dependencies or extras") for m in _third_party(lazy)]
            for module, allowed, where in checks:
                names = {_name(d) for d in distributions.get(module, [module])}
                if not names & allowed:
                    problems.append(f"{path.relative_to(ROOT)} imports {module} ({', '.join(sorted(names))}), "
                                    f"not among pyproject's {where}")
    assert not problems, "\n".join(problems)
    for requirement in project["dependencies"] + [r for k in USER_EXTRAS for r in project["optional-dependencies"][k]]:
        assert ">=" in requirement and "<" in requirement.replace("<=", ""), \
            f"{requirement}: give the range it was tested on (>=low,<high)"


def test_the_import_scan_sees_module_level_lazy_and_type_checking_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import click\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pandas\n"
                      "def f():\n    import matplotlib.pyplot\ntry:\n    import pynvml\nexcept ImportError:\n    pass\n")
    eager, lazy = imports(source)
    assert _third_party(eager) == {"click"}
    assert _third_party(lazy) == {"matplotlib", "pynvml"}


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout[-3000:]}" \
                                 f"\n{done.stderr[-3000:]}"
    return done.stdout


def _user_commands(bin_dir: Path, work: Path) -> list[str]:
    """The commands a new user types first: help, the rule pack's check, the demo on the recorded session
    (ingest, the rule pack, diagnose, reports) and diagnose as JSON. Returns the report folders written."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_SENTINEL", "PYTHON"))}
    env["HOME"] = str(work / "home")
    work.mkdir(parents=True)
    cli = str(bin_dir / "vllm-sentinel")
    assert "diagnose" in _run([cli, "--help"], work, env)
    assert "SUCCESS" in _run([cli, "rules", "check"], work, env)
    out = _run([cli, "demo", "--replay", "--workdir", str(work / "demo")], work, env)
    assert "kv_cache_pressure" in out
    db = next((work / "demo").glob("replay-*.duckdb"))
    doc = _run([cli, "diagnose", "--db", str(db), "--since", "1h", "--until", "2026-11-29T23:02:17Z",
                "--format", "json"], work, env)
    assert '"incident": "kv_cache_pressure"' in doc
    return [p.parent.name for p in (work / "demo" / "reports").glob("*/report.md")]


@pytest.mark.packaging
def test_the_wheel_installs_into_a_fresh_venv_and_runs(tmp_path):
    """The wheel, installed with only its declared dependencies (as `pip install vllm-sentinel` would), runs
    the first commands of the README; then once more after each extra a user installs beside it."""
    # built from a copy: setuptools writes build/ and *.egg-info beside the sources it builds
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__",
                                                                 "*.duckdb", ".work", ".whl", ".device"))
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
          str(source)], tmp_path)
    wheel = next(wheels.glob("vllm_sentinel-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    pip = [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run(pip + [str(wheel)], tmp_path)
    installed = _run([str(env_dir / "bin" / "python"), "-m", "pip", "list", "--format", "freeze"], tmp_path)
    for absent in ("vllm", "torch", "click", "matplotlib"):  # a clean install: nothing of make test's venv
        assert not re.search(rf"^{absent}==", installed, re.M | re.I), f"{absent} came with the base install"
    _user_commands(env_dir / "bin", tmp_path / "base")
    # each extra added in turn (nvml, pyspy, charts), the same commands again, and what the extra brings
    for extra in USER_EXTRAS:
        _run(pip + [f"{wheel}[{extra}]"], tmp_path)
        reports = _user_commands(env_dir / "bin", tmp_path / extra)
        if extra == "charts":  # the reports now carry their charts
            assert any((tmp_path / extra / "demo" / "reports" / r).glob("*.png") for r in reports)
    _run([str(env_dir / "bin" / "python"), "-c", "import pynvml"], tmp_path)
    assert "py-spy" in _run([str(env_dir / "bin" / "py-spy"), "--version"], tmp_path)
