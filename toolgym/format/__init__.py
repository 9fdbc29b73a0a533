"""Text <-> tokens: tool-call parsers (:mod:`toolgym.format.parsers`: the base class with the "parse never raises"
guard, the registry; :mod:`toolgym.format.families`: one module per family), the chat format of a tokenizer and
template (:mod:`toolgym.format.chat`: :class:`~toolgym.format.chat.ChatFormat`), one episode's messages and tokens
(:mod:`toolgym.format.conversation`: :class:`~toolgym.format.conversation.Conversation`) and text-only framing
(:mod:`toolgym.format.textonly`).

Importing the package registers every family's parser: ``families`` imports ``parsers`` (never the reverse), so
``get_parser(name)`` and ``parser="auto"`` see all of them however ``toolgym.format.parsers`` is reached.
"""

from toolgym.format import families  # noqa: F401  (registers the family parsers)
