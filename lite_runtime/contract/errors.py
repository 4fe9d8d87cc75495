"""Exceptions the toolchain raises for user mistakes.

Every message names the bad value, where it came from and what is allowed.
CLIs turn these into one line on stderr and a non-zero exit.
"""


class ToolchainError(Exception):
    """Base of every user-facing error of the exporter and the runtime."""


class ConfigError(ToolchainError):
    """A config file, keyword or command-line argument is wrong."""


class ArtifactError(ToolchainError):
    """An export (manifest, graph file, tokenizer) is missing, damaged or inconsistent."""


class WeightError(ToolchainError):
    """Checkpoint tensors are missing, unexpected or of the wrong shape."""


class UnsupportedError(ToolchainError):
    """An unknown family, backend or task, or a feature the chosen backend cannot run."""


class ValidationError(ToolchainError):
    """A request (prompt, generation argument) is invalid."""


class DistributedError(ToolchainError):
    """A multi-rank run failed: a rank died, hung or disagreed with the others."""


class ResourceError(ToolchainError):
    """The machine lacks what a load needs (memory): refused before it starts, not killed half-way."""
