"""Text <-> tokens: tool-call parsers by family (:mod:`toolgym.format.parsers`: the base classes, the registry,
``hermes`` and ``llama3_json``; :mod:`toolgym.format.families`: the other families), chat-template conversations
(:mod:`toolgym.format.conversation`) and text-only framing (:mod:`toolgym.format.textonly`).

Importing the package registers every family's parser: ``families`` imports ``parsers`` (never the reverse), so
``get_parser(name)`` and ``parser="auto"`` see all of them however ``toolgym.format.parsers`` is reached.
"""

from toolgym.format import families  # noqa: F401  (registers the family parsers)
