"""litforge/settings.py: values checked against the annotations of the constructors taking them."""

import sys
import textwrap
from typing import Annotated, Literal

import pytest
from annotated_types import Ge, Interval, MinLen
from omegaconf import OmegaConf

from litforge.errors import UserError
from litforge.settings import Fraction, PositiveInt, check_targets, problem


@pytest.mark.parametrize(
    ("value", "annotation", "found"),
    [
        (0, PositiveInt, "must be > 0"),
        (1.5, PositiveInt, "must be an integer"),
        (True, PositiveInt, "must be an integer"),  # a bool is no count
        (3, PositiveInt, None),
        (3, float, None),  # an int is a number
        (1.0, Fraction, "must be < 1"),
        (-0.1, Fraction, "must be >= 0"),
        ("maybe", bool, "must be true or false"),
        (1, bool, "must be true or false"),
        (2, Literal[1, 3] | None, "must be one of: 1, 3, or null"),
        (True, Literal[1, 3], "must be one of: 1, 3"),
        (None, Literal[1, 3] | None, None),
        ([], Annotated[list[int], MinLen(1)], "must hold at least 1 value"),
        ([8, 0], list[PositiveInt], "each value must be > 0"),
        (0.5, tuple[float, float], "must be a list of 2 values"),
        ([0.2, 2], tuple[float, Annotated[float, Interval(gt=0, le=1)]], "each value must be <= 1"),
        ("x", Annotated[int, Ge(2)] | None, "must be an integer, or null"),
        (None, PositiveInt, "must not be null"),
        (1.5, list[int] | str | int, "must be a list, or a string, or an integer"),
        (0.5, Annotated[int, Ge(1)] | float, None),  # the second option takes it
    ],
)
def test_a_value_is_checked_against_its_annotation(value, annotation, found):
    assert problem(value, annotation) == found


def test_a_forks_own_class_is_checked_by_its_annotations(tmp_path, monkeypatch):
    """Nothing to register: a class of the fork's package annotates its constructor."""
    (tmp_path / "myproject").mkdir()
    (tmp_path / "myproject" / "__init__.py").write_text("")
    (tmp_path / "myproject" / "nets.py").write_text(
        textwrap.dedent(
            """
            from typing import Annotated
            from annotated_types import Gt

            class Net:
                def __init__(self, width: Annotated[int, Gt(0)] = 8, act: str = "relu"):
                    pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "myproject", raising=False)
    net = {"_target_": "myproject.nets.Net"}
    config = OmegaConf.create({"net": {**net, "width": 0}, "name": "x"})
    with pytest.raises(UserError, match=r"^model.net.width=0: must be > 0.$"):
        check_targets(config, "model")
    config = OmegaConf.create({"net": {**net, "widht": 4}})
    with pytest.raises(UserError) as error:
        check_targets(config, "model")
    assert str(error.value) == (
        "model.net.widht: myproject.nets.Net takes no argument widht "
        "(did you mean model.net.width?)."
    )
    check_targets(OmegaConf.create({"net": {**net, "width": 4, "act": "gelu"}}), "model")


def test_keyword_arguments_passed_on_are_checked_by_the_base_class():
    """FashionMNISTDataModule(system_dir, **kwargs) passes the rest to its base class."""
    config = OmegaConf.create(
        {"_target_": "litforge.data.fashion_mnist.FashionMNISTDataModule", "batch_size": 0}
    )
    with pytest.raises(UserError, match=r"^data.batch_size=0: must be > 0.$"):
        check_targets(config, "data")
    config = OmegaConf.create({"_target_": "argparse.Namespace", "anything": 1})
    check_targets(config, "extra")  # Namespace(**kwargs): any key is its own


def test_a_target_that_does_not_import_is_left_to_hydra():
    config = OmegaConf.create({"_target_": "nowhere.Nothing", "anything": 1})
    check_targets(config, "model.net")  # instantiate then says it as Hydra does


def test_a_forks_class_whose_annotations_fail_is_said_to_be_unchecked(
    tmp_path, monkeypatch, caplog
):
    (tmp_path / "brokenpkg").mkdir()
    (tmp_path / "brokenpkg" / "__init__.py").write_text("")
    (tmp_path / "brokenpkg" / "nets.py").write_text(
        "class Net:\n    def __init__(self, width: 'Missing' = 8):\n        pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = OmegaConf.create({"_target_": "brokenpkg.nets.Net", "width": 0, "typo": 1})
    check_targets(config, "model.net")  # nothing checked: its annotations do not evaluate
    assert "brokenpkg.nets.Net's settings are not checked: its annotations fail" in caplog.text
