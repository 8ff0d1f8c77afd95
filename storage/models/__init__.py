"""SQLAlchemy 2 typed models: the one system of record shared by proxy and trainer.

Token ids and logprobs are JSON lists: portable across Postgres and SQLite, and
read back whole (we never query inside them). Every completion is keyed by our
own id (``cmpl-…``), never the upstream's. One module per part of the system
(``record``, ``training``, ``ops``, ``promotion``, ``datasets``) on one ``Base``;
importing this package registers every table.
"""

from storage.models.base import NO_NUL, PENDING, Base, Json, utcnow
from storage.models.datasets import Dataset, DatasetItem
from storage.models.links import LinkEntry
from storage.models.ops import Alert, Change, ChangeCursor, CompletionFlag, EndUserTombstone, Tombstone
from storage.models.promotion import Attestation, Eval, PromotionEvent, PromotionPolicy
from storage.models.rate_leases import RateLease
from storage.models.record import Alias, ApiKey, Completion, Feedback, Project, Session
from storage.models.stored import StoredPrefix
from storage.models.training import (
    Adapter,
    Deployment,
    JudgeCalibration,
    TrainingRun,
    TrainingStep,
    UsedFeedback,
    UsedTrajectory,
)

__all__ = [
    "NO_NUL",
    "PENDING",
    "Base",
    "Json",
    "utcnow",
    "Project",
    "ApiKey",
    "Alias",
    "Session",
    "Completion",
    "Feedback",
    "Adapter",
    "Deployment",
    "TrainingRun",
    "TrainingStep",
    "UsedTrajectory",
    "JudgeCalibration",
    "UsedFeedback",
    "Alert",
    "Change",
    "ChangeCursor",
    "CompletionFlag",
    "Tombstone",
    "EndUserTombstone",
    "Eval",
    "LinkEntry",
    "PromotionPolicy",
    "PromotionEvent",
    "Attestation",
    "Dataset",
    "DatasetItem",
    "RateLease",
    "StoredPrefix",
]
