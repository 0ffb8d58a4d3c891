"""Where a drafter's drafts are rejected, by the kind of token the target emitted there.

A request's per-step record (``accept_lengths``: tokens committed per decode step, bonus included;
``verify_lens``: drafts verified in that step) and its output tokens say, for every draft the target
verified, whether it was accepted and which token the target wanted at that position: the ``k``
accepted drafts of a step are its first ``k`` committed tokens, and when ``k`` is below the step's
window the step's last committed token is the target's own token in place of the rejected draft
(after a fully accepted window, the last token is a bonus no draft predicted, and is not counted).

:func:`draft_misses_by_kind` tallies, per kind of that target token (:data:`TOKEN_KINDS`: a word's
first piece, a later piece, a number, punctuation, a newline, ...), how many drafts were verified at
such positions and how many were rejected. A row of ``runners.eval_drafter`` reports it, so a low
accept length can be traced to the kind of text the drafter misses (numbers in worked answers, say,
or the first word of a sentence) before more data is made for it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

TOKEN_KINDS = ("word start", "word piece", "number", "punctuation", "newline", "space", "other")


def token_kind(text: str) -> str:
    """The kind of one token from its text: "newline" (holds a line break), "space" (only blanks), "number"
    (digits, with separators), "punctuation" (no letter or digit), "word start" (letters after a leading blank),
    "word piece" (letters with no leading blank), else "other" (letters mixed with digits or symbols, a byte
    that is not text on its own)."""
    if "\n" in text or "\r" in text:
        return "newline"
    core = text.strip()
    if not core:
        return "space"
    if "\ufffd" in core:  # part of a character's bytes, not text on its own
        return "other"
    if any(c.isdigit() for c in core) and all(c.isdigit() or c in ".,_" for c in core):
        return "number"
    if not any(c.isalnum() for c in core):
        return "punctuation"
    if all(c.isalpha() or c in "'-" for c in core) and any(c.isalpha() for c in core):
        return "word start" if text[0].isspace() else "word piece"
    return "other"


def verified_drafts(token_ids: Sequence[int], accept_lengths: Sequence[int], verify_lens: Sequence[int]
                    ) -> Iterable[tuple[int, bool]]:
    """(the target's token at a verified draft position, whether the draft there was accepted), for every draft
    the target verified, in order. A step whose tokens the output does not hold in full (the last one, cut at
    max_tokens, a stop or an EOS) is left out: which of its drafts were rejected is unknown."""
    if len(accept_lengths) != len(verify_lens):
        raise ValueError(f"accept_lengths ({len(accept_lengths)} steps) and verify_lens ({len(verify_lens)}) "
                         f"must describe the same steps")
    at = 0
    for committed, window in zip(accept_lengths, verify_lens):
        if committed < 1 or committed - 1 > window:
            raise ValueError(f"a step committed {committed} tokens with {window} drafts verified: it commits its "
                             f"accepted drafts and one token of the target's, 1 to window + 1 tokens")
        if at + committed > len(token_ids):
            return
        for j in range(committed - 1):
            yield int(token_ids[at + j]), True
        if committed - 1 < window:
            yield int(token_ids[at + committed - 1]), False
        at += committed
    if at != len(token_ids):
        raise ValueError(f"the steps commit {at} tokens but the output holds {len(token_ids)}: the per-step "
                         f"record does not describe these tokens")


def draft_misses_by_kind(outputs: Sequence[Any], text_of: Callable[[int], str]) -> dict[str, dict[str, Any]]:
    """Per token kind of the target's token at each verified draft position, over ``outputs`` (engine outputs
    with ``token_ids``, ``accept_lengths`` and ``verify_lens``; errored ones skipped): ``verified`` drafts,
    ``rejected`` ones, the ``rejection_rate`` and the ``share_of_rejections``. Kinds with no verified draft are
    left out; the rest are ordered by their share of the rejections, largest first. ``text_of`` gives a token
    id's text (cached here, once per id)."""
    kinds: dict[int, str] = {}
    verified = dict.fromkeys(TOKEN_KINDS, 0)
    rejected = dict.fromkeys(TOKEN_KINDS, 0)
    for o in outputs:
        if getattr(o, "error", None) is not None:
            continue
        for token, accepted in verified_drafts(o.token_ids, o.accept_lengths, o.verify_lens):
            kind = kinds.get(token)
            if kind is None:
                kind = kinds[token] = token_kind(text_of(token))
            verified[kind] += 1
            rejected[kind] += not accepted
    total = sum(rejected.values())
    rows = {k: {"verified": verified[k], "rejected": rejected[k], "rejection_rate": rejected[k] / verified[k],
                "share_of_rejections": rejected[k] / total if total else 0.0}
            for k in TOKEN_KINDS if verified[k]}
    return dict(sorted(rows.items(), key=lambda kv: (-kv[1]["rejected"], kv[0])))


def misses_line(by_kind: Mapping[str, Mapping[str, Any]]) -> str:
    """"word start 41% (0.38), number 12% (0.52), ...": each kind's share of the rejections and its rate."""
    return ", ".join(f"{k} {v['share_of_rejections']:.0%} ({v['rejection_rate']:.2f})" for k, v in by_kind.items())


__all__ = ["TOKEN_KINDS", "draft_misses_by_kind", "misses_line", "token_kind", "verified_drafts"]
