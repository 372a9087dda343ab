"""The one error type specs raise for bad input: one sentence, shown as is to people."""


class SpecError(ValueError):
    """Bad input: the message names the offending value and what would be valid."""
