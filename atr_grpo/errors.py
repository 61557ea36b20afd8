"""The exception every layer raises for bad input; it sits at the bottom of the package and imports nothing."""


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key and the allowed values."""
