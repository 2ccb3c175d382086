"""The command table: every command loads from its module, under the name its module gives it."""

from __future__ import annotations

import importlib
import subprocess
import sys

import typer.main

from vllm_sentinel.agent.cli.app import COMMANDS, GROUPS, load_command


def test_each_listed_command_is_its_modules_own():
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"vllm_sentinel.agent.cli.{module_name}")
        if name in GROUPS:
            assert load_command(name).list_commands(None), name  # a group with subcommands
            continue
        assert typer.main.get_command(module.app).name == name  # the name the module's own command has
        assert load_command(name).name == name


def test_a_command_imports_only_its_own_module():
    # `diagnose` must not pay for the daemon, the demo or the capacity search
    code = ("import sys; from vllm_sentinel.agent.cli.app import app\n"
            "try:\n    app(['diagnose', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('vllm_sentinel.agent.cli.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = out.strip().splitlines()[-1]
    assert "'vllm_sentinel.agent.cli.diagnose'" in loaded
    for other in ("run", "demo", "capacity", "compare"):
        assert f"'vllm_sentinel.agent.cli.{other}'" not in loaded, loaded


def test_the_daemon_starts_one_blas_thread_not_one_per_core():
    # OpenBLAS sizes its pool when NumPy loads; `run` must set the limit before its module imports NumPy
    code = ("import os, sys; from vllm_sentinel.agent.cli.app import load_command\n"
            "load_command('run'); assert 'numpy' in sys.modules\n"
            "print(os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('OMP_NUM_THREADS'))")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == ["1", "1"]
    # an operator's own setting wins
    env["OPENBLAS_NUM_THREADS"] = "3"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split()[0] == "3"
