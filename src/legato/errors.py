"""User-facing errors.

Every mistake a user can make (a bad spec, config, strategy or file) is raised as a
``LegatoError`` whose message names the field and what is allowed. The CLI prints it as
one line and exits non-zero instead of showing a traceback from deep inside torch.
"""


class LegatoError(ValueError):
    """Base class for errors caused by user input; the message is shown as is."""


class SpecError(LegatoError):
    """A model, device or cluster spec is unknown or invalid."""


class ConfigError(LegatoError):
    """A training config or command-line override is invalid."""


class DataError(LegatoError):
    """A data file is missing, unreadable or in the wrong format."""


class CheckpointError(LegatoError):
    """A checkpoint is missing, corrupt or does not match the run."""


class WriteError(LegatoError):
    """A file or folder cannot be created where asked (a file in the way, no permission)."""
