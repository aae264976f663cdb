"""The `longsparse` command as a new user meets it: `--help` answers without loading torch, every option's help says
its default and accepted values, the base install (no triton) runs `info` and a CPU generation, and the README's two
commands are the ones CI runs."""

import argparse
import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import longsparse
from longsparse import cli
from longsparse.cli_args import DTYPES, CommandParser, available_cpus, default_threads, library_progress_bars
from tests.tiny_models import build, save, write_tokenizer

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "triton", "numpy", "transformers", "safetensors")


def _run_python(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def test_help_loads_no_heavy_package():
    code = (
        "import sys\nfrom longsparse import cli\ntry:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))"
    )
    out = _run_python(code)
    assert out.returncode == 0, out.stderr
    assert "generate" in out.stdout and out.stdout.strip().splitlines()[-1] == "[]"


def test_help_takes_a_fraction_of_a_second_of_cpu():
    """CPU time, not wall time: the bound (1.5 s on a 2-core machine) holds however loaded the machine is. It takes
    ~0.15 s here; importing torch alone takes ~2.5 s."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-m", "longsparse.cli", "--help"], capture_output=True, text=True, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert out.returncode == 0 and "usage: longsparse" in out.stdout
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 0.75, f"longsparse --help took {cpu:.2f} s of CPU"


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"longsparse {longsparse.__version__}"


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command's parser, its arguments loaded, by its prog."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser) -> None:
        parser.format_help()  # loads a lazily configured parser
        found[parser.prog] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    walk(child)

    walk(cli.build_parser())
    return found


def test_every_command_is_reachable_and_lazy():
    progs = set(_parsers())
    for name, _, _ in cli.COMMANDS:
        assert f"longsparse {name}" in progs
    assert {"longsparse eval ruler", "longsparse eval recall", "longsparse bench gdn", "longsparse bench model"} < progs
    fresh = cli.build_parser()
    sub = next(a for a in fresh._actions if isinstance(a, argparse._SubParsersAction))
    assert all(isinstance(p, CommandParser) and p._module is not None for p in sub.choices.values())


def test_every_option_has_help_that_shows_its_default_and_choices():
    """Every option says its default and its choices; every option of the user-facing commands (the benchmark
    suites' options are the suites' own) says what it is."""
    missing, hidden = [], []
    for prog, parser in _parsers().items():
        text = parser.format_help()
        for action in parser._actions:
            if not action.option_strings or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                continue
            option = action.option_strings[-1]
            if not action.help and not prog.startswith("longsparse bench "):
                missing.append(f"{prog} {option}")
            default = action.default
            said = parser._get_formatter()._format_action(action)
            if not (default is None or default is False or default == [] or "default" in said.lower()):
                hidden.append(f"{prog} {option} ({default!r})")
            if action.choices is not None:
                assert "{" + ",".join(map(str, action.choices)) + "}" in text, (prog, option)
    assert not missing, f"options without help: {missing}"
    assert not hidden, f"defaults not in the help: {hidden}"


def test_generate_help_lists_every_dtype_and_the_threads():
    text = _parsers()["longsparse generate"].format_help()
    assert "{" + ",".join(DTYPES) + "}" in text and "--threads N" in text and "(default: 64)" in text
    assert "--truncate-prompt {left,right}" in text and "--verbose" in text


def test_default_threads_are_what_this_process_may_use():
    cpus = available_cpus()
    assert 1 <= cpus <= (len(__import__("os").sched_getaffinity(0)))
    assert 1 <= default_threads() <= cpus


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = save(build("llama-gqa-bias", seed=13, eos_token_id=100), tmp_path_factory.mktemp("tiny"))
    write_tokenizer(path)
    return path


BLOCK_TRITON = "import sys\nsys.modules['triton'] = None  # `import triton` now raises ImportError\n"


def test_without_triton_the_packages_import_and_cpu_generation_runs(tiny):
    """The base install (`.[hf]`, no `gpu` extra): every package and every command's module imports, `info` and a
    CPU generation run, and a suite that needs triton says which extra to install."""
    code = BLOCK_TRITON + (
        "import importlib, json\n"
        "from longsparse import cli\n"
        "for name in ('ops.gdn', 'ops.sparse_attn', 'ops.conv', 'ops.norm', 'ops.transfer', 'cache', 'models',\n"
        "             'engine', 'eval', 'train', 'bench', 'engine.cli', 'eval.cli', 'train.cli', 'train.hybrid_cli',\n"
        "             'bench.cli', 'info'):\n"
        "    importlib.import_module('longsparse.' + name)\n"
        "codes = [cli.main(['info', '--json'])]\n"
        "codes.append(cli.main(['generate', '--model', sys.argv[1], '--prompt', 'w1 w2 w3', '--max-new-tokens', '4',\n"
        "                       '--threads', '1']))\n"
        "codes.append(cli.main(['bench', 'gdn', '--help']))\n"
        "print(json.dumps(codes))\n"
    )
    out = _run_python(code, str(tiny))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert json.loads(lines[-1]) == [0, 0, 2]
    assert '"triton": null' in out.stdout and '"triton_kernels": "unavailable"' in out.stdout
    assert re.fullmatch(r"(w\d+ ?)+", lines[-2].strip()), lines[-2]  # the generated words
    assert "prefill 3 tok" in out.stderr
    assert "longsparse: error: SparseGDN's GPU kernels needs the optional package 'triton': " in out.stderr
    assert 'pip install "longsparse[gpu]"' in out.stderr


def _readme_blocks(marker: str) -> list[list[str]]:
    """The bash blocks that follow ``<!-- ci: MARKER -->`` lines in README.md, as lists of lines."""
    lines = (ROOT / "README.md").read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line == f"<!-- ci: {marker} -->":
            assert lines[i + 1] == "```bash", "the marker must stand right above a ```bash block"
            end = lines.index("```", i + 2)
            blocks.append(lines[i + 2 : end])
    return blocks


def test_readme_holds_one_main_job_and_one_test_command_and_ci_runs_them():
    main_job, tests = _readme_blocks("main-job"), _readme_blocks("tests")
    assert len(main_job) == 1 and len(main_job[0]) == 1, "README.md: one main-job command, on one line"
    assert len(tests) == 1 and len(tests[0]) == 1, "README.md: one test command, on one line"
    assert "longsparse generate" in main_job[0][0] and "pytest" in tests[0][0]
    out = subprocess.run(["bash", ".ci/run", "--commands"], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.splitlines() == [main_job[0][0], tests[0][0]]
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    assert main_job[0][0] in first_screen and tests[0][0] in first_screen


def test_library_progress_bars_are_quiet_unless_asked(tmp_path):
    """transformers draws a bar while it converts a GGUF file's tensors: not on a plain run (a subprocess, since tqdm
    reads its setting once, at import); --verbose keeps tqdm's own setting."""
    from tests.models.test_gguf import write_gguf

    hf = build("llama-gqa-bias", seed=3, attention_bias=False, mlp_bias=False)
    path = write_gguf(tmp_path / "tiny.gguf", hf, "llama")
    argv = ["generate", "--model", str(path), "--prompt", "w1 w1", "--max-new-tokens", "2", "--threads", "1"]
    out = _run_python("import sys\nfrom longsparse import cli\nsys.exit(cli.main(sys.argv[1:]))", *argv)
    assert out.returncode == 0, out.stderr
    assert "prefill " in out.stderr and "Converting" not in out.stderr and "it/s" not in out.stderr
    with library_progress_bars(shown=False):
        assert os.environ["TQDM_DISABLE"] == "1"
    with library_progress_bars(shown=True):
        assert "TQDM_DISABLE" not in os.environ
    assert "TQDM_DISABLE" not in os.environ
