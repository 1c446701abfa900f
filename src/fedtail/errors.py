"""Errors the command line turns into a one-line message and exit code 2."""


class FedtailError(Exception):
    """Bad input or missing resources: the message names the flag, key or path and what is allowed."""


class DataError(FedtailError):
    """A dataset file is missing, corrupt or cannot be obtained."""


class ConfigError(FedtailError):
    """A configuration value is out of range or unknown."""
