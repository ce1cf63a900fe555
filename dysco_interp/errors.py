"""Errors that users see. Each names what was wrong and what to do about it."""


class DyscoError(Exception):
    """Base class for every error raised on purpose by dysco-interp."""


class ModelNotFoundError(DyscoError, ValueError):
    """The model name is neither a registry alias, a local folder, nor loadable from a hub."""


class ModelPackageMissingError(DyscoError, ImportError):
    """A packaged model's PyPI distribution is not installed."""


class ModelIntegrityError(DyscoError):
    """A packaged model's bytes do not match the recorded checksum."""


class ContextLengthError(DyscoError, ValueError):
    """A prompt (plus the tokens to generate) does not fit in the model's context."""


class ConfigError(DyscoError, ValueError):
    """An invalid parameter: dtype, device, sampling or decoding settings."""


class DataError(ConfigError):
    """An input data file cannot be used: missing, not UTF-8, truncated, empty, or not task data.

    A ConfigError too, so code that catches bad input keeps catching it.
    """


class NoSignalError(DyscoError):
    """A measurement carries no information, e.g. every head's copy-paste score is zero."""


class MethodExitError(DyscoError):
    """A decoding method's own code called `sys.exit` while decoding: a method cannot end a run
    (an evaluation would otherwise stop with exit status 0, a partial store and no table)."""


class DyscoWarning(UserWarning):
    """Base class of the warnings dysco-interp gives on purpose; the command line shows each as one line."""


class LeakageWarning(DyscoWarning):
    """Test instances are among those the head set was detected on: their results are not held out."""
