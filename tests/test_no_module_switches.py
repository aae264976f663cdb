"""Kernel variants are configuration passed down, never module globals that a test or a script reassigns.

An ast scan of the repository's code: no assignment ``module.NAME = ...``, ``setattr(module, "NAME", ...)`` or
``monkeypatch.setattr(module, "NAME", ...)`` to an UPPER_CASE name of a ``longsparse.ops`` module (where the kernels'
variants live: a kernel config is passed down to the launchers instead), and no ``global`` statement in ``src``.
"""

import ast
import dataclasses
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("src", "tests", "scripts", "benchmarks")
UPPER = re.compile(r"^_?[A-Z][A-Z0-9_]*$")


def _python_files():
    for folder in SCANNED:
        yield from sorted((ROOT / folder).rglob("*.py"))


def _module_constants() -> set[str]:
    """Every UPPER_CASE name assigned at the top level of a ``longsparse.ops`` module."""
    names = set()
    for path in (ROOT / "src" / "longsparse" / "ops").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                for leaf in ast.walk(target) if target is not None else ():
                    if isinstance(leaf, ast.Name) and UPPER.match(leaf.id):
                        names.add(leaf.id)
    return names


def _reassignments(tree: ast.AST, constants: set[str]):
    """``(line, what)`` for every assignment to an attribute, or ``setattr`` of a name, in ``constants``."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    owner = getattr(leaf, "value", None)
                    instance = isinstance(owner, ast.Name) and owner.id in ("self", "cls")  # an object's own field
                    if isinstance(leaf, ast.Attribute) and leaf.attr in constants and not instance:
                        yield node.lineno, f"assigns .{leaf.attr}"
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "setattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                if node.args[1].value in constants:
                    yield node.lineno, f"setattr(..., {node.args[1].value!r})"


def test_no_module_constant_is_reassigned_or_patched():
    constants = _module_constants()
    assert {"SHORT_CHUNKS", "GLUON_MIN_CHUNKS", "OUTPUT_NUM_STAGES"} <= constants  # the scan sees src's constants
    found = []
    for path in _python_files():
        for line, what in _reassignments(ast.parse(path.read_text()), constants):
            found.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert not found, "module constants reassigned (make them a kernel-config field):\n" + "\n".join(found)


def test_src_has_no_global_statements():
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}: global {', '.join(node.names)}"
        for path in (ROOT / "src").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Global)
    ]
    assert not found, "\n".join(found)


def test_the_scan_finds_what_it_forbids():
    constants = {"TOPK_ARITY", "WARP_SPECIALISED", "STAGES", "CTAS_PER_SM"}
    code = """
select.TOPK_ARITY = 2
walk_gluon.STAGES, walk_gluon.CTAS_PER_SM = 2, 1
monkeypatch.setattr(walk_gluon, "WARP_SPECIALISED", False)
setattr(select, "TOPK_ARITY", 8)
config.topk_arity = 2
self.STAGES = 2
monkeypatch.setattr(walk_gluon, "supports", None)
"""
    lines = sorted(line for line, _ in _reassignments(ast.parse(code), constants))
    assert lines == [2, 3, 3, 4, 5]


@pytest.mark.parametrize(
    "module, names",
    [
        ("longsparse.ops.sparse_attn.select", ("TOPK_ARITY", "TOPK_BITONIC", "TOPK_ROWS", "DECODE_FUSED_TOPK",
                                               "MIN_TOPK_WIDTH")),
        ("longsparse.ops.gdn.walk_gluon", ("WARP_SPECIALISED", "STAGES", "CTAS_PER_SM")),
    ],
)  # fmt: skip
def test_the_former_switches_are_gone(module, names):
    imported = __import__(module, fromlist=["_"])
    assert [name for name in names if hasattr(imported, name)] == []


def test_kernel_configs_are_frozen_validated_dataclasses():
    from longsparse.ops.gdn import SparseGDNConfig, SparseGDNKernelConfig
    from longsparse.ops.sparse_attn import SelectKernelConfig, SparseAttentionConfig

    for cls, bad in (
        (SelectKernelConfig, dict(topk_arity=3)),
        (SparseGDNKernelConfig, dict(walk_stages=0)),
        (SparseGDNConfig, dict(tail=0)),
        (SparseAttentionConfig, dict(block_size=0)),
    ):
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
        config = cls()
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(config, dataclasses.fields(cls)[0].name, None)
        with pytest.raises(ValueError):
            cls(**bad)
