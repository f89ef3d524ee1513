"""Parameter servers (`strategy=parameter_server`): sync or async training with the parameters
on server processes. A feature folder: it imports the core, nothing in the core imports it
(docs/parameter_server.md)."""

from litforge.parameter_server.strategy import ParameterServerStrategy

__all__ = ["ParameterServerStrategy"]
