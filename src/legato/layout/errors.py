"""The layouts' error: a layout asked for what it does not cover."""

from legato.errors import LegatoError


class LayoutError(LegatoError):
    """No SBP layout for this part under this strategy, or a redistribution no layout needs."""
