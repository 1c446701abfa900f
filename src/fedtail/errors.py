"""Errors the command line turns into a one-line message: exit code 2 (bad input), 3 (diverged)."""


class FedtailError(Exception):
    """Bad input or missing resources: the message names the flag, key or path and what is allowed."""


class DataError(FedtailError):
    """A dataset file is missing, corrupt or cannot be obtained."""


class ConfigError(FedtailError):
    """A configuration value is out of range or unknown."""


class RunDiverged(Exception):
    """Training produced NaN / inf (a loss, a reply, the server's state): the run's numbers are garbage.

    Not a :class:`FedtailError`: the input was valid; the command line reports it with exit code 3.
    """

    def __init__(self, round: int, cause: str) -> None:
        super().__init__(f"run diverged at round {round}: {cause}")
        self.round = round
        self.cause = cause
