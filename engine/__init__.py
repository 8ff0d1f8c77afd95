"""The bottom floor: which model weights to use and how to start a vLLM engine on them.

:mod:`engine.weights` resolves ``--model default|tiny|PATH`` to a local folder and
hashes its weights; :mod:`engine.launcher` starts and stops a real vLLM OpenAI
server. The proxy, the trainer and the CLI all sit on this package; it imports
none of them.
"""
