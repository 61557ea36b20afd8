"""The run directory's one error, below every other module of the package (layout, files and lock raise it)."""


class RunFileError(ValueError):
    """A run file cannot be read (cut off, or changed into something else); the message names the file."""
