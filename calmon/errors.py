"""Exceptions raised by calmon, each documented by when it is raised."""


class CalmonError(Exception):
    """Base class of every error calmon raises on purpose."""


class ConfigError(CalmonError):
    """Raised by ``calmon.config.load`` when the file does not satisfy the contract.

    ``problems`` holds every error as ``path.to.key: what is wrong``.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class StateError(CalmonError):
    """Raised at start-up when no usable checkpoint can be loaded and
    ``state.on_corrupt`` is ``fail``."""


class CalibratorError(CalmonError):
    """Raised by ``calmon.calibrators.load`` for a document that is not a valid
    calibrator, and by ``fit`` when the data cannot be fitted (empty, one class)."""
