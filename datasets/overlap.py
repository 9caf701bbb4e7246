"""Queries that two splits share, by caption text: a leak check for `data check`.

A caption of one split that also captions a query of another is not always a leak: short
captions repeat in real data (Charades-STA has many "person opens the door"), so a shared
text alone is reported, with counts and examples, for the user to judge. The same caption on
the same labelled video in two splits is the same query in both: that is a leak, counted
apart. Splits are any objects with `query_text`, `query_video` and `video_ids` (a loaded
`Split` or a layout's `BuiltSplit`), so the selection check (val vs test) can use it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

EXAMPLES = 3


def normalise(text: str) -> str:
    """Case and whitespace do not make a caption different."""
    return " ".join(text.lower().split())


@dataclass(frozen=True)
class SharedCaptions:
    """Queries of `split` whose caption text is also a caption of `other` (an earlier split)."""

    other: str
    split: str
    queries: int  # queries of `split` with a caption of `other`
    of: int  # queries in `split`
    same_video: int  # of those, labelled with a video of `other` that has that caption too
    examples: list[str] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.queries / self.of if self.of else 0.0

    def line(self) -> str:
        examples = ", ".join(repr(e if len(e) <= 60 else e[:57] + "...") for e in self.examples)
        head = (f"{self.other}/{self.split}: {self.queries:,} of {self.of:,} {self.split} queries ({self.share:.1%}) "
                f"have the caption of a {self.other} query (e.g. {examples})")
        if self.same_video:
            return (f"{head}, {self.same_video:,} of them on the same video: the same query in both splits; "
                    f"delete those caption lines from one split")
        return f"{head}, none on the same video; short captions repeat in real data, a large share is a leak to check"


def shared_captions(splits: Mapping[str, Any]) -> list[SharedCaptions]:
    """Every pair of splits (in the mapping's order) whose captions overlap; pairs without
    overlap are left out."""
    keys = {name: _keys(s) for name, s in splits.items()}
    names = list(splits)
    out = []
    for i, other in enumerate(names):
        pairs = set(keys[other])
        texts = {text for text, _ in pairs}
        for name in names[i + 1:]:
            hits = [(text, video) for text, video in keys[name] if text in texts]
            if hits:
                same = sum(hit in pairs for hit in hits)
                examples = sorted({text for text, _ in hits})[:EXAMPLES]
                out.append(SharedCaptions(other, name, len(hits), len(keys[name]), same, examples))
    return out


def _keys(split: Any) -> list[tuple[str, str]]:
    """(normalised caption, labelled video id) of every query, in order (repeats kept)."""
    return [(normalise(t), split.video_ids[int(v)]) for t, v in zip(split.query_text, split.query_video)]
