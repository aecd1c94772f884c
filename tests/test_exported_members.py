"""The public surface: ``coalesce.__all__`` is sorted, complete and importable."""

from __future__ import annotations

import coalesce


def _isort_style(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then everything else, each A-Z.
    kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    return kind, name


def test_all_is_sorted_and_unique() -> None:
    assert len(set(coalesce.__all__)) == len(coalesce.__all__)
    assert list(coalesce.__all__) == sorted(coalesce.__all__, key=_isort_style)


def test_all_names_every_public_member() -> None:
    public = {
        name
        for name, value in vars(coalesce).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith("coalesce")
    }
    public.discard("cli")
    assert public <= set(coalesce.__all__)
    for name in coalesce.__all__:
        assert hasattr(coalesce, name), name


def test_importing_coalesce_imports_no_sdk() -> None:
    import subprocess
    import sys

    code = (
        "import sys, coalesce, coalesce.testing; "
        "print(sorted(m for m in ('openai', 'anthropic', 'uvicorn', 'httpx2') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
