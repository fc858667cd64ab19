"""The one error type of the schedule layer."""

from legato.errors import LegatoError


class ScheduleError(LegatoError):
    """A schedule request or a schedule is invalid: bad sizes, a memory cap below the
    dependency floor, a malformed action list, a dependency violation or a deadlock."""
