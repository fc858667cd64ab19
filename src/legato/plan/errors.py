"""The planner's user-facing error."""

from legato.errors import LegatoError


class PlanError(LegatoError):
    """A plan cannot be made: no strategy fits, or a layout is asked for what it does not cover."""
