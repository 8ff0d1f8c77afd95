"""The trainer's exceptions; each message names what is wrong and how to fix it.

TrainerError
 ├── BaseModelError   weights differ from the hash recorded for them
 ├── DataError        the loader or the batch cannot be used as given
 └── PublishError     saving or recording an adapter failed
      └── DeployError the proxy refused or failed the deployment
"""

from __future__ import annotations


class TrainerError(Exception):
    """Base of every error ``onthejob train`` reports as one line."""


class BaseModelError(TrainerError):
    """The base weights are not the ones the engine (or the parent adapter) was built on."""


class DataError(TrainerError):
    """Training data that cannot be loaded or used."""


class PublishError(TrainerError):
    """An adapter could not be saved or recorded."""


class DeployError(PublishError):
    """The proxy's admin API did not deploy the adapter."""
