"""Maps sdk/ and secure/ under the `clinograph.` namespace (both names are taken on PyPI)."""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
MAPPING = {"clinograph": "clinograph", "clinograph.sdk": "sdk", "clinograph.secure": "secure"}


def _packages() -> list[str]:
    found = []
    for name, folder in MAPPING.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / folder)
            found.append(".".join([name, *rel.parts]) if rel.parts else name)
    return found


setup(
    packages=_packages(),
    package_dir=MAPPING,
    package_data={"clinograph.sdk": ["datasets/*.toml"], "clinograph.secure": ["audit/*.html"]},
)
