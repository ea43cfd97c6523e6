"""The one error that is the caller's fault: exit code 2, do not retry."""


class BadInput(Exception):
    """Input that no retry can fix: a missing or malformed file, a bad flag or environment
    variable. The message names the file (and line) or the flag."""
