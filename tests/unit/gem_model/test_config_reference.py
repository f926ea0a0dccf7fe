"""docs/CONFIG.md is the reference the code generates, and every config key has a description in it."""

import dataclasses

import pytest

from gem_model.config import GemConfig
from gem_model.config.reference import DOC, FIX, describe_field, field_descriptions, main, render


def test_docs_config_md_is_the_reference_the_code_generates():
    assert DOC.read_text() == render(), f"docs/CONFIG.md is stale: run `{FIX}`"


def _keys(value: object, where: str = "") -> list[str]:
    """Every dotted key of a config value, the elements of a tuple of objects as `key[].field`."""
    keys = []
    for f in dataclasses.fields(value):
        key, item = f"{where}.{f.name}" if where else f.name, getattr(value, f.name)
        if dataclasses.is_dataclass(item):
            keys += _keys(item, key)
        else:
            keys.append(key)
            if isinstance(item, tuple) and item and dataclasses.is_dataclass(item[0]):
                keys += _keys(item[0], f"{key}[]")
    return keys


def test_every_key_of_the_config_is_in_the_reference_with_a_description():
    doc = DOC.read_text()
    keys = _keys(GemConfig())
    assert len(keys) > 90 and "model.experimental.wukong_experts" in keys and "features.features[].buckets" in keys
    for key in keys:
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{key}` |")), None)
        assert row is not None, key
        assert row.rstrip(" |").split(" | ")[-1].strip(), key  # the description cell


def test_the_reference_shows_what_the_validator_enforces():
    doc = DOC.read_text()
    assert "| `train.epochs` | integer | [1, 10000] | `3` |" in doc
    assert '| `model.architecture` | string | one of `gem`, `dlrm`, `dcnv2`, `lr` | `"gem"` |' in doc
    assert '| `features.features[].encoding` | string | one of `hash`, `modulo` | `"hash"` |' in doc
    assert "| `train.batch_size` | `256` | `512` | `2048` |" in doc  # a column per preset


def test_check_fails_on_a_stale_copy_and_write_mends_it(tmp_path, capsys):
    doc = tmp_path / "CONFIG.md"
    doc.write_text(render().replace("Passes over the training days.", "Epochs, edited by hand."))
    assert main(["--check", str(doc)]) == 1
    assert FIX in capsys.readouterr().err
    assert main(["--write", str(doc)]) == 0
    assert doc.read_text() == render() and main(["--check", str(doc)]) == 0
    assert main(["--check", str(tmp_path / "missing.md")]) == 1


def test_a_field_without_a_description_is_refused_naming_the_key():
    @dataclasses.dataclass(frozen=True)
    class Section:
        documented: int = 1
        """A documented field."""
        undocumented: int = 2

    assert field_descriptions(Section) == {"documented": "A documented field."}
    with pytest.raises(
        ValueError,
        match=r"config key demo.undocumented has no description: write a docstring under "
        r"Section.undocumented",
    ):
        describe_field(Section, "undocumented", "demo.undocumented")
