"""`longsparse info` reports versions and optional packages, with and without them installed."""

import json
import subprocess
import sys

import pytest

from longsparse import cli, info


def test_report_lists_every_optional_package(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for name in ("torch", "kernels", "fla", "flash_qla", "transformers"):
        assert name in out
    assert "interpreter" in out or "compiled" in out or "unavailable" in out


def test_json_report_is_complete(capsys):
    assert cli.main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["triton_kernels"] in ("compiled", "interpreter", "unavailable")
    assert set(info._OPTIONAL) == set(data["optional"])


def test_missing_optional_packages_are_reported_not_fatal(monkeypatch):
    for name in ("transformers", "fla", "flash_qla", "triton"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` raise ImportError
    data = info.collect()
    assert data["optional"]["transformers"] is None
    assert data["optional"]["fla"] is None
    assert data["triton_kernels"] == "unavailable"
    assert "-- not installed" in info.format_report(data)


@pytest.mark.parametrize("interp, expected", [("1", "interpreter"), ("0", None)])
def test_kernel_mode_follows_the_environment(interp, expected):
    code = "from longsparse.ops._triton import triton_mode; print(triton_mode())"
    env = {"TRITON_INTERPRET": interp, "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    mode = out.strip()
    if expected:
        assert mode == expected
    else:
        assert mode in ("compiled", "unavailable")


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "longsparse.cli", "info"], capture_output=True, text=True, check=True)
    assert "longsparse" in out.stdout
