"""The README's config example stays valid (docs that drift are bugs)."""

from __future__ import annotations

from pathlib import Path

from robust_pfl.config import load_config
from robust_pfl.experiments import validate

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_config_example_loads_and_validates(tmp_path):
    text = README.read_text()
    block = text.split("## Config format", 1)[1].split("```toml", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.toml"
    path.write_text(block)
    config = validate(load_config(path))
    assert config.methods[0].name == "fc" and config.attack.name == "large_gradient"
    assert config.byzantine.total == 8
