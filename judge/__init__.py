"""The judge: an OpenAI-compatible model that turns conversations and comments into grades.

It sits on storage like the trainer does (never imports the proxy or the
trainer) and posts what it concludes as ordinary feedback of source ``judge``
through the proxy's ``POST /v1/feedback``, its reasoning as the comment. Its
grades count in training only while its agreement with the project's existing
human or harness grades (:mod:`judge.calibrate`) clears the configured gate.
"""
