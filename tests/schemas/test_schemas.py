"""`python -m litforge.schemas`: editors' JSON Schemas of conf/, from constructors' annotations."""

import json
import textwrap

import pytest
from helpers import ROOT, run_in_process
from omegaconf import OmegaConf

jsonschema = pytest.importorskip("jsonschema")

from litforge.schemas.__main__ import SCHEMAS, generated  # noqa: E402


def test_the_schemas_and_the_option_files_first_lines_are_current():
    result = run_in_process("-m", "litforge.schemas", "--check")
    assert result.returncode == 0, result.stdout + result.stderr


def schema_of(option: str) -> dict:
    return json.loads((ROOT / SCHEMAS / f"{option}.json").read_text())


def errors(option: str, values: dict) -> list[str]:
    """What an editor marks in conf/<option>.yaml with `values` set in it."""
    config = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / f"{option}.yaml"))
    config.update(values)
    validator = jsonschema.Draft202012Validator(schema_of(option))
    return [error.message for error in validator.iter_errors(config)]


@pytest.mark.parametrize("path", sorted((ROOT / SCHEMAS).rglob("*.json")), ids=str)
def test_every_shipped_option_file_is_valid_against_its_schema(path):
    option = path.relative_to(ROOT / SCHEMAS).with_suffix("").as_posix()
    assert errors(option, {}) == []


def test_a_wrong_value_or_an_unknown_key_is_marked():
    assert errors("data/image_folder", {"batch_size": 0})
    assert errors("data/image_folder", {"crop_scale": [0.5]})
    assert errors("data/image_folder", {"balance": "oversample"})
    assert errors("data/image_folder", {"bach_size": 8})  # no such argument
    assert errors("model/cnn", {"net": {"_target_": "litforge.models.cnn.CNN", "channels": []}})
    assert errors("data/image_folder", {"batch_size": "${oc.env:BATCH}"}) == []  # interpolation


def test_hover_shows_the_default_and_the_files_comment():
    batch_size = schema_of("data/image_folder")["properties"]["batch_size"]["anyOf"][0]
    assert batch_size["type"] == "integer" and batch_size["exclusiveMinimum"] == 0
    assert batch_size["default"] == 64
    assert batch_size["description"].startswith("per process")


def test_hover_shows_nested_keys_comments_and_a_required_settings_doc():
    net = schema_of("model/cnn")["properties"]["net"]["properties"]
    assert net["channels"]["anyOf"][0]["description"].startswith("output channels of each block")
    root = schema_of("data/image_folder")["properties"]["root"]["anyOf"][0]
    assert root["type"] == "string" and "train/" in root["description"]


def test_a_forks_own_class_gets_a_schema_after_one_command(tmp_path, monkeypatch):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "nets.py").write_text(
        textwrap.dedent(
            """
            from typing import Annotated, Literal
            from annotated_types import Gt

            class Net:
                def __init__(self, input_shape, num_classes, width: Annotated[int, Gt(0)] = 8,
                             act: Literal["relu", "gelu"] = "relu"):
                    pass
            """
        )
    )
    (tmp_path / "conf" / "model").mkdir(parents=True)
    option = tmp_path / "conf" / "model" / "my_net.yaml"
    option.write_text(
        "_target_: litforge.models.ClassificationModule\n"
        "net:\n  _target_: mypkg.nets.Net\n  width: 16  # the hidden units\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    files = generated(tmp_path)
    net = json.loads(files[SCHEMAS / "model" / "my_net.json"])["properties"]["net"]
    assert net["properties"]["width"]["anyOf"][0] == {
        "type": "integer",
        "exclusiveMinimum": 0,
        "default": 8,
        "description": "the hidden units",  # the option file's comment beside it
    }
    assert net["properties"]["act"]["anyOf"][0]["enum"] == ["relu", "gelu"]
    assert net["additionalProperties"] is False
    first_line = files[option.relative_to(tmp_path)].splitlines()[0]
    assert first_line.startswith("# yaml-language-server: $schema=../.schemas/model/my_net.json")
