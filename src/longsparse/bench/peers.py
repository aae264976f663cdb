"""The peers we measure against (FLA, FlashQLA) on a GPU machine that has no package registry.

Workflow (DESIGN.md §8): on a machine with PyPI, ``download`` the pinned wheels for the GPU machine's Python and
``bundle`` them into one xz-compressed tree (z3's duplicate library and CLI dropped: ~30 MB instead of ~82 MB of
wheels); carry the bundle to the GPU machine and ``install`` it there (an extraction, no pip needed), then put the
printed directory on ``PYTHONPATH``. ``fla_chunk_gated_delta_rule`` / ``flashqla_chunk_gated_delta_rule`` return the
peers' ops or None.

    python -m longsparse.bench.peers download .whl
    python -m longsparse.bench.peers bundle .whl .peers/peers-py312.tar.xz
    python -m longsparse.bench.peers install .peers/peers-py312.tar.xz /tmp/peers   # on the GPU machine
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PINNED = (
    "fla-core==0.6.0",
    "flash-linear-attention==0.6.0",
    "flash-qla==0.1.3",
    "tilelang==0.1.15",
    "apache-tvm-ffi==0.1.12",
    "torch-c-dlpack-ext==0.1.5",
    "z3-solver==4.15.4.0",
)
PLATFORMS = (
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux1_x86_64",
)


def download(dest: str | Path, python_version: str = "3.12") -> list[Path]:
    """Download the pinned peer wheels (no dependencies) for ``python_version`` on x86-64 Linux into ``dest``."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "-d",
        str(dest),
    ]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + list(PINNED), check=True)
    return sorted(dest.glob("*.whl"))


def bundle(wheel_dir: str | Path, out: str | Path) -> Path:
    """Unpack the wheels in ``wheel_dir`` into one importable tree and write it as ``out`` (.tar.xz)."""
    wheels = sorted(Path(wheel_dir).glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"no wheels in {wheel_dir}; run 'download' first")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        for whl in wheels:  # a wheel is a zip of the installed tree; its .data/ holds scripts we do not need
            shutil.unpack_archive(str(whl), str(site), format="zip")
        for data in site.glob("*.data"):
            shutil.rmtree(data)
        lib = site / "z3" / "lib"
        if (lib / "libz3.so").exists() and any(lib.glob("libz3.so.*")):
            versioned = sorted(lib.glob("libz3.so.*"))[0]
            (lib / "libz3.so").unlink()
            (lib / "libz3.so").symlink_to(versioned.name)
        with tarfile.open(out, "w:xz", preset=9) as tar:
            tar.add(site, arcname=".")
    return out


def install(bundle_path: str | Path, target: str | Path) -> Path:
    """Extract a bundle into ``target``; put ``target`` on PYTHONPATH to import the peers."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(bundle_path, "r:xz") as tar:
        tar.extractall(target, filter="fully_trusted" if sys.version_info >= (3, 12) else None)
    return target


def fla_chunk_gated_delta_rule():
    """FLA's Triton ``chunk_gated_delta_rule`` with its FlashQLA dispatch turned off, or None if FLA is missing."""
    os.environ["FLA_FLASH_QLA"] = "0"
    try:
        mod = importlib.import_module("fla.ops.gated_delta_rule")
    except Exception:
        return None
    return mod.chunk_gated_delta_rule


def flashqla_chunk_gated_delta_rule():
    """FlashQLA's ``chunk_gated_delta_rule`` (TileLang, Hopper), or None if it is missing."""
    try:
        mod = importlib.import_module("flash_qla")
    except Exception:
        return None
    return mod.chunk_gated_delta_rule


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m longsparse.bench.peers", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("download", help="download the pinned peer wheels (needs PyPI)")
    p.add_argument("dest")
    p.add_argument("--python-version", default="3.12")
    p = sub.add_parser("bundle", help="pack downloaded wheels into one .tar.xz tree")
    p.add_argument("wheel_dir")
    p.add_argument("out")
    p = sub.add_parser("install", help="extract a bundle (no pip, no network)")
    p.add_argument("bundle")
    p.add_argument("target")
    args = parser.parse_args(argv)
    if args.cmd == "download":
        for w in download(args.dest, args.python_version):
            print(w)
    elif args.cmd == "bundle":
        out = bundle(args.wheel_dir, args.out)
        print(f"{out} ({out.stat().st_size / 2**20:.1f} MiB)")
    else:
        print(f"export PYTHONPATH={install(args.bundle, args.target)}:$PYTHONPATH")
    return 0


if __name__ == "__main__":
    sys.exit(main())
