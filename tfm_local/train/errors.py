"""Errors of tfm-train that a user can act on."""
from __future__ import annotations


class TrainError(RuntimeError):
    """A training input or state is unusable (bad option, corrupt artifact, mismatched target)."""


class CorruptArtifactError(TrainError):
    """A corpus artifact or checkpoint is truncated, altered or not what it claims to be."""
