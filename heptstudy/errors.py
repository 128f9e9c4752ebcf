"""Errors caused by the user's input or environment.

The CLI prints these as one clear message (what was wrong, the value, what is allowed, what to
do) instead of a traceback; everything else is a bug and keeps its traceback.
"""


class HeptstudyError(Exception):
    """Base class of user-facing errors."""


class ConfigError(HeptstudyError, ValueError):
    """A configuration, platform profile or scenario could not be loaded or did not validate."""


class DataError(HeptstudyError):
    """A data set is missing, malformed or holds values the study cannot use."""
