"""Each setting's type and bounds are the annotation of the constructor argument that takes it,
bounds in annotated-types' form: `batch_size: Annotated[int, Gt(0)]`. `check_targets` checks the
values a config gives each class it names (`_target_`) against those annotations, before anything
is built: one line naming the key (`data.batch_size=0: must be > 0`), or an argument the class
does not take. A class of your own is checked the same way: annotate its constructor."""

import difflib
import functools
import inspect
import logging
import operator
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import annotated_types as at
from omegaconf import DictConfig, ListConfig, OmegaConf

from litforge.errors import UserError

log = logging.getLogger(__name__)

# The bounds settings share.
PositiveInt = Annotated[int, at.Gt(0)]
NonNegativeInt = Annotated[int, at.Ge(0)]
Positive = Annotated[float, at.Gt(0)]
NonNegative = Annotated[float, at.Ge(0)]
Fraction = Annotated[float, at.Interval(ge=0, lt=1)]  # a share of something: 0 up to, not 1

# annotated-types' bound names: what each requires, and how messages write it.
BOUNDS = {
    "gt": (operator.gt, ">"),
    "ge": (operator.ge, ">="),
    "lt": (operator.lt, "<"),
    "le": (operator.le, "<="),
}


def bound_problem(value: Any, constraint: Any) -> str | None:
    """What `value` breaks of one annotated-types constraint (Gt, Ge, Lt, Le, Interval, Len)."""
    for name, (holds, sign) in BOUNDS.items():
        limit = getattr(constraint, name, None)
        if limit is not None and not holds(value, limit):
            return f"must be {sign} {limit}"
    low = getattr(constraint, "min_length", None)
    if low is not None and len(value) < low:
        return f"must hold at least {low} value{'s' * (low != 1)}"
    high = getattr(constraint, "max_length", None)
    if high is not None and len(value) > high:
        return f"must hold at most {high} values"
    return None


def problem(value: Any, annotation: Any) -> str | None:
    """What is wrong with `value` for a parameter annotated `annotation`, or None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        nullable = type(None) in options
        if value is None and nullable:
            return None
        options = [option for option in options if option is not type(None)]
        fitting = [o for o in options if type_problem(value, *unpacked(o)[:3], True) is None]
        found = [problem(value, option) for option in fitting or options]
        if None in found:
            return None
        if fitting:  # its type fits, its bounds do not
            return found[0]
        said = ", or ".join(dict.fromkeys(f.removeprefix("must be ") for f in found))
        return f"must be {said}" + (
            ", or null" if type(None) in typing.get_args(annotation) else ""
        )
    annotation, origin, args, constraints = unpacked(annotation)
    found = type_problem(value, annotation, origin, args)
    for constraint in constraints:
        found = found or bound_problem(value, constraint)
    return found


def unpacked(annotation: Any) -> tuple[Any, Any, tuple, list]:
    """(type, its origin, its arguments, annotated-types constraints) of an annotation."""
    constraints = []
    if typing.get_origin(annotation) is Annotated:
        annotation, *constraints = typing.get_args(annotation)
    return annotation, typing.get_origin(annotation), typing.get_args(annotation), constraints


def type_problem(
    value: Any, annotation: Any, origin: Any, args: tuple, shallow: bool = False
) -> str | None:
    """What is wrong with `value`'s type (`shallow`: a list's items unchecked), or None."""
    if annotation is Any or annotation is inspect.Parameter.empty:
        return None
    if value is None:  # (a nullable annotation is a union with None: `problem`)
        return "must not be null" if annotation in (bool, int, float, str) else None
    if origin is Literal:
        if value in args and type(value) in {type(a) for a in args}:
            return None
        return f"must be one of: {', '.join(map(str, args))}"
    if annotation is bool:
        return None if isinstance(value, bool) else "must be true or false"
    if annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else "must be an integer"
    if annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else "must be a number"
    if annotation is str:
        return None if isinstance(value, str) else "must be a string"
    if annotation is dict or origin in (dict, Mapping):
        return None if isinstance(value, Mapping) else "must be a mapping"
    if origin in (list, tuple, Sequence, typing.Sequence):
        fixed = origin is tuple and args and args[-1] is not Ellipsis
        if not isinstance(value, (list, tuple)) or (fixed and len(value) != len(args)):
            return f"must be a list of {len(args)} values" if fixed else "must be a list"
        if shallow:
            return None
        if fixed:
            items = zip(value, args, strict=True)
        else:
            items = ((item, args[0] if args else Any) for item in value)
        for item, arg in items:
            if found := problem(item, arg):
                return f"each value {found}"
    return None


# Where a library's class passes its `**kwargs`: their keys are that class's arguments.
PASSED_ON = {
    "lightning.pytorch.strategies.ddp.DDPStrategy": "torch.nn.parallel.DistributedDataParallel",
    "lightning.pytorch.strategies.fsdp.FSDPStrategy": (
        "torch.distributed.fsdp.FullyShardedDataParallel"
    ),
}


def constructors(obj: Any) -> list:
    """The `__init__` functions of a class and its bases, most derived first; a function."""
    return (
        [c.__init__ for c in obj.__mro__ if "__init__" in vars(c)]
        if isinstance(obj, type)
        else [obj]
    )


@functools.cache
def parameters(target: str) -> tuple[dict[str, inspect.Parameter], bool]:
    """The constructor parameters of the class (or function) `target` names, with their
    annotations, and whether it takes other keyword arguments too. Our constructors pass their
    `**kwargs` on to the base class's: its parameters count too (and a library class's to the
    class `PASSED_ON` names)."""
    from hydra.utils import get_object

    try:
        obj = get_object(target)
    except Exception:  # a `_target_` that does not import: Hydra's instantiate says so
        return {}, True
    functions = constructors(obj)
    named: dict[str, inspect.Parameter] = {}
    while functions:
        function = functions.pop(0)
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):  # (a builtin's)
            return named, True
        try:
            hints = typing.get_type_hints(function, include_extras=True)
        except Exception as err:  # annotations that do not evaluate
            if "site-packages" not in (inspect.getsourcefile(function) or "site-packages"):
                log.warning(f"{target}'s settings are not checked: its annotations fail ({err})")
                return named, True
            hints = {}  # a library's: its arguments' names still count, their types unchecked
        method = function.__name__ == "__init__"
        given = list(signature.parameters.values())[method:]  # (not `self`)
        for p in given:
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                named.setdefault(p.name, p.replace(annotation=hints.get(p.name, Any)))
        if not any(p.kind == p.VAR_KEYWORD for p in given):
            return named, False
        module = getattr(function, "__module__", None) or ""  # (object's has none)
        owner = f"{module}.{function.__qualname__.removesuffix('.__init__')}"
        if owner in PASSED_ON:  # (and not to its base class)
            functions = constructors(get_object(PASSED_ON[owner]))
        elif not module.startswith("litforge."):
            return named, True  # (where another library's constructor passes them: unknown)
    return named, True


def check_targets(
    node: Any, key: str, known: Mapping[str, Any] = types.MappingProxyType({})
) -> None:
    """Check every value `node` (a config) and the configs inside it give the class their
    `_target_` names against its constructor's annotations; a UserError names the first.
    `known`: annotations by full key that stand in for a constructor's (the settings of classes
    not ours), and keys the code that builds the class takes itself."""
    if isinstance(node, ListConfig):
        for i, item in enumerate(node):
            check_targets(item, f"{key}[{i}]", known)
        return
    if not isinstance(node, DictConfig):
        return
    target = node.get("_target_") if not OmegaConf.is_missing(node, "_target_") else None
    named, open_ended = parameters(target) if isinstance(target, str) else ({}, True)
    for name in node:
        child = f"{key}.{name}" if key else str(name)
        if str(name).startswith("_"):
            continue
        missing = OmegaConf.is_missing(node, name)  # `???`: checked only if it must be given
        value = None if missing else node[name]
        if isinstance(value, (DictConfig, ListConfig)):
            check_targets(value, child, known)
            if isinstance(value, DictConfig) and "_target_" in value:
                continue
            value = OmegaConf.to_container(value, resolve=True)
        if target is None:
            continue
        if child in known:
            annotation = known[child]
        elif name in named:
            annotation = named[name].annotation
        elif open_ended:
            continue
        else:
            near = difflib.get_close_matches(str(name), named, n=1)
            hint = f" (did you mean {key}.{near[0]}?)" if near else ""
            raise UserError(f"{child}: {target} takes no argument {name}{hint}.")
        found = problem(value, annotation)
        needed = [c.documentation for c in unpacked(annotation)[3] if isinstance(c, at.DocInfo)]
        if found and value is None and needed:  # a setting without a default: its doc says what
            raise UserError(f"{child} is not set: give {needed[0]}.")
        if found and not missing:
            raise UserError(f"{child}={format_value(value)}: {found}.")


def check_values(values: Any, annotations: Mapping[str, Any]) -> None:
    """Check the value at each key of `annotations` in `values` (a config, or a dict of a
    function's arguments) against its annotation; a UserError names the first wrong one. Keys
    `values` lacks are skipped. For the settings no constructor takes (`checks.OTHERS`)."""
    for key, annotation in annotations.items():
        if isinstance(values, DictConfig):
            value = OmegaConf.select(values, key, default=annotations)  # (absent: `annotations`)
        else:
            value = values.get(key, annotations)
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
        if value is not annotations and (found := problem(value, annotation)):
            raise UserError(f"{key}={format_value(value)}: {found}.")


def format_value(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{...}"
    if isinstance(value, (list, tuple)):
        return f"[{','.join(map(format_value, value))}]"
    return "null" if value is None else str(value)
