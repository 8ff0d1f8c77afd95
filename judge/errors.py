"""The judge's exceptions.

JudgeError
├── JudgeCallError      the endpoint could not be reached or answered an error
└── JudgeReplyError     it answered, but no score could be read from the text
"""

from __future__ import annotations


class JudgeError(Exception):
    """Anything the judge could not do; the message says what and the fix."""


class JudgeCallError(JudgeError):
    """The OpenAI-compatible endpoint failed (connection, HTTP status, malformed body)."""


class JudgeReplyError(JudgeError):
    """The model's text held no score in a form we read."""
