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


class NotOwnerError(CalmonError):
    """Raised by a scaled-out instance's publish for a model whose joined-topic
    partition it does not own (any more): never assigned here, or fenced by the
    newer owner a rebalance gave it to. Expected in a group: the new owner publishes."""


def describe(e: BaseException) -> str:
    """``Name: message``, once: kafka-python's errors already start their text with
    their class name, which ``f"{type(e).__name__}: {e}"`` doubled
    ("KafkaTimeoutError: KafkaTimeoutError: ...")."""
    name, text = type(e).__name__, str(e)
    if not text:
        return name
    return text if text.startswith(name) else f"{name}: {text}"
