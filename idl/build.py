"""Regenerate the omniORBpy stubs in ``idl/generated`` from the project's IDL files.

Usage::

    python -m idl.build            # rewrite idl/generated
    python -m idl.build --check    # exit 1 if idl/generated is not what the IDL gives

The stubs are produced by ``omniidl -bpython -Wbpackage=idl.generated``. Every IDL file found
in the include directories (the standard COS IDL of the ``omniorb-idl`` Debian package) is
passed as ``-Wbextern=<name>``, so the stubs import those modules by their plain names
(``CosNotifyChannelAdmin`` ...) from the precompiled stubs of the omniORB wheel, and nothing
but the project's own modules is written into ``idl/generated``.

Include directories default to ``/usr/share/idl/omniORB`` and ``/usr/share/idl/omniORB/COS``;
the environment variable ``NSJMS_IDL_INCLUDE`` (``os.pathsep``-separated) overrides them.

Exit codes: 0 success, 1 stale stubs (``--check``), 2 environment or compile error.

Errors::

    IdlBuildError        omniidl or the COS IDL is missing, or the IDL does not compile cleanly
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_STALE",
    "GENERATED_DIR",
    "IDL_DIR",
    "IDL_FILES",
    "IdlBuildError",
    "check",
    "compare_trees",
    "generate",
    "include_dirs",
    "main",
]

EXIT_OK = 0
EXIT_STALE = 1
EXIT_ERROR = 2

IDL_DIR = Path(__file__).resolve().parent
GENERATED_DIR = IDL_DIR / "generated"
PACKAGE = "idl.generated"
IDL_FILES = (
    "CosNotifyCommAck.idl",
    "CosNotifyChannelAdminAck.idl",
    "CosBridgeAdmin.idl",
    "BridgeTransactionMgmt.idl",
    "NsjmsAdmin.idl",
)
DEFAULT_INCLUDE_DIRS = (Path("/usr/share/idl/omniORB"), Path("/usr/share/idl/omniORB/COS"))
INCLUDE_ENV = "NSJMS_IDL_INCLUDE"
REQUIRED_INCLUDE = "CosNotifyChannelAdmin.idl"
INSTALL_HINT = (
    "install the standard COS IDL with `apt-get install -y --no-install-recommends omniorb-idl` "
    f"or point {INCLUDE_ENV} at directories holding it"
)
_SKIPPED_PARTS = frozenset({"__pycache__"})


class IdlBuildError(Exception):
    """The stubs could not be generated: a tool or include file is missing, or omniidl failed."""


def include_dirs(environ: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """Return the IDL include directories, checking that they exist and hold the COS IDL."""
    env = os.environ if environ is None else environ
    raw = env.get(INCLUDE_ENV, "")
    dirs = tuple(Path(p) for p in raw.split(os.pathsep) if p) or DEFAULT_INCLUDE_DIRS
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        raise IdlBuildError(f"IDL include directory not found: {', '.join(missing)}; {INSTALL_HINT}")
    if not any((d / REQUIRED_INCLUDE).is_file() for d in dirs):
        raise IdlBuildError(f"{REQUIRED_INCLUDE} not found in {', '.join(map(str, dirs))}; {INSTALL_HINT}")
    return dirs


def omniidl_command() -> list[str]:
    """Return the omniidl executable next to this interpreter (the venv's), else the one on PATH."""
    sibling = Path(sys.executable).parent / "omniidl"
    if sibling.is_file():
        return [str(sibling)]
    found = shutil.which("omniidl")
    if found is None:
        raise IdlBuildError("omniidl not found; install the jeteve-omniorb wheel (a project dependency)")
    return [found]


def extern_args(dirs: Sequence[Path]) -> list[str]:
    """``-Wbextern`` for every IDL file in the include directories that is not one of ours."""
    own = {Path(name).stem for name in IDL_FILES}
    names = {p.stem for d in dirs for p in d.glob("*.idl")} - own
    return [f"-Wbextern={name}" for name in sorted(names)]


def compile_file(name: str, out_root: Path, dirs: Sequence[Path]) -> None:
    """Run omniidl on one IDL file of ``IDL_DIR``, writing ``<out_root>/idl/generated``.

    The file is named relative to ``IDL_DIR`` so that no absolute path reaches the stubs.
    Any diagnostic output counts as a failure: the IDL must compile cleanly.
    """
    cmd = [
        *omniidl_command(),
        "-bpython",
        f"-Wbpackage={PACKAGE}",
        *extern_args(dirs),
        *(f"-I{d}" for d in dirs),
        f"-C{out_root}",
        name,
    ]
    proc = subprocess.run(cmd, cwd=IDL_DIR, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or proc.stderr.strip() or proc.stdout.strip():
        output = (proc.stderr + proc.stdout).strip()
        raise IdlBuildError(f"omniidl failed on {name} (exit {proc.returncode}):\n{output}")


def _build_tree(out_root: Path, dirs: Sequence[Path]) -> Path:
    """Compile every project IDL file under ``out_root``; return the generated package dir."""
    for name in IDL_FILES:
        compile_file(name, out_root, dirs)
    return out_root.joinpath(*PACKAGE.split("."))


def _copy_tree(src: Path, dest: Path) -> None:
    """Replace ``dest`` with a copy of ``src``, removing stale files."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def generate(dest: Path = GENERATED_DIR, dirs: Sequence[Path] | None = None) -> None:
    """Regenerate the stub package into ``dest`` (replacing its contents)."""
    use_dirs = include_dirs() if dirs is None else tuple(dirs)
    with tempfile.TemporaryDirectory(prefix="nsjms-idl-") as tmp:
        _copy_tree(_build_tree(Path(tmp), use_dirs), dest)


def _snapshot(root: Path) -> dict[str, bytes]:
    """Map each file under ``root`` (relative POSIX path) to its bytes, skipping caches."""
    files = (p for p in root.rglob("*") if p.is_file() and p.suffix != ".pyc")
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in files
        if not _SKIPPED_PARTS.intersection(p.relative_to(root).parts)
    }


def compare_trees(expected: Path, actual: Path) -> list[str]:
    """Describe how ``actual`` differs from ``expected``; an empty list means identical."""
    want, have = _snapshot(expected), _snapshot(actual)
    problems = [f"missing: {name}" for name in sorted(want.keys() - have.keys())]
    problems += [f"unexpected: {name}" for name in sorted(have.keys() - want.keys())]
    problems += [f"differs: {name}" for name in sorted(want.keys() & have.keys()) if want[name] != have[name]]
    return problems


def check(generated: Path = GENERATED_DIR, dirs: Sequence[Path] | None = None) -> list[str]:
    """Regenerate into a temporary directory and compare with ``generated``."""
    use_dirs = include_dirs() if dirs is None else tuple(dirs)
    with tempfile.TemporaryDirectory(prefix="nsjms-idl-") as tmp:
        fresh = _build_tree(Path(tmp), use_dirs)
        return compare_trees(fresh, generated)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m idl.build", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed stubs are stale")
    parser.add_argument("--generated-dir", type=Path, default=GENERATED_DIR, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns an exit code (see the module docstring)."""
    args = _parse_args(argv)
    try:
        if not args.check:
            generate(args.generated_dir)
            print(f"regenerated {args.generated_dir}")
            return EXIT_OK
        problems = check(args.generated_dir)
    except IdlBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print("stubs are stale: run `python -m idl.build`", file=sys.stderr)
        return EXIT_STALE
    print("stubs are up to date")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
